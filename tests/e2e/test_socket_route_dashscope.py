"""Qwen's own realtime client, the real ``dashscope`` 2.0.2 SDK, on ``GET /v1/realtime``.

Served by uvicorn on 127.0.0.1 with a scripted engine (no model); the server, its silero VAD, the
socket and the SDK (in worker threads: it is synchronous) are real. The SDK is pointed at
``/v1/realtime``, where its handshake headers choose DashScope's dialect, as a user replacing
DashScope's host with this server's would; the e2e test (tests/e2e/test_dashscope.py) uses
DashScope's own path. Each test here is one DashScope behaviour its SDK relies on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
import websockets
from dashscope.audio.qwen_omni import MultiModality

from app.config import Settings
from app.http.server import create_app
from app.http.socket_route import websocket_server_options
from pipeline.conversation import UserAudio, UserImage
from tests.dashscope_client import SdkSession, pcm16
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.pictures import encoded
from tests.speech import load_fixture, silence

pytestmark = pytest.mark.e2e

REPLY = "Hello there friend"
DOCUMENTED = {"output_modalities": [MultiModality.AUDIO, MultiModality.TEXT], "voice": "Cherry"}


@contextlib.asynccontextmanager
async def serving(tmp_path, engine: ScriptedEngine | None = None) -> AsyncIterator[str]:
    settings = Settings(cache_dir=tmp_path)
    app = create_app(settings, engine=engine or ScriptedEngine(REPLY))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        yield url.replace("http://", "ws://") + "/v1/realtime"


@contextlib.asynccontextmanager
async def sdk_session(url: str) -> AsyncIterator[SdkSession]:
    client = SdkSession(url)
    await asyncio.to_thread(client.conversation.connect)
    try:
        yield client
    finally:
        if client.closed is None:
            await asyncio.to_thread(client.conversation.close)


async def append(client: SdkSession, pcm: np.ndarray) -> None:
    """``pcm`` as the SDK's samples append it: 100 ms a call (at once: the server takes 20 s ahead)."""
    data = pcm16(pcm)

    def send() -> None:
        for start in range(0, len(data), 3200):
            client.conversation.append_audio(base64.b64encode(data[start:start + 3200]).decode())

    await asyncio.to_thread(send)


async def test_the_sdks_documented_session_with_cherry_is_taken(tmp_path):
    async with serving(tmp_path) as url, sdk_session(url) as client:
        await asyncio.to_thread(client.conversation.update_session, **DOCUMENTED)
        updated = (await asyncio.to_thread(client.wait_for, "session.updated"))["session"]
    assert not client.of_type("error")
    assert (updated["voice"], updated["modalities"]) == ("Chelsie", ["text", "audio"])
    assert (updated["input_audio_format"], updated["output_audio_format"]) == ("pcm16", "pcm24")
    assert updated["turn_detection"]["threshold"] == 0.2  # as the SDK sent it, on DashScope's scale


async def test_16khz_pcm16_speech_is_heard_at_its_own_rate(tmp_path):
    async with serving(tmp_path) as url, sdk_session(url) as client:
        # A voice this server has always taken: only the audio format is under test.
        await asyncio.to_thread(client.conversation.update_session, DOCUMENTED["output_modalities"], voice="Ethan")
        await asyncio.to_thread(client.wait_for, "session.updated")
        await append(client, np.concatenate([silence(2000), load_fixture("hello"), silence(1500)]))
        started = await asyncio.to_thread(client.wait_for, "input_audio_buffer.speech_started")
        stopped = await asyncio.to_thread(client.wait_for, "input_audio_buffer.speech_stopped")
    # The words start 2.05 s in and end 3.4 s in; audio_start_ms counts from the 300 ms of prefix
    # padding before them, audio_end_ms comes after the 800 ms silence wait. Read as 24 kHz, both
    # would be two thirds of that (1.1 s, 2.8 s): speech heard 1.5 times too fast.
    assert 1650 <= started["audio_start_ms"] <= 1900
    assert 4000 <= stopped["audio_end_ms"] <= 4500


