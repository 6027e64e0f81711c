"""The parts of --media-workers that need no process: the engine proxy, metric merging."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np
import pytest

from app.serving.ipc import MAX_MESSAGE_BYTES, MessageTooLarge, post
from app.serving.media_worker import EngineProxy
from app.web.metrics import Metrics
from pipeline.contract import AudioChunk, EngineError, TextDelta, TurnRequest
from pipeline.conversation import Conversation, UserText
from tests.fakes import FULL_CAPABILITIES


class Front:
    """Plays the front process for one EngineProxy: records what it is sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.proxy = EngineProxy("front-engine", FULL_CAPABILITIES, self.sent.append)

    async def turn_started(self) -> int:
        while not self.sent:
            await asyncio.sleep(0)
        return int(self.sent[0]["turn"])


async def test_a_turn_streams_its_events_and_ends() -> None:
    front = Front()
    request = TurnRequest(conversation=Conversation(items=[]))
    chunk = AudioChunk(np.zeros(1920, dtype=np.float32))

    async def play_front() -> None:
        turn = await front.turn_started()
        assert front.sent[0]["request"] is request
        front.proxy.deliver({"op": "turn_event", "turn": turn, "event": TextDelta("Hi")})
        front.proxy.deliver({"op": "turn_event", "turn": turn, "event": chunk})
        front.proxy.deliver({"op": "turn_end", "turn": turn, "error": None})

    player = asyncio.create_task(play_front())
    events = [event async for event in front.proxy.run_turn(request)]
    await player
    assert events == [TextDelta("Hi"), chunk]
    assert [message["op"] for message in front.sent] == ["turn"]  # ended: nothing to cancel


async def test_an_engine_error_in_front_is_raised_with_its_code() -> None:
    front = Front()

    async def play_front() -> None:
        turn = await front.turn_started()
        front.proxy.deliver({"op": "turn_end", "turn": turn, "error": ("engine_timeout", "nothing for 60 s")})

    player = asyncio.create_task(play_front())
    with pytest.raises(EngineError, match="nothing for 60 s") as raised:
        async for _ in front.proxy.run_turn(TurnRequest(conversation=Conversation(items=[]))):
            pass
    await player
    assert raised.value.code == "engine_timeout"


async def test_closing_a_turn_early_cancels_it_in_front_and_drops_its_late_events() -> None:
    front = Front()
    turn_events = front.proxy.run_turn(TurnRequest(conversation=Conversation(items=[])))
    async with contextlib.aclosing(turn_events):
        pending = asyncio.ensure_future(anext(turn_events))
        turn = await front.turn_started()
        front.proxy.deliver({"op": "turn_event", "turn": turn, "event": TextDelta("Hi")})
        assert await pending == TextDelta("Hi")
    assert front.sent[-1] == {"op": "cancel_turn", "turn": turn}
    front.proxy.deliver({"op": "turn_event", "turn": turn, "event": TextDelta("late")})  # ignored


def test_metrics_of_workers_add_up_and_keep_their_worker_labels() -> None:
    front, first, second = Metrics(), Metrics(worker="0"), Metrics(worker="1")
    front.pacing_snapshots = dict  # the front paces nothing
    front.calls.labels(transport="webrtc", reason="hangup").inc()
    first.calls.labels(transport="webrtc", reason="hangup").inc(2)
    second.calls.labels(transport="webrtc", reason="peer_gone").inc()
    first.pacing.record(0.5, skipped=24)
    text = front.render([first.samples(), second.samples()]).decode()
    assert 'omni_rtc_calls_total{reason="hangup",transport="webrtc"} 3.0' in text
    assert 'omni_rtc_calls_total{reason="peer_gone",transport="webrtc"} 1.0' in text
    assert 'omni_rtc_outbound_frames_skipped_total{worker="0"} 24.0' in text
    assert 'omni_rtc_outbound_frames_skipped_total{worker="1"} 0.0' in text
    assert "_created" not in text


class LocalWriter:
    """A ``StreamWriter`` stand-in that keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written += data


def test_the_sender_refuses_a_message_over_the_limit_and_writes_nothing() -> None:
    writer = LocalWriter()
    with pytest.raises(MessageTooLarge) as refused:
        post(writer, {"op": "turn", "blob": b"x" * (MAX_MESSAGE_BYTES + 1)})
    assert refused.value.op == "turn"
    assert writer.written == b""
    post(writer, {"op": "status"})
    assert writer.written  # the connection goes on


async def test_a_turn_too_large_to_send_fails_that_turn_with_an_error_code() -> None:
    writer = LocalWriter()
    proxy = EngineProxy("front-engine", FULL_CAPABILITIES, lambda message: post(writer, message))
    huge = Conversation(items=(UserText("x" * (MAX_MESSAGE_BYTES + 1)),))
    with pytest.raises(EngineError) as raised:
        async for _ in proxy.run_turn(TurnRequest(conversation=huge)):
            pass
    assert raised.value.code == "turn_too_large"
    assert writer.written == b""  # not even a cancel_turn: the front never heard of it
