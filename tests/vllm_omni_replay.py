"""A replay of a vLLM-Omni 0.32 server (``vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct --omni
--enable-auto-tool-choice --tool-call-parser hermes``) for tests.

``POST /v1/chat/completions`` answers every streaming request with a recorded answer, in exactly
the chunks vllm-omni 0.32.0rc1's serving_chat sends, at the pace of a GPU deployment; it records each
request it receives (body, arrival, chunks sent, when the stream ended or its client went away),
can be told to fail the next requests in each way a server fails, and to hold each answer's stream
open after its first audio chunk (``hold_after_first_audio``). ``GET /v1/models`` and
``GET /health`` answer as vLLM-Omni's do. It runs in a thread of its own (uvicorn), so its clock is
the test's ``time.monotonic()`` and its pace does not depend on the test's event loop.

Written from reading vllm-omni 0.32.0rc1: ``vllm_omni/entrypoints/openai/serving_chat.py``
(``chat_completion_stream_generator``, ``_create_audio_choice``, ``_preprocess_chat``),
``audio_utils_mixin.py`` (``create_audio``: soundfile, WAV, PCM_16), ``protocol/chat_completion.py``
(``OmniChatCompletionStreamResponse``: ``modality``, ``metrics``; ``audio_metadata`` on a choice),
``api_server.py`` (``/v1/models``, ``/health``, ``_validate_chat_completion_raw_body``),
``model_executor/models/qwen3_omni/tool_speech.py`` (the Talker stops at ``<tool_call>``), and vLLM
0.32.0's ``ChatCompletionStreamResponse``, ``DeltaMessage``/``DeltaToolCall``, the Hermes tool parser
(``vllm/tool_parsers/hermes_tool_parser.py``), ``UsageInfo``, ``ErrorResponse`` and its auth middleware.
serving_chat dumps chunks with ``model_dump_json(exclude_unset=True)``: fields it passes explicitly
are present even when null, defaults are absent. A spoken answer (``modalities: ["text", "audio"]``)
streams, in time order::

    text   {"id","object":"chat.completion.chunk","created","model",
            "choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],
            "prompt_token_ids":null,"prompt_text":null,"modality":"text"}
    text   ... "choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null,
            "token_ids":null}],"modality":"text","metrics":null                  (one per Thinker token)
    text   the last one (the stop token's step, content ""): finish_reason null while audio is still
           to come, plus "stop_reason":null
    audio  ... "choices":[{"index":0,"delta":{"role":"assistant","content":"<base64 WAV>"},"logprobs":null,
            "finish_reason":null,"stop_reason":null,"token_ids":null,"audio_metadata":{"format":"wav",
            "sample_rate_hz":24000,"frame_count":N,"channels":1}}],"modality":"audio","metrics":null,
            "usage":{"prompt_tokens":P,"completion_tokens":0,"total_tokens":P}   (the last: finish_reason "stop")
    usage  {"id","object","created","model","choices":[],"usage":{"prompt_tokens":P,"total_tokens":P+C,
            "completion_tokens":C,"prompt_tokens_details":{"multimodal_tokens":{"audio":A}}}}
    data: [DONE]

(``prompt_tokens_details`` as a server started with ``--enable-prompt-tokens-details`` sends it.)
Audio comes as vLLM-Omni's deploy config chunks it (``deploy/qwen3_omni_moe.yaml``: a first chunk
of 4 codec frames, then 25 frames, 80 ms each), each sent once it would have been decoded at
``Pace.real_time_factor``. A text-only answer (``modalities: ["text"]``: text-only responses and
transcriptions) has no audio chunks and its last text chunk carries the finish_reason.

A request that offers tools (``tool_choice`` ``auto``) and does not end with a ``tool`` message is
answered with a call when ``ReplayServer.tool_call`` is set: the Thinker writes the preface (if
any), then ``<tool_call>\n{"name": …, "arguments": …}\n</tool_call>``, which the Hermes parser
streams as (the tokens of the markup and of the body up to the name send no chunk)::

    text   ... "choices":[{"index":0,"delta":{"content":" word"},...}]          (the preface, if any)
    text   ... "delta":{"content":null,"tool_calls":[{"id":"chatcmpl-tool-<16 hex>","type":"function",
            "index":0,"function":{"name":"get_weather"}}]}                       (once the name is whole)
    text   ... "delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]}
            ...                                                                   (a fragment per token)
    text   the stop token's step: "delta":{}, finish_reason "tool_calls" (null while audio is to come)
    audio  the preface's speech, or, for a call with no preface, one chunk of empty content
           (``_create_audio_choice``'s empty speech segment) with finish_reason "stop"

The Talker speaks the preface only (vllm-omni 0.32's ``tool_speech``). A text-only request cut by
``max_tokens`` inside the call ends with finish_reason "length".

What is the replay's own and not vLLM-Omni's: the answer (``long_story.wav``, its text cut at word
boundaries into "tokens"), the transcript of every transcription, and the prompt token count (a
token per 4 characters of text, 12.5 per second of audio, as Qwen3-Omni's audio encoder has).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import io
import json
import math
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jsonschema
import numpy as np
import soundfile
import soxr
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline.contract import EngineErrorCode
from tests.hostile import flac_silence

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA_PATH = FIXTURES / "vllm_omni" / "chat_completion_request.schema.json"
ANSWER_TEXT = "Once upon a time, a little robot walked to the sea to hear the waves."  # long_story.wav
TRANSCRIPT = "Hello, can you hear me?"
MODEL = "Qwen/Qwen3-Omni-30B-A3B-Instruct"
SPEAKERS = ("chelsie", "ethan", "aiden")  # Qwen3-Omni's talker_config.speaker_id
VOICE_RATE = 24_000
FRAME_SAMPLES = 1_920  # one codec frame, 80 ms
AUDIO_TOKENS_PER_SECOND = 12.5

# Each way a server fails, for the next request (ReplayServer.fail_next):
# http_500: an HTTP 500 with vLLM's ErrorResponse; error_chunk: vLLM's streamed error after two text
# chunks; malformed_chunk: a chunk that is not JSON; bad_audio: an audio chunk that is not a sound
# file; stall: two text chunks, then nothing until the client goes; drop: the connection is cut
# mid-stream. A hostile server's: flac_audio: an audio chunk of ten minutes of silence as
# FLAC (58 KB of base64, 55 MiB decoded); endless_line: a data line that never ends.
Failure = Literal["http_500", "error_chunk", "malformed_chunk", "bad_audio", "stall", "drop", "flac_audio", "endless_line"]
# The engine error code a turn fails with on each (a stall's: the stall timeout's, StallTimeoutEngine).
FAILURE_CODES: dict[Failure, EngineErrorCode] = {
    "http_500": "engine_http_error",
    "error_chunk": "engine_error",
    "malformed_chunk": "engine_protocol_error",
    "bad_audio": "engine_protocol_error",
    "drop": "engine_stream_error",
    "stall": "engine_timeout",
    "flac_audio": "engine_protocol_error",  # refused before it is decoded
    "endless_line": "engine_protocol_error",  # refused at 4 MiB
}
_ENDLESS = "endless"  # the plan's marker for the line that never ends


@dataclass(frozen=True)
class Pace:
    """When each chunk leaves, in seconds from the request's arrival."""

    first_token_s: float = 0.15  # prefill of a short prompt
    token_interval_s: float = 0.02  # the Thinker at 50 tokens/s
    # vLLM-Omni's blog: a mean audio first packet of 631 ms at concurrency 64; less when alone.
    first_audio_s: float = 0.4
    # Seconds to decode a second of audio (the blog: RTF 0.47 at concurrency 64).
    real_time_factor: float = 0.5
    first_chunk_frames: int = 4  # deploy/qwen3_omni_moe.yaml: initial_codec_chunk_frames
    chunk_frames: int = 25  # codec_chunk_frames


