"""``GET /v1/realtime`` on the real server (dev model): the official openai-python SDK, and the
seed protocol's client (server VAD, half-duplex, playback acknowledged after each answer).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import soxr
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from app.cli import read_utterance
from app.client.websocket import RealtimeSocketClient
from pipeline.images import image_tokens
from tests.e2e.conftest import wait_for_sessions
from tests.pictures import data_url, encoded

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SDK_SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
TURN_TIMEOUT_S = 120.0


def pcm16_24k(pcm16k: np.ndarray) -> bytes:
    return (np.clip(soxr.resample(pcm16k, 16_000, 24_000), -1, 1) * 32767).astype("<i2").tobytes()


async def test_openai_python_sdk_runs_a_text_turn_and_a_spoken_turn(server_url: str) -> None:
    client = AsyncOpenAI(api_key="sk-unused", base_url=f"{server_url}/v1")  # ws://…/v1/realtime?model=…
    raw: list[str] = []

    async def until_done(connection: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "response.done":
            message = await connection.recv_bytes()
            raw.append(message.decode())
            events.append(json.loads(message))
        return events

    async with client.realtime.connect(model="gpt-realtime") as connection:
        await connection.session.update(session={"type": "realtime", "instructions": "Answer briefly."})
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}
        )
        await connection.response.create()
        text_turn = await until_done(connection)

        # Spoken: the utterance appended as an SDK program does (all at once, 100 ms per event),
        # with silence after it; the server's VAD commits it and answers.
        speech = np.concatenate([np.zeros(8_000, np.float32), read_utterance(FIXTURES / "hello.wav"),
                                 np.zeros(16_000, np.float32)])
        audio = pcm16_24k(speech)
        for start in range(0, len(audio), 4_800):
            await connection.input_audio_buffer.append(audio=base64.b64encode(audio[start:start + 4_800]).decode())
        spoken_turn = await until_done(connection)

    for message in raw:
        SDK_SERVER_EVENT.validate_json(message)  # every event is one the SDK knows, with its fields
    for events in (text_turn, spoken_turn):
        done = events[-1]["response"]
        assert done["status"] == "completed"
        assert [e for e in events if e["type"] == "response.output_audio.delta"]
        assert "response.output_audio.done" in [e["type"] for e in events]
        assert not [e for e in events if e["type"].startswith("output_audio_buffer.")]
    spoken_types = [e["type"] for e in spoken_turn]
    assert spoken_types.index("input_audio_buffer.speech_started") < spoken_types.index("input_audio_buffer.committed")
    assert spoken_turn[-1]["response"]["usage"]["input_token_details"]["audio_tokens"] > 0
    assert wait_for_sessions(server_url, 0) == 0


async def test_seed_style_two_spoken_turns_acknowledged_hold_the_first_in_the_second(server_url: str) -> None:
    half_duplex = {"turn_detection": {"type": "server_vad", "interrupt_response": False}}  # as the seed client
    async with RealtimeSocketClient(server_url, acknowledge_playback=True, timeout_s=TURN_TIMEOUT_S,
                                    session={"type": "realtime", "instructions": "Answer briefly.",
                                             "audio": {"input": half_duplex}}) as client:
        session = (await client.wait_for("session.updated"))["session"]
        first = await client.speak(read_utterance(FIXTURES / "hello.wav"))
        second = await client.speak(read_utterance(FIXTURES / "weather.wav"))
        events = client.events
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["audio"]["input"]["turn_detection"]["interrupt_response"] is False  # half-duplex
    types = [e["type"] for e in events]
    assert "input_audio_buffer.commit" not in types
    assert types.count("input_audio_buffer.speech_started") == types.count("input_audio_buffer.committed") == 2
    acks = [e["event"] for e in events if e["type"] == "playback.acknowledged"]
    assert [ack["played_ms"] for ack in acks] == [ack["audio_ms"] for ack in acks] and len(acks) == 2
    assert all(ack["history_committed"] for ack in acks)
    for turn in (first, second):
        assert turn.status == "completed" and turn.audio_seconds >= 0.5 and turn.transcript
    before, after = first.usage, second.usage
    # Turn 2's prompt holds turn 1's utterance (audio tokens) and its answer as heard (text tokens).
    assert after["input_token_details"]["audio_tokens"] > before["input_token_details"]["audio_tokens"]
    assert after["input_tokens"] >= before["input_tokens"] + before["output_token_details"]["text_tokens"]
    assert wait_for_sessions(server_url, 0) == 0


def _noise_png(megabytes: float) -> bytes:
    """A PNG of random pixels: it does not compress, so its size is its pixels' (~3 bytes each)."""
    import io

    from PIL import Image

    side = int((megabytes * 1e6 / 3) ** 0.5) + 1
    pixels = np.random.default_rng(0).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG", compress_level=0)
    return out.getvalue()


