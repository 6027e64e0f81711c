"""Turn-taking over WebRTC: a reply the moment the answer ends is heard; semantic_vad end to end.

The real server in this process with a scripted engine (audible answers, no model plane), a real
aiortc client speaking the fixtures in real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.cli import read_utterance
from app.client.webrtc import RealtimeClient
from app.config import Settings
from app.http.server import create_app
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QUICK_REPLIES = 4
# The echo tail is half-duplex's: barge-in (the default) acts on any speech at once.
HALF_DUPLEX = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}}}
SEMANTIC = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "medium"}}}}


@pytest_asyncio.fixture(loop_scope="function")
async def scripted_server_url() -> AsyncIterator[str]:
    """With the installed end-of-turn model (the default cache directory, as `make` fills it)."""
    app = create_app(Settings(ice_loopback=True), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        yield url


async def test_a_reply_started_the_moment_the_answer_stopped_is_answered_every_time(scripted_server_url: str) -> None:
    hello, weather = read_utterance(FIXTURES / "hello.wav"), read_utterance(FIXTURES / "weather.wav")
    async with RealtimeClient(scripted_server_url, ice_loopback=True, session=HALF_DUPLEX) as client:
        for number in range(QUICK_REPLIES + 1):  # the first turn, then each reply
            start = len(client.events)
            # Every reply starts the moment output_audio_buffer.stopped has come (the loop's last
            # line): say() starts the microphone at once and does not wait for any answer.
            saying = asyncio.create_task(client.say(weather if number % 2 else hello))
            done = await client.wait_for("response.done", start=start, timeout_s=30)  # a lost reply hangs
            await saying
            assert done["response"]["status"] == "completed", f"reply {number}"
            types = [event["type"] for event in client.events[start:]]
            assert "input_audio_buffer.committed" in types, f"reply {number} was not heard: {types}"
            await client.wait_for("output_audio_buffer.stopped", start=start)


async def test_semantic_vad_answers_a_spoken_turn(scripted_server_url: str) -> None:
    async with RealtimeClient(scripted_server_url, ice_loopback=True, session=SEMANTIC) as client:
        created = await client.wait_for("session.created")
        turn = await client.speak(read_utterance(FIXTURES / "turns" / "finished_03_slt85.wav"))
    assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert turn.status == "completed"
    assert "error" not in turn.event_types()


async def test_without_the_model_the_server_starts_and_semantic_vad_is_refused(tmp_path: Path) -> None:
    app = create_app(Settings(ice_loopback=True, turn_model=tmp_path / "absent.onnx"), engine=ScriptedEngine())
    async with serving_in_process(app) as url, RealtimeClient(url, ice_loopback=True, session=SEMANTIC) as client:
        error = await client.wait_for("error")
        turn = await client.speak(read_utterance(FIXTURES / "hello.wav"))  # server VAD still answers
    assert error["error"]["code"] == "semantic_vad_unavailable"
    assert client.events[0]["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert turn.status == "completed"