@dataclass(frozen=True)
class ToolCallAnswer:
    """An answer that calls ``name`` with ``arguments`` (JSON text as the model writes it) after
    ``preface`` (spoken as ``preface_audio``, 24 kHz; None: no speech)."""

    name: str
    arguments: str
    preface: str = ""
    preface_audio: np.ndarray | None = None


@dataclass
class ReceivedRequest:
    """One request as the replay saw it; times are ``time.monotonic()``."""

    body: dict[str, Any]
    authorization: str | None
    arrived_at: float
    failure: Failure | None = None
    chunks_planned: int = 0
    chunks_sent: int = 0
    audio_chunks_sent: int = 0
    first_audio_at: float | None = None  # the first audio chunk sent
    done_at: float | None = None  # [DONE] sent
    closed_at: float | None = None  # the client went away before [DONE]
    endless_bytes_sent: int = 0  # of the line that never ends (failure endless_line)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def modalities(self) -> list[str]:
        return list(self.body.get("modalities") or [])

    def wait_ended(self, timeout_s: float = 30.0) -> bool:
        """Blocking: True once the stream ended ([DONE] sent, or the client gone)."""
        return self.ended.wait(timeout_s)


def answer_audio(name: str = "long_story") -> np.ndarray:
    """A speech fixture (espeak-ng, 16 kHz) at Qwen3-Omni's 24 kHz, as an answer's audio."""
    pcm, rate = soundfile.read(FIXTURES / f"{name}.wav", dtype="float32")
    return soxr.resample(pcm, rate, VOICE_RATE).astype(np.float32)


