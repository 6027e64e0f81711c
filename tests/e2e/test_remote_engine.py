"""``omni-rtc serve --engine-url``: the real server, its turns run on a replay of a vLLM-Omni 0.32 server.

One server for the module, started as deployed (a subprocess, media workers by default, so WebRTC
calls live in worker processes and their turns reach the front's engine over IPC), with the replay
(tests/vllm_omni_replay.py) as its only engine server, in this process on its own thread: a test
can hold an answer's stream open after its first audio chunk (``hold_after_first_audio``) and
watch what the client gets meanwhile, whatever the load on the box.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from app.cli import read_utterance
from app.client.webrtc import AUDIBLE_PEAK, RealtimeClient
from app.client.websocket import RealtimeSocketClient
from tests.e2e.conftest import SHUTDOWN_DEADLINE_S, get_json
from tests.listening_ports import free_port
from tests.vllm_omni_replay import (
    ANSWER_TEXT,
    FAILURE_CODES,
    MODEL,
    TRANSCRIPT,
    Failure,
    Pace,
    ReceivedRequest,
    ReplayServer,
    ToolCallAnswer,
    answer_audio,
)

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HELLO = "Hello, can you hear me?"  # hello.wav: the replay's short answer
DEADLINE_S = 60.0  # a guard against hangs, not a speed limit
# Longer than any gap between the replay's chunks (a 25-frame audio chunk, 2 s of speech, takes
# 1 s to "decode" at the default pace), short enough for the stall test.
STALL_TIMEOUT_S = 4.0
STARTUP_DEADLINE_S = 60.0  # no model to load: imports, the VAD, the media workers
SESSION = {"type": "realtime", "instructions": "Answer briefly."}


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        server.answer_text, server.answer = HELLO, answer_audio("hello")
        yield server


@pytest.fixture(scope="module")
def server_url(replay: ReplayServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("remote-server") / "server.log"
    env = {**os.environ, "OMNI_RTC_TURN_STALL_TIMEOUT_S": str(STALL_TIMEOUT_S), "OMNI_RTC_DISCONNECT_TIMEOUT_S": "3"}
    command = [
        sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--engine-url", replay.url, "--ice-loopback", "--log-level", "info",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + STARTUP_DEADLINE_S
        while not healthy(base_url):
            if process.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError(f"the server did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        yield base_url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=SHUTDOWN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def healthy(base_url: str) -> bool:
    try:
        return get_json(f"{base_url}/healthz")["status"] == "ok"
    except (urllib.error.URLError, ConnectionError):
        return False


def input_seconds(part: dict[str, Any]) -> float:
    pcm, rate = soundfile.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])))
    return len(pcm) / rate


async def first_audible_audio(client: RealtimeClient, mark: int) -> None:
    """Returns once audible answer audio has arrived after frame ``mark``."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            audio = client.audio_since(mark)
            if audio.size and float(np.max(np.abs(audio))) >= AUDIBLE_PEAK:
                return
            await asyncio.sleep(0.01)


HEARD_FRAMES = 50  # 20 ms frames: one second of the answer


async def frames_received(client: RealtimeClient, count: int) -> None:
    """Returns once the client has received ``count`` audio frames in all."""
    async with asyncio.timeout(DEADLINE_S):
        while client.frames_received < count:
            await asyncio.sleep(0.01)


async def ended(request: ReceivedRequest) -> None:
    assert await asyncio.to_thread(request.wait_ended, DEADLINE_S)


