"""The camera over WebRTC: the headless client sends a synthetic video (a Y4M it writes) beside its
microphone; the real server decodes it (VP8), samples frames at the session's rates and puts
them into the spoken turns the dev model answers.

One call, recorded once per module: first in manual mode (no VAD), two commits ``IDLE_S``
apart measure the idle rate; then server VAD with 16 frames per turn measures the rate while
the user speaks a 5 s sentence; then 2 frames per turn show the cap. The server samples on its
own clock, which the client cannot read, so each rate is checked against bounds the client's
own actions and receipts put on the server's window (the window lies inside them however late
an event reaches a loaded box): at most the rate allows over the longest window, at least the
rate allows over the shortest, a sample being the first frame after its interval.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.cli import read_utterance
from app.client.turn import TurnResult
from app.client.webrtc import RealtimeClient
from media.rates import SPEECH_RATE
from pipeline.images import image_tokens
from tests.pictures import write_y4m

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WIDTH, HEIGHT, FPS = 160, 120, 20
IDLE_FPS, SPEAKING_FPS = 1.0, 2.0
IDLE_S = 4.0
MAX_PIXELS = 200_704
VIDEO = {"speaking_fps": SPEAKING_FPS, "idle_fps": IDLE_FPS, "frames_per_turn": 16, "max_pixels": MAX_PIXELS}
SESSION = {"type": "realtime", "max_output_tokens": 16, "audio": {"input": {"turn_detection": None}}, "video": VIDEO}
SERVER_VAD = {"type": "server_vad", "silence_duration_ms": 500}


@dataclass(frozen=True)
class Window:
    """The least and the most seconds the server's sampling window can have lasted."""

    shortest_s: float
    longest_s: float


@dataclass(frozen=True)
class Recorded:
    negotiated_video: bool
    idle_images: int
    idle_window: Window  # between the two manual commits
    speaking_turn: TurnResult
    speaking_window: Window  # from speech_started to the commit
    capped_turn: TurnResult
    images_in_prompt: dict[str, int]  # by turn: the camera frames of every user item so far


def _images_so_far(events: list[dict]) -> int:
    return sum(
        part["type"] == "input_image"
        for event in events
        if event.get("type") == "conversation.item.done" and event["item"]["role"] == "user"
        for part in event["item"]["content"]
    )


def _images_of_item(events: list[dict], item_id: str) -> int:
    for event in events:
        if event.get("type") == "conversation.item.done" and event["item"]["id"] == item_id:
            return sum(part["type"] == "input_image" for part in event["item"]["content"])
    raise AssertionError(f"no conversation.item.done for {item_id}")


async def _commit(client: RealtimeClient) -> tuple[str, float, float]:
    """A manual commit: its item, when the client sent it and when it got ``committed`` (the
    server's commit lies between the two)."""
    start = len(client.events)
    sent_at = time.monotonic()
    await client.send({"type": "input_audio_buffer.commit"})
    committed = await client.wait_for(lambda e: e["type"] in ("input_audio_buffer.committed", "error"), start=start)
    assert committed["type"] != "error", committed
    received_at = time.monotonic()
    await client.wait_for("conversation.item.done", start=start)
    return committed["item_id"], sent_at, received_at


async def _speak_in_window(client: RealtimeClient, pcm: np.ndarray) -> tuple[TurnResult, Window]:
    """One utterance, and the bounds on the server's speaking window: speech starts after the
    client began sending it and before the client got ``speech_started``; the commit comes after
    the client sent the utterance's last sample (it waits for 500 ms of silence after the last
    words, which end within the utterance's last 500 ms) and before the client got ``committed``."""
    start = len(client.events)
    received_at: list[float] = []

    async def watch() -> None:
        await client.wait_for("input_audio_buffer.speech_started", start=start)
        received_at.append(time.monotonic())
        await client.wait_for("input_audio_buffer.committed", start=start)
        received_at.append(time.monotonic())

    watcher = asyncio.create_task(watch())
    sending_from = time.monotonic()
    turn = await client.speak(pcm)
    await watcher
    started_by, committed_by = received_at
    sent_by = sending_from + pcm.size / SPEECH_RATE
    return turn, Window(sent_by - started_by, committed_by - sending_from)