async def test_answers_arrive_under_the_names_the_sdks_callback_reads(tmp_path):
    async with serving(tmp_path) as url, sdk_session(url) as client:
        await asyncio.to_thread(client.conversation.create_item, {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
        await asyncio.to_thread(client.conversation.create_response)
        done = (await asyncio.to_thread(client.wait_for, "response.done"))["response"]
    assert done["status"] == "completed"
    assert client.transcript(done["id"]) == REPLY
    assert client.audio(done["id"])
    assert client.conversation.get_last_first_audio_delay() is not None  # the SDK saw response.audio.delta
    ga_only = [event["type"] for event in client.events if event["type"].startswith(
        ("response.output_audio", "response.output_text", "conversation.item.added", "conversation.item.done"))]
    assert not ga_only


async def test_a_camera_frame_puts_image_tokens_into_the_next_turn(tmp_path):
    engine = ScriptedEngine(REPLY)
    async with serving(tmp_path, engine) as url, sdk_session(url) as client:
        await asyncio.to_thread(client.conversation.update_session, DOCUMENTED["output_modalities"], voice="Ethan")
        await asyncio.to_thread(client.wait_for, "session.updated")
        await asyncio.to_thread(client.conversation.append_video, base64.b64encode(encoded(640, 480)).decode())
        await append(client, np.concatenate([silence(500), load_fixture("hello"), silence(1500)]))
        done = (await asyncio.to_thread(client.wait_for, "response.done"))["response"]
    assert not client.of_type("error")
    assert done["usage"]["input_token_details"]["image_tokens"] == 88
    # The first answer's request: partial transcripts of the speech (DashScope transcribes) come before it.
    answer = next(request for request in engine.requests if request.task == "respond")
    user_parts = [item for item in answer.conversation.items if isinstance(item, UserImage | UserAudio)]
    assert [type(item) for item in user_parts] == [UserImage, UserAudio]  # the frame, then the words


async def test_end_session_returns_and_the_server_closes_the_socket_normally(tmp_path):
    async with serving(tmp_path) as url, sdk_session(url) as client:
        await asyncio.to_thread(client.conversation.update_session, **DOCUMENTED)
        await asyncio.to_thread(client.conversation.end_session, 10)
        code, reason = await asyncio.to_thread(client.wait_closed)
    assert client.events[-1]["type"] == "session.finished"
    assert (code, reason) == (1000, "session_finished")


async def test_an_openai_client_on_the_same_path_keeps_openais_names(tmp_path):
    async def spoken_types(headers: dict[str, str]) -> list[str]:
        async with websockets.connect(url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            types: list[str] = []
            async with asyncio.timeout(10):  # against hangs only
                while "response.done" not in types:
                    types.append(json.loads(await ws.recv())["type"])
            return types

    async with serving(tmp_path) as url:
        openai = await spoken_types({"user-agent": "AsyncOpenAI/Python 2.8.1"})
        dashscope = await spoken_types({"user-agent": "dashscope/2.0.2; python/3.11"})
    assert "response.output_audio.delta" in openai and "conversation.item.done" in openai
    assert "response.audio.delta" not in openai
    assert "response.audio.delta" in dashscope and "response.output_audio.delta" not in dashscope


async def test_dashscopes_own_path_speaks_its_dialect_with_its_defaults_to_any_client(tmp_path):
    async with serving(tmp_path) as url:
        dashscope_url = url.replace("/v1/realtime", "/api-ws/v1/realtime?model=qwen3-omni-flash-realtime")
        async with websockets.connect(dashscope_url) as ws:  # a raw client: no SDK headers
            created = json.loads(await ws.recv())
    session = created["session"]
    assert (session["modalities"], session["input_audio_format"]) == (["text", "audio"], "pcm16")
    assert session["turn_detection"]["interrupt_response"] is True
    assert session["turn_detection"]["silence_duration_ms"] == 800
    assert session["input_audio_transcription"] is not None