async def text_turn(client: RealtimeClient | RealtimeSocketClient, text: str) -> dict[str, Any]:
    """A typed user message and its response; the response's ``response.done``."""
    start = len(client.events)
    await client.send({"type": "conversation.item.create",
                       "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await client.send({"type": "response.create"})
    return (await client.wait_for("response.done", start=start))["response"]


def open_answers(replay: ReplayServer) -> list[ReceivedRequest]:
    """The spoken answers whose streams the replay has not ended yet."""
    return [request for request in replay.requests if "audio" in request.modalities and not request.ended.is_set()]


async def test_webrtc_spoken_turns_stream_from_the_engine_server_and_carry_the_history(
    server_url: str, replay: ReplayServer
) -> None:
    replay.hold_after_first_audio = threading.Event()  # each answer's stream stays open until set
    try:
        async with RealtimeClient(server_url, ice_loopback=True, session=SESSION, timeout_s=DEADLINE_S) as client:
            mark = client.frames_received
            first_turn = asyncio.create_task(client.speak(read_utterance(FIXTURES / "hello.wav")))
            await first_audible_audio(client, mark)
            streaming_when_heard = open_answers(replay)
            replay.hold_after_first_audio.set()
            first = await first_turn
            second = await client.speak(read_utterance(FIXTURES / "weather.wav"))
    finally:
        replay.hold_after_first_audio = None
    # The two answers: a speculative answer thrown away when the speech resumed was closed before [DONE].
    one, two = [request for request in replay.requests if request.closed_at is None][-2:]
    assert first.status == second.status == "completed"
    assert first.transcript == HELLO and first.audio_seconds > 1.0
    assert one in streaming_when_heard  # the answer was heard while its stream was held open
    messages = two.body["messages"]
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "Answer briefly."
    assert messages[2] == {"role": "assistant", "content": HELLO}  # the first answer, all of it heard
    (clip,) = messages[1]["content"]
    assert clip["type"] == "input_audio" and input_seconds(clip) > 1.0  # hello.wav: 1.4 s
    assert two.body["speaker"] == "ethan" and two.body["modalities"] == ["text", "audio"]


async def test_websocket_spoken_turn_with_transcription_and_metrics(server_url: str, replay: ReplayServer) -> None:
    # The final transcriptions alone: partial ones would be upstream requests of their own.
    session = {**SESSION, "audio": {"input": {"transcription": {"model": "qwen3-omni", "partials": False}}}}
    replay.hold_after_first_audio = threading.Event()
    try:
        async with RealtimeSocketClient(server_url, session=session, acknowledge_playback=True,
                                        timeout_s=DEADLINE_S) as client:
            start = len(client.events)
            first_turn = asyncio.create_task(client.speak(read_utterance(FIXTURES / "hello.wav")))
            await client.wait_for("response.output_audio.delta", start=start)
            streaming_when_delivered = open_answers(replay)
            replay.hold_after_first_audio.set()
            first = await first_turn
            second = await client.speak(read_utterance(FIXTURES / "weather.wav"))
    finally:
        replay.hold_after_first_audio = None
    answers = [request for request in replay.requests[-4:] if "audio" in request.modalities]
    transcriptions = [request for request in replay.requests[-4:] if request.modalities == ["text"]]
    # Audio reached the client while the upstream stream was held open after its first audio chunk.
    assert answers[0] in streaming_when_delivered
    assert first.status == second.status == "completed" and first.transcript == HELLO
    assert first.user_transcript == TRANSCRIPT and len(transcriptions) == 2
    assert transcriptions[0].body["messages"][-1]["content"][1] == {
        "type": "text", "text": "Transcribe the audio into text."}
    assert answers[1].body["messages"][2] == {"role": "assistant", "content": HELLO}
    assert first.usage["input_token_details"]["audio_tokens"] > 0  # from the server's usage chunk
    metrics = await asyncio.to_thread(read_text, f"{server_url}/metrics")
    assert 'omni_rtc_engine_first_audio_seconds_count{task="respond"}' in metrics
    assert 'omni_rtc_thinker_first_token_seconds_count{task="transcribe"}' in metrics


async def test_webrtc_barge_in_closes_the_engine_servers_stream(server_url: str, replay: ReplayServer) -> None:
    barge_in = {**SESSION, "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": True}}}}
    replay.pace = Pace(real_time_factor=1.0)  # decoded as it plays: the stream is open while the answer plays
    replay.answer_text, replay.answer = ANSWER_TEXT, answer_audio("long_story")
    try:
        async with RealtimeClient(server_url, ice_loopback=True, session=barge_in, timeout_s=DEADLINE_S) as client:
            start, mark = len(client.events), client.frames_received
            await client.say(read_utterance(FIXTURES / "hello.wav"))
            await first_audible_audio(client, mark)
            answer = latest_request(replay)
            # A second of it heard first: an answer cut before a whole token was heard keeps nothing in the
            # history (the heard rule), and the test is about what it keeps.
            await frames_received(client, client.frames_received + HEARD_FRAMES)
            await client.say(read_utterance(FIXTURES / "weather.wav"))  # the user talks over the answer
            done = await client.wait_for("response.done", start=start, timeout_s=DEADLINE_S)
            truncated = await client.wait_for("conversation.item.truncated", start=start, timeout_s=DEADLINE_S)
            await ended(answer)
            next_answer = await request_with_history(replay, after=answer, messages=4)
    finally:
        replay.pace, replay.answer_text, replay.answer = Pace(), HELLO, answer_audio("hello")
    assert done["response"]["status"] == "cancelled"
    assert answer.done_at is None and answer.closed_at is not None  # the server saw its client go
    assert answer.audio_chunks_sent < answer.chunks_planned
    # The next turn's history holds the answer as heard: the text its played audio is taken to voice.
    heard = next_answer.body["messages"][2]
    assert heard["role"] == "assistant" and ANSWER_TEXT.startswith(heard["content"])
    assert heard["content"] == done["response"]["output"][0]["content"][0]["transcript"]
    assert truncated["audio_end_ms"] > 0