@pytest.fixture(scope="module")
async def recorded(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    video = write_y4m(tmp_path_factory.mktemp("video") / "camera.y4m", width=WIDTH, height=HEIGHT, fps=FPS, frames=40)
    async with RealtimeClient(server_url, ice_loopback=True, session=SESSION, video=video) as client:
        answer = client.answer_sdp or ""
        negotiated = "m=video" in answer and "a=recvonly" in answer.split("m=video", 1)[1]
        # Idle: the frames between two manual commits (the microphone sends silence meanwhile).
        await asyncio.sleep(0.5)
        _, first_sent, first_received = await _commit(client)
        await asyncio.sleep(IDLE_S)
        item_id, second_sent, second_received = await _commit(client)
        idle_images = _images_of_item(client.events, item_id)
        idle_window = Window(second_sent - first_received, second_received - first_sent)
        # Speaking: server VAD, every frame sampled while the utterance lasts.
        await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": SERVER_VAD}}}})
        await client.wait_for("session.updated")
        speaking_turn, speaking_window = await _speak_in_window(client, read_utterance(FIXTURES / "five_second_story.wav"))
        images_in_prompt = {"speaking_turn": _images_so_far(client.events)}
        # The cap: two frames while speaking, plus the one before.
        await client.send({"type": "session.update", "session": {"video": {"frames_per_turn": 2}}})
        capped_turn = await client.speak(read_utterance(FIXTURES / "weather.wav"))
        images_in_prompt["capped_turn"] = _images_so_far(client.events)
    return Recorded(negotiated, idle_images, idle_window, speaking_turn, speaking_window, capped_turn, images_in_prompt)


def sampled_bounds(window: Window, fps: float) -> tuple[int, int]:
    """The fewest and the most frames sampled at ``fps`` in the window: samples are at least an
    interval apart, and at most an interval and two camera frames (the first frame after the
    interval, or the one after it if that one came while the last was still being encoded)."""
    longest_gap_s = 1 / fps + 2 / FPS
    return int(window.shortest_s / longest_gap_s), int(window.longest_s * fps) + 1


def test_the_call_negotiates_the_camera_receive_only(recorded: Recorded) -> None:
    assert recorded.negotiated_video


def test_frames_are_sampled_at_the_idle_rate(recorded: Recorded) -> None:
    fewest, most = sampled_bounds(recorded.idle_window, IDLE_FPS)
    assert fewest <= recorded.idle_images <= most, (recorded.idle_images, recorded.idle_window)


def test_frames_are_sampled_at_the_speaking_rate(recorded: Recorded) -> None:
    during = recorded.speaking_turn.images_shown - 1  # the first is the last frame before speech
    fewest, most = sampled_bounds(recorded.speaking_window, SPEAKING_FPS)
    assert fewest <= during <= most, (during, recorded.speaking_window)


def test_a_turn_takes_frames_per_turn_while_speaking_plus_the_one_before(recorded: Recorded) -> None:
    assert recorded.capped_turn.images_shown == 2 + 1


@pytest.mark.parametrize("turn", ["speaking_turn", "capped_turn"])
def test_usage_reports_the_image_tokens_of_every_frame_in_the_prompt(recorded: Recorded, turn: str) -> None:
    # The history's frames are within its image budget: every frame of the call is in the prompt.
    result: TurnResult = getattr(recorded, turn)
    assert result.status in ("completed", "incomplete")
    per_frame = image_tokens(WIDTH, HEIGHT, MAX_PIXELS)
    assert result.usage["input_token_details"]["image_tokens"] == recorded.images_in_prompt[turn] * per_frame > 0
