"""The camera over WebRTC: the headless client sends a synthetic video (a Y4M it writes) beside its
microphone; the real server decodes it (VP8), samples frames at the session's rates and puts
them into the spoken turns the dev model answers.

One call, recorded once per module: first in manual mode (no VAD), two commits ``IDLE_S``
apart measure the idle rate; then server VAD with 16 frames per turn measures the rate while
the user speaks; then 2 frames per turn show the cap. Rates are counted, never timed: the
frames a turn holds are compared with the time the client saw between the events that bound
it, allowing one frame either way (sampling happens on frame arrivals, 50 ms apart).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import read_utterance
from app.client.turn import TurnResult
from app.client.webrtc import RealtimeClient
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
class Recorded:
    negotiated_video: bool
    idle_images: int
    idle_seconds: float
    speaking_turn: TurnResult
    speaking_seconds: float  # speech_started to committed, as the client saw them
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


async def _commit(client: RealtimeClient) -> tuple[str, float]:
    start = len(client.events)
    await client.send({"type": "input_audio_buffer.commit"})
    committed = await client.wait_for(lambda e: e["type"] in ("input_audio_buffer.committed", "error"), start=start)
    assert committed["type"] != "error", committed
    at = time.monotonic()
    await client.wait_for("conversation.item.done", start=start)
    return committed["item_id"], at


async def _speak_timed(client: RealtimeClient, pcm) -> tuple[TurnResult, float]:
    """One utterance; also the seconds between speech_started and committed as the client saw them."""
    start = len(client.events)
    started_at: list[float] = []

    async def watch() -> None:
        await client.wait_for("input_audio_buffer.speech_started", start=start)
        started_at.append(time.monotonic())
        await client.wait_for("input_audio_buffer.committed", start=start)
        started_at.append(time.monotonic())

    watcher = asyncio.create_task(watch())
    turn = await client.speak(pcm)
    await watcher
    return turn, started_at[1] - started_at[0]


@pytest.fixture(scope="module")
async def recorded(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    video = write_y4m(tmp_path_factory.mktemp("video") / "camera.y4m", width=WIDTH, height=HEIGHT, fps=FPS, frames=40)
    speech = read_utterance(FIXTURES / "weather.wav")
    async with RealtimeClient(server_url, ice_loopback=True, session=SESSION, video=video) as client:
        answer = client.answer_sdp or ""
        negotiated = "m=video" in answer and "a=recvonly" in answer.split("m=video", 1)[1]
        # Idle: the frames between two manual commits (the microphone sends silence meanwhile).
        await asyncio.sleep(0.5)
        _, first_at = await _commit(client)
        await asyncio.sleep(IDLE_S)
        item_id, second_at = await _commit(client)
        idle_images = _images_of_item(client.events, item_id)
        # Speaking: server VAD, every frame sampled while the utterance lasts.
        await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": SERVER_VAD}}}})
        await client.wait_for("session.updated")
        speaking_turn, speaking_seconds = await _speak_timed(client, speech)
        images_in_prompt = {"speaking_turn": _images_so_far(client.events)}
        # The cap: two frames while speaking, plus the one before.
        await client.send({"type": "session.update", "session": {"video": {"frames_per_turn": 2}}})
        capped_turn = await client.speak(speech)
        images_in_prompt["capped_turn"] = _images_so_far(client.events)
    return Recorded(
        negotiated, idle_images, second_at - first_at, speaking_turn, speaking_seconds, capped_turn, images_in_prompt
    )


def test_the_call_negotiates_the_camera_receive_only(recorded: Recorded) -> None:
    assert recorded.negotiated_video


def test_frames_are_sampled_at_the_idle_rate(recorded: Recorded) -> None:
    expected = recorded.idle_seconds * IDLE_FPS
    assert expected - 1 <= recorded.idle_images <= expected + 1, (recorded.idle_images, recorded.idle_seconds)


def test_frames_are_sampled_at_the_speaking_rate(recorded: Recorded) -> None:
    during = recorded.speaking_turn.images_shown - 1  # the first is the last frame before speech
    expected = recorded.speaking_seconds * SPEAKING_FPS
    assert expected - 1 <= during <= expected + 1, (during, recorded.speaking_seconds)


def test_a_turn_takes_frames_per_turn_while_speaking_plus_the_one_before(recorded: Recorded) -> None:
    assert recorded.capped_turn.images_shown == 2 + 1


@pytest.mark.parametrize("turn", ["speaking_turn", "capped_turn"])
def test_usage_reports_the_image_tokens_of_every_frame_in_the_prompt(recorded: Recorded, turn: str) -> None:
    # The history's frames are within its image budget: every frame of the call is in the prompt.
    result: TurnResult = getattr(recorded, turn)
    assert result.status in ("completed", "incomplete")
    per_frame = image_tokens(WIDTH, HEIGHT, MAX_PIXELS)
    assert result.usage["input_token_details"]["image_tokens"] == recorded.images_in_prompt[turn] * per_frame > 0