def latest_request(replay: ReplayServer) -> ReceivedRequest:
    """The request that arrived last: while an answer plays, the one it came from (a speculative
    answer thrown away before it arrived earlier; the replay lists each request once its body has
    been read, so under load in any order)."""
    return max(replay.requests, key=lambda request: request.arrived_at)


async def request_with_history(replay: ReplayServer, *, after: ReceivedRequest, messages: int) -> ReceivedRequest:
    """The first request to arrive after ``after`` whose conversation holds ``messages`` messages
    (a later turn's answer, speculative or not; not an earlier turn's request listed late)."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            later = [request for request in replay.requests
                     if request.arrived_at > after.arrived_at and len(request.body["messages"]) >= messages]
            if later:
                return min(later, key=lambda request: request.arrived_at)
            await asyncio.sleep(0.02)


async def test_websocket_response_cancel_closes_the_engine_servers_stream(server_url: str, replay: ReplayServer) -> None:
    replay.pace = Pace(real_time_factor=1.0)
    try:
        async with RealtimeSocketClient(server_url, session=SESSION, timeout_s=DEADLINE_S) as client:
            start = len(client.events)
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}})
            await client.send({"type": "response.create"})
            await client.wait_for("response.output_audio.delta", start=start)
            answer = latest_request(replay)
            await client.send({"type": "response.cancel"})
            done = await client.wait_for("response.done", start=start)
            await ended(answer)
    finally:
        replay.pace = Pace()
    assert done["response"]["status"] == "cancelled"
    assert answer.done_at is None and answer.closed_at is not None


# The hostile server's failures (flac_audio, endless_line): test_vllm_omni_engine's, the engine's own.
@pytest.mark.parametrize(("failure", "code"), [(failure, code) for failure, code in FAILURE_CODES.items()
                                               if failure not in ("flac_audio", "endless_line")])
async def test_an_engine_server_failure_fails_the_turn_and_the_session_goes_on(
    server_url: str, replay: ReplayServer, failure: Failure, code: str
) -> None:
    text_only = {**SESSION, "output_modalities": ["text"]}
    async with RealtimeSocketClient(server_url, session=text_only, timeout_s=DEADLINE_S) as client:
        replay.fail_next(failure)
        start = len(client.events)
        failed = await text_turn(client, "Hello?")
        error = (await client.wait_for("error", start=start))["error"]
        served = await text_turn(client, "Hello again?")
    assert failed["status"] == "failed" and failed["status_details"]["error"]["code"] == code
    assert error["code"] == code
    assert "Internal server error" not in error["message"]  # a fixed message, never the server's text
    assert served["status"] == "completed" and served["output"][0]["content"][0]["text"] == HELLO


async def test_webrtc_an_engine_server_failure_fails_the_turn_and_the_call_goes_on(
    server_url: str, replay: ReplayServer
) -> None:
    """The same through a media worker: its turn runs on the front's engine over IPC."""
    text_only = {**SESSION, "output_modalities": ["text"]}
    async with RealtimeClient(server_url, ice_loopback=True, session=text_only, timeout_s=DEADLINE_S) as client:
        replay.fail_next("malformed_chunk")
        start = len(client.events)
        failed = await text_turn(client, "Hello?")
        error = (await client.wait_for("error", start=start))["error"]
        served = await text_turn(client, "Hello again?")
    assert failed["status"] == "failed" and error["code"] == "engine_protocol_error"
    assert served["status"] == "completed"


TOOL = {"type": "function", "name": "get_time", "description": "The time.", "parameters": {"type": "object"}}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PARIS = '{"city": "Paris"}'