async def test_openai_python_sdk_shows_an_image_and_bad_images_get_errors(server_url: str) -> None:
    client = AsyncOpenAI(api_key="sk-unused", base_url=f"{server_url}/v1")
    huge = _noise_png(20.1)
    assert len(huge) > 20_000_000

    async def next_of(connection: Any, *types: str) -> dict[str, Any]:
        while True:
            event = json.loads(await connection.recv_bytes())
            SDK_SERVER_EVENT.validate_python(event)
            if event["type"] in types:
                return event

    def user_item(*content: dict[str, Any]) -> dict[str, Any]:
        return {"type": "message", "role": "user", "content": list(content)}

    async with client.realtime.connect(model="gpt-realtime") as connection:
        await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        photo = {"type": "input_image", "image_url": data_url(encoded(640, 480, seed=1)), "detail": "low"}
        await connection.conversation.item.create(item=user_item(photo, {"type": "input_text", "text": "What is it?"}))
        added = await next_of(connection, "conversation.item.added", "error")
        await connection.response.create()
        shown = (await next_of(connection, "response.done"))["response"]

        await connection.conversation.item.create(
            item=user_item({"type": "input_image", "image_url": data_url(huge, "image/png")})
        )
        too_large = await next_of(connection, "error", "conversation.item.added")
        await connection.conversation.item.create(
            item=user_item({"type": "input_image", "image_url": "data:text/plain;base64,aGVsbG8sIHdvcmxk"})
        )
        not_an_image = await next_of(connection, "error", "conversation.item.added")

        await connection.conversation.item.create(item=user_item({"type": "input_text", "text": "Still there?"}))
        await connection.response.create()
        after = (await next_of(connection, "response.done"))["response"]

    assert [part["type"] for part in added["item"]["content"]] == ["input_image", "input_text"]
    assert shown["status"] == "completed"
    assert shown["usage"]["input_token_details"]["image_tokens"] == image_tokens(640, 480, 100_352) == 88
    assert too_large["type"] == "error" and too_large["error"]["code"] == "event_too_large"
    assert not_an_image["type"] == "error"
    assert (not_an_image["error"]["code"], not_an_image["error"]["param"]) == (
        "invalid_value", "item.content[0].image_url"
    )
    # The session went on: the next turn is answered, its prompt still holding the first image.
    assert after["status"] == "completed"
    assert after["usage"]["input_token_details"]["image_tokens"] == 88
    assert wait_for_sessions(server_url, 0) == 0


def test_omni_rtc_call_speaks_over_the_websocket(server_url: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "call", server_url, "--transport", "websocket", "--playback-ack",
         "--wav", str(FIXTURES / "hello.wav"), "--out", str(tmp_path), "--json",
         "--session", json.dumps({"instructions": "Answer briefly."})],
        capture_output=True, text=True, timeout=TURN_TIMEOUT_S * 2,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (turn,) = report["sessions"][0]["turns"]
    assert report["ok"] and turn["status"] == "completed"
    audio, rate = soundfile.read(turn["output"])
    assert rate == 24_000 and len(audio) / rate == pytest.approx(turn["audio_seconds"], abs=0.01)