class ReplayServer:
    """The replay on 127.0.0.1; ``url`` is its API base (``http://127.0.0.1:PORT/v1``).

    ``start()`` and ``stop()`` block (they start and join the server's thread); a stopped
    replay refuses connections, and ``start()`` serves again on the same port.
    """

    def __init__(self, *, pace: Pace | None = None, api_key: str | None = None, port: int = 0) -> None:
        self.pace = pace or Pace()
        self.api_key = api_key
        # What every answer says (its text cut into "tokens" at spaces) and speaks; tests may swap them.
        self.answer_text = ANSWER_TEXT
        self.answer = answer_audio()
        self.transcript = TRANSCRIPT
        # Set: a request offering tools is answered with this call (the module docstring).
        self.tool_call: ToolCallAnswer | None = None
        # False: started without --enable-auto-tool-choice, so tool_choice "auto" is refused (400).
        self.auto_tool_choice = True
        # Bytes of padding in the /v1/models answer: a hostile server's endless list (0: none).
        self.models_padding = 0
        # Set to an unset Event: every spoken answer's stream waits after its first audio chunk
        # until the event is set, so a test knows the stream is open while it watches the client.
        self.hold_after_first_audio: threading.Event | None = None
        self.requests: list[ReceivedRequest] = []
        self._failures: collections.deque[Failure] = collections.deque()
        self._validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    def fail_next(self, *failures: Failure) -> None:
        """The next requests fail these ways, one each, in order."""
        self._failures.extend(failures)

    def start(self) -> None:
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self._port, log_level="warning",
                                timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="vllm-omni replay", daemon=True)
        thread.start()
        give_up = time.monotonic() + 30.0
        while not server.started:
            if not thread.is_alive() or time.monotonic() > give_up:
                raise RuntimeError("the vLLM-Omni replay did not start")
            time.sleep(0.01)
        self._port = server.servers[0].sockets[0].getsockname()[1]
        self._server, self._thread = server, thread

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=30.0)
        self._server = self._thread = None

    def __enter__(self) -> ReplayServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the HTTP API ------------------------------------------------------------------------

    def _app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
        ])

    def _unauthorized(self, request: Request) -> Response | None:
        # vLLM's --api-key middleware guards every /v1 route with this answer.
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return None

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "healthy"})

    async def _models(self, request: Request) -> Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "vllm-omni", "root": MODEL,
             "parent": None, "max_model_len": 65536, "permission": []},
        ], **({"padding": "x" * self.models_padding} if self.models_padding else {})})

    async def _chat_completions(self, request: Request) -> Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        arrived_at = time.monotonic()
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError:
            return _error_response("Expecting value: the body is not JSON", 400)
        received = ReceivedRequest(body=body, authorization=request.headers.get("authorization"),
                                   arrived_at=arrived_at)
        self.requests.append(received)
        problem = self._invalid(body)
        if problem is not None:
            received.ended.set()
            return _error_response(problem, 400)
        received.failure = self._failures.popleft() if self._failures else None
        if received.failure == "http_500":
            received.ended.set()
            return _error_response("EngineCore encountered an issue.", 500, "InternalServerError")
        plan = self._plan(body, received.failure)
        received.chunks_planned = len(plan)
        return StreamingResponse(self._play(received, plan), media_type="text/event-stream")

    def _invalid(self, body: Any) -> str | None:
        """What vLLM-Omni would refuse with a 400: the request model, then serving_chat's own checks."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(body))
        if error is not None:
            return f"1 validation error for ChatCompletionRequest: {error.message} at {list(error.absolute_path)}"
        modalities = body.get("modalities", ["text", "audio"])
        if not isinstance(modalities, list) or not set(modalities) <= {"text", "audio"}:
            return f"Unsupported output modalities {modalities} for this model."
        speaker = body.get("voice") or body.get("speaker")
        if isinstance(speaker, str) and speaker.strip() and speaker.strip().lower() not in SPEAKERS:
            return f"Invalid speaker '{speaker}'. Supported: {', '.join(sorted(SPEAKERS))}"
        if not body.get("stream"):
            return "the replay streams only (stream: true)"
        tool_choice = body.get("tool_choice")
        if body.get("tools") and tool_choice in ("auto", None) and not self.auto_tool_choice:
            return '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        if tool_choice not in ("auto", "none", None):
            return "the replay streams tool_choice auto or none only"
        return None

    # -- the answer ---------------------------------------------------------------------------

    def _plan(self, body: dict[str, Any], failure: Failure | None) -> list[tuple[float, str]]:
        """Every ``data:`` payload of the answer and when it leaves (seconds after arrival)."""
        pace = self.pace
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": MODEL}
        speaks = "audio" in body.get("modalities", ["text", "audio"])
        if self.tool_call is not None and _calls_tools(body):
            return self._spoil(self._tool_call_plan(body, head, self.tool_call, speaks), failure, head)
        transcribing = not speaks and _asks_for_transcription(body)
        words = _tokens(self.transcript if transcribing else self.answer_text)
        max_tokens = body.get("max_tokens")
        finish = "stop"
        if isinstance(max_tokens, int) and len(words) + 1 > max_tokens:
            words, finish = words[:max_tokens], "length"
        completion_tokens = len(words) + (1 if finish == "stop" else 0)  # the stop token counts
        prompt_tokens, audio_tokens = _prompt_tokens(body)

        plan: list[tuple[float, str]] = []
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        plan.append((pace.first_token_s, _dump({**head, "choices": [role], "prompt_token_ids": None,
                                                "prompt_text": None, "modality": "text"})))
        steps = [*words, ""] if finish == "stop" else words
        for index, text in enumerate(steps):
            last = index == len(steps) - 1
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None}
            choice["finish_reason"] = None if (speaks or not last) else finish
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            at = pace.first_token_s + (index + 1) * pace.token_interval_s
            plan.append((at, _dump({**head, "choices": [choice], "modality": "text", "metrics": None})))
        if speaks:
            audio = self.answer
            if finish == "length":  # the answer was cut: so was its speech
                audio = audio[: len(audio) * len(words) // len(_tokens(self.answer_text))]
            plan.extend(self._audio_chunks(head, audio, prompt_tokens))
        _close_stream(plan, head, prompt_tokens, completion_tokens, audio_tokens)
        return self._spoil(plan, failure, head)

    def _tool_call_plan(
        self, body: dict[str, Any], head: dict[str, Any], call: ToolCallAnswer, speaks: bool
    ) -> list[tuple[float, str]]:
        """The chunks of an answer that calls ``call`` (the module docstring)."""
        pace = self.pace
        preface = _tokens(call.preface) if call.preface else []
        body_tokens = ['{"', "name", '":', ' "', call.name, '",', ' "', "arguments", '":', " ",
                       *_fragments(call.arguments), "}", "\n"]
        # Each step's delta; None: the parser holds it back, no chunk. The name goes out at the
        # step that closes its string, the arguments a fragment per step.
        steps: list[dict[str, Any] | None] = [{"content": word} for word in preface]
        steps += [None, None]  # <tool_call>, "\n"
        call_id = f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"
        arguments_from = len(body_tokens) - 2 - len(_fragments(call.arguments))
        for index, token in enumerate(body_tokens):
            if index == 5:  # '",' closes the name
                steps.append({"content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "index": 0, "function": {"name": call.name}}]})
            elif arguments_from <= index < len(body_tokens) - 2:
                steps.append({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": token}}]})
            else:
                steps.append(None)
        steps.append(None)  # </tool_call>
        max_tokens = body.get("max_tokens")
        finish = "tool_calls"
        if isinstance(max_tokens, int) and len(steps) + 1 > max_tokens:
            steps, finish = steps[:max_tokens], "length"
        completion_tokens = len(steps) + (1 if finish == "tool_calls" else 0)
        prompt_tokens, audio_tokens = _prompt_tokens(body)

        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        plan: list[tuple[float, str]] = [(pace.first_token_s, _dump({**head, "choices": [role], "prompt_token_ids": None,
                                                                     "prompt_text": None, "modality": "text"}))]
        final: list[dict[str, Any] | None] = [*steps, {}] if finish == "tool_calls" else steps
        for index, delta in enumerate(final):
            last = index == len(final) - 1
            if delta is None and not last:
                continue
            choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "logprobs": None,
                                      "finish_reason": None if (speaks or not last) else finish}
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            at = pace.first_token_s + (index + 1) * pace.token_interval_s
            plan.append((at, _dump({**head, "choices": [choice], "modality": "text", "metrics": None})))
        if speaks:
            if call.preface_audio is not None:
                audio = self._audio_chunks(head, call.preface_audio, prompt_tokens)
            else:  # the Talker was cut before it spoke: an empty speech segment ends the audio
                choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": "stop", "stop_reason": None, "token_ids": None}
                audio = [(pace.first_audio_s, _dump({
                    **head, "choices": [choice], "modality": "audio", "metrics": None,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
                }))]
            if audio[-1][0] < plan[-1][0]:  # the text ends last: it carries the finish_reason, not the audio
                plan[-1] = (plan[-1][0], _with_finish(plan[-1][1], finish))
                audio[-1] = (audio[-1][0], _with_finish(audio[-1][1], None))
            plan.extend(audio)
        _close_stream(plan, head, prompt_tokens, completion_tokens, audio_tokens)
        return plan

    def _audio_chunks(self, head: dict[str, Any], audio: np.ndarray, prompt_tokens: int) -> list[tuple[float, str]]:
        pace = self.pace
        frames = math.ceil(len(audio) / FRAME_SAMPLES)
        bounds, frame = [], 0
        while frame < frames:
            step = pace.first_chunk_frames if frame == 0 else pace.chunk_frames
            bounds.append((frame, min(frame + step, frames)))
            frame += step
        first_seconds = bounds[0][1] * FRAME_SAMPLES / VOICE_RATE
        chunks = []
        for number, (start, stop) in enumerate(bounds):
            pcm = audio[start * FRAME_SAMPLES : stop * FRAME_SAMPLES]
            decoded_by = pace.first_audio_s + (stop * FRAME_SAMPLES / VOICE_RATE - first_seconds) * pace.real_time_factor
            choice = {
                "index": 0, "delta": {"role": "assistant", "content": _wav_base64(pcm)}, "logprobs": None,
                "finish_reason": "stop" if number == len(bounds) - 1 else None, "stop_reason": None,
                "token_ids": None,
                "audio_metadata": {"format": "wav", "sample_rate_hz": VOICE_RATE, "frame_count": len(pcm),
                                   "channels": 1},
            }
            chunks.append((decoded_by, _dump({
                **head, "choices": [choice], "modality": "audio", "metrics": None,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens},
            })))
        return chunks

    @staticmethod
    def _spoil(plan: list[tuple[float, str]], failure: Failure | None, head: dict[str, Any]) -> list[tuple[float, str]]:
        """The plan as ``failure`` changes it: it goes wrong after the role chunk and two text chunks."""
        if failure is None:
            return plan
        kept, at = plan[:3], plan[2][0]
        if failure == "error_chunk":  # serving_chat: create_streaming_error_response(e), then [DONE]
            error = {"error": {"message": "Internal server error", "type": "BadRequestError", "param": None,
                               "code": 400}}
            return [*kept, (at, json.dumps(error)), (at, "[DONE]")]  # json.dumps: spaced, unlike the chunks
        if failure == "malformed_chunk":
            return [*kept, (at, '{"id": "chatcmpl-cut", "object": "chat.completion.ch')]
        if failure == "bad_audio":
            choice = {"index": 0, "delta": {"role": "assistant", "content": base64.b64encode(b"not a WAV").decode()},
                      "logprobs": None, "finish_reason": None}
            return [*kept, (at, _dump({**head, "choices": [choice], "modality": "audio", "metrics": None}))]
        if failure == "flac_audio":
            choice = {"index": 0, "delta": {"role": "assistant", "content": base64.b64encode(flac_silence()).decode()},
                      "logprobs": None, "finish_reason": None}
            return [*kept, (at, _dump({**head, "choices": [choice], "modality": "audio", "metrics": None}))]
        if failure == "endless_line":
            return [*kept, (at, _ENDLESS)]
        if failure == "stall":
            return [*kept, (math.inf, "")]
        return [*kept, (at, "")]  # drop: the marker ends the response with an error

    async def _play(self, received: ReceivedRequest, plan: list[tuple[float, str]]) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        started = loop.time() - (time.monotonic() - received.arrived_at)
        try:
            for at, data in plan:
                await asyncio.sleep(max(0.0, started + at - loop.time()) if math.isfinite(at) else 3600.0)
                if received.failure == "drop" and data == "":
                    raise ConnectionAbortedError("the replay cuts the connection")  # uvicorn closes it
                if received.failure == "endless_line" and data == _ENDLESS:
                    yield "data: "
                    while True:  # until the client goes
                        yield "x" * 65_536
                        received.endless_bytes_sent += 65_536
                        await asyncio.sleep(0)
                yield f"data: {data}\n\n"
                received.chunks_sent += 1
                if '"modality":"audio"' in data:
                    received.audio_chunks_sent += 1
                    received.first_audio_at = received.first_audio_at or time.monotonic()
                    hold = self.hold_after_first_audio
                    if hold is not None and received.audio_chunks_sent == 1:
                        while not hold.is_set():  # polled: a client that goes cancels the wait
                            await asyncio.sleep(0.01)
            received.done_at = time.monotonic()
        finally:
            if received.done_at is None:
                received.closed_at = time.monotonic()  # cancelled by the client's disconnect (or cut)
            received.ended.set()


def _close_stream(plan: list[tuple[float, str]], head: dict[str, Any], prompt_tokens: int, completion_tokens: int,
                  audio_tokens: int) -> None:
    """Orders ``plan`` by time and ends it as serving_chat ends a stream: the usage chunk, then [DONE]."""
    plan.sort(key=lambda entry: entry[0])
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                             "completion_tokens": completion_tokens}
    if audio_tokens:
        usage["prompt_tokens_details"] = {"multimodal_tokens": {"audio": audio_tokens}}
    end = plan[-1][0]
    plan.append((end, _dump({**head, "choices": [], "usage": usage})))
    plan.append((end, "[DONE]"))


def _dump(chunk: dict[str, Any]) -> str:
    """As pydantic's model_dump_json writes it: compact."""
    return json.dumps(chunk, separators=(",", ":"))