async def test_webrtc_a_function_tool_round_trip_runs_on_the_engine_server(server_url: str, replay: ReplayServer) -> None:
    """The client declares a tool; the server streams the replay's call as function-call events;
    the client's output goes back as a tool message with the call's id; the answer is spoken."""
    replay.tool_call = ToolCallAnswer("get_weather", PARIS)
    try:
        async with RealtimeClient(server_url, ice_loopback=True, session={**SESSION, "tools": [WEATHER_TOOL]},
                                  timeout_s=DEADLINE_S) as client:
            start = len(client.events)
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}})
            await client.send({"type": "response.create"})
            first = (await client.wait_for("response.done", start=start))["response"]
            asked = latest_request(replay)
            call_events = client.events[start:]
            (call,) = [item for item in first["output"] if item["type"] == "function_call"]
            start, mark = len(client.events), client.frames_received
            await client.send({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 C"}})
            await client.send({"type": "response.create"})
            second = (await client.wait_for("response.done", start=start))["response"]
            await first_audible_audio(client, mark)
    finally:
        replay.tool_call = None
    assert asked.body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": WEATHER_TOOL["description"], "parameters": WEATHER_TOOL["parameters"]}}]
    assert asked.body["tool_choice"] == "auto"
    deltas = [event["delta"] for event in call_events if event["type"] == "response.function_call_arguments.delta"]
    (arguments_done,) = [event for event in call_events if event["type"] == "response.function_call_arguments.done"]
    added = [event["item"] for event in call_events if event["type"] == "response.output_item.added"]
    assert "".join(deltas) == arguments_done["arguments"] == PARIS and len(deltas) > 1
    assert arguments_done["call_id"] == call["call_id"] and arguments_done["name"] == "get_weather"
    assert [item["type"] for item in added] == ["function_call"]  # a call with nothing said before it
    assert first["status"] == "completed" and call["status"] == "completed" and call["arguments"] == PARIS
    answered = latest_request(replay)
    assert answered.body["messages"][-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call["call_id"], "type": "function", "function": {"name": "get_weather", "arguments": PARIS}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny, 21 C"},
    ]
    assert second["status"] == "completed" and second["output"][0]["content"][0]["transcript"] == HELLO


async def test_websocket_a_tool_choice_that_forces_a_call_is_refused_up_front(server_url: str, replay: ReplayServer) -> None:
    text_only = {**SESSION, "output_modalities": ["text"]}
    async with RealtimeSocketClient(server_url, session=text_only, timeout_s=DEADLINE_S) as client:
        start = len(client.events)
        await client.send({"type": "session.update", "session": {"tools": [TOOL], "tool_choice": "required"}})
        error = (await client.wait_for("error", start=start))["error"]
        served = await text_turn(client, "Hello?")
    assert error["code"] == "tools_unsupported" and error["param"] == "session.tool_choice"
    assert served["status"] == "completed"


async def test_webrtc_a_media_workers_session_knows_what_the_engine_cannot_do(server_url: str, replay: ReplayServer) -> None:
    """The engine's capabilities cross to the media worker holding the call."""
    text_only = {**SESSION, "output_modalities": ["text"]}
    async with RealtimeClient(server_url, ice_loopback=True, session=text_only, timeout_s=DEADLINE_S) as client:
        start = len(client.events)
        await client.send({"type": "response.create", "response": {"tools": [TOOL], "tool_choice": "required"}})
        error = (await client.wait_for("error", start=start))["error"]
        served = await text_turn(client, "Hello?")
    assert error["code"] == "tools_unsupported" and error["param"] == "response.tool_choice"
    assert served["status"] == "completed"


async def test_an_unreachable_engine_server_fails_turns_and_shows_in_healthz(server_url: str, replay: ReplayServer) -> None:
    async with RealtimeSocketClient(server_url, session={**SESSION, "output_modalities": ["text"]},
                                    timeout_s=DEADLINE_S) as client:
        await asyncio.to_thread(replay.stop)
        try:
            refused = await text_turn(client, "Hello?")
            down = await asyncio.to_thread(get_json_any, f"{server_url}/healthz")
        finally:
            await asyncio.to_thread(replay.start)  # the same port again
        served = await text_turn(client, "Hello again?")
        up = await asyncio.to_thread(get_json_any, f"{server_url}/healthz")
    assert refused["status_details"]["error"]["code"] == "engine_unavailable"
    assert down["status"] == "degraded" and down["engine"]["alive"] is False
    (engine,) = down["engine"]["engines"]
    assert engine["url"] == replay.url and engine["alive"] is False and engine["last_error"] == "engine_unavailable"
    assert served["status"] == "completed"
    assert up["status"] == "ok" and up["model"] == MODEL and up["engine"]["engines"][0]["alive"] is True


def get_json_any(url: str) -> dict[str, Any]:
    """The JSON body of ``url``, whatever its status (/healthz answers 503 while no engine is reachable)."""
    try:
        return get_json(url)
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def read_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()
