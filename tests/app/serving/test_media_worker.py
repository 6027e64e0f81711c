"""The media worker's EngineProxy: the engine of a worker's sessions, served by the front over IPC."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from app.serving.ipc import MAX_MESSAGE_BYTES, post
from app.serving.media_worker import EngineProxy
from app.serving.worker_messages import (
    CancelGeneration,
    GenerationEnd,
    GenerationError,
    GenerationEventMessage,
    StartGeneration,
    ToFront,
)
from pipeline.contract import AudioChunk, EngineError, GenerationRequest, TextDelta
from pipeline.conversation import Conversation, UserText
from tests.fakes import FULL_CAPABILITIES, RecordingWriter


class Front:
    """Plays the front process for one EngineProxy: records what it is sent."""

    def __init__(self) -> None:
        self.sent: list[ToFront] = []
        self.proxy = EngineProxy("front-engine", FULL_CAPABILITIES, self.sent.append)

    async def turn_started(self) -> int:
        while not self.sent:
            await asyncio.sleep(0)
        started = self.sent[0]
        assert isinstance(started, StartGeneration)
        return started.generation


async def test_a_turn_streams_its_events_and_ends() -> None:
    front = Front()
    request = GenerationRequest(conversation=Conversation(items=[]))
    chunk = AudioChunk(np.zeros(1920, dtype=np.float32))

    async def play_front() -> None:
        turn = await front.turn_started()
        assert front.sent[0] == StartGeneration(generation=turn, request=request)
        front.proxy.deliver(GenerationEventMessage(generation=turn, event=TextDelta("Hi")))
        front.proxy.deliver(GenerationEventMessage(generation=turn, event=chunk))
        front.proxy.deliver(GenerationEnd(generation=turn))

    player = asyncio.create_task(play_front())
    events = [event async for event in front.proxy.run_generation(request)]
    await player
    assert events == [TextDelta("Hi"), chunk]
    assert [type(message) for message in front.sent] == [StartGeneration]  # ended: nothing to cancel


async def test_an_engine_error_in_front_is_raised_with_its_code() -> None:
    front = Front()

    async def play_front() -> None:
        turn = await front.turn_started()
        front.proxy.deliver(GenerationEnd(generation=turn, error=GenerationError(code="engine_timeout", message="nothing for 60 s")))

    player = asyncio.create_task(play_front())
    with pytest.raises(EngineError, match="nothing for 60 s") as raised:
        async for _ in front.proxy.run_generation(GenerationRequest(conversation=Conversation(items=[]))):
            pass
    await player
    assert raised.value.code == "engine_timeout"


async def test_closing_a_turn_early_cancels_it_in_front_and_drops_its_late_events() -> None:
    front = Front()
    turn_events = front.proxy.run_generation(GenerationRequest(conversation=Conversation(items=[])))
    async with contextlib.aclosing(turn_events):
        pending = asyncio.ensure_future(anext(turn_events))
        turn = await front.turn_started()
        front.proxy.deliver(GenerationEventMessage(generation=turn, event=TextDelta("Hi")))
        assert await pending == TextDelta("Hi")
    assert front.sent[-1] == CancelGeneration(generation=turn)
    front.proxy.deliver(GenerationEventMessage(generation=turn, event=TextDelta("late")))  # ignored


async def test_a_turn_too_large_to_send_fails_that_turn_with_an_error_code() -> None:
    writer = RecordingWriter()
    proxy = EngineProxy("front-engine", FULL_CAPABILITIES, lambda message: post(writer, message))
    huge = Conversation(items=(UserText("x" * (MAX_MESSAGE_BYTES + 1)),))
    with pytest.raises(EngineError) as raised:
        async for _ in proxy.run_generation(GenerationRequest(conversation=huge)):
            pass
    assert raised.value.code == "turn_too_large"
    assert writer.written == b""  # not even a cancel_turn: the front never heard of it