def _error_response(message: str, code: int, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=code)


def _tokens(text: str) -> list[str]:
    """The replay's "Thinker tokens": words, each with the space before it."""
    words = text.split(" ")
    return [words[0], *(" " + word for word in words[1:])]


def _with_finish(data: str, finish: str | None) -> str:
    """A chunk's payload with its choice's finish_reason set (serving_chat gives it to whichever
    modality finishes last)."""
    chunk = json.loads(data)
    chunk["choices"][0]["finish_reason"] = finish
    return _dump(chunk)


def _fragments(arguments: str) -> list[str]:
    """The replay's "tokens" of a call's arguments: up to 3 characters after any whitespace."""
    return re.findall(r"\s*\S{1,3}", arguments) or [arguments]


def _calls_tools(body: dict[str, Any]) -> bool:
    """The request offers tools for the model to call (``tool_choice`` auto) and does not end with
    a function's output (the replay answers an output in words)."""
    messages = body.get("messages") or [{}]
    return bool(body.get("tools")) and body.get("tool_choice") in ("auto", None) and messages[-1].get("role") != "tool"


def _wav_base64(pcm: np.ndarray) -> str:
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, VOICE_RATE, format="WAV", subtype="PCM_16")  # create_audio's call
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _user_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            parts.extend(part for part in content if isinstance(part, dict))
    return parts


def _asks_for_transcription(body: dict[str, Any]) -> bool:
    """Qwen3-Omni's ASR prompt ("Transcribe the audio into text." and its per-language forms)."""
    last_user = [m for m in body.get("messages", []) if m.get("role") == "user"][-1:]
    content = last_user[0].get("content") if last_user else None
    texts = [part.get("text", "") for part in content if part.get("type") == "text"] if isinstance(content, list) else []
    return any(text.startswith(("Transcribe the", "请将这段中文语音转换为纯文本")) for text in texts)


def input_audio_seconds(part: dict[str, Any]) -> float:
    """The length of one ``input_audio`` part's WAV."""
    info = soundfile.info(io.BytesIO(base64.b64decode(part["input_audio"]["data"])))
    return info.frames / info.samplerate


def _prompt_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(all prompt tokens, the audio ones), as the replay estimates them."""
    audio = sum(round(input_audio_seconds(part) * AUDIO_TOKENS_PER_SECOND)
                for part in _user_parts(body) if part.get("type") == "input_audio")
    characters = 0
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            characters += len(content)
        elif isinstance(content, list):
            characters += sum(len(part.get("text", "")) for part in content if part.get("type") == "text")
    return math.ceil(characters / 4) + audio, audio
