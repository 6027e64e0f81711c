"""``pipeline.contract.Engine`` on vLLM-Omni servers: each turn is one streaming chat completion over HTTP.

``omni-rtc serve --engine-url http://gpu-1:8091/v1`` (repeatable) serves every session's turns from
``vllm serve Qwen/Qwen3-Omni-30B-A3B-Instruct --omni`` servers instead of the in-process engine.
:class:`VllmOmniEngine` talks to one server, :class:`VllmOmniEnginePool` to several, sending each turn
to the least loaded reachable one (fewest turns streaming; ties to the first), like
``pipeline.local.transformers_engine.TransformersEnginePool``. The request and the stream's chunks are
:mod:`pipeline.vllm_omni.chat_completions`'.

Where it runs: in the process that owns the engine (the front, which also serves its media
workers' turns, app/serving/media_workers.py), on that process's event loop, with httpx's ``AsyncClient``.
A turn here is network I/O plus a little decoding per chunk (base64 and a WAV header: well under
a millisecond for vLLM-Omni's 2 s audio chunks), so it needs no engine process and no thread;
only the request body, which carries every clip of the history as WAV (megabytes for long
histories), is built in a worker thread. A cancel closes the HTTP response from the loop that
cancels, at once: closing a stream that has not been read to its end closes its connection,
and vLLM-Omni aborts a request whose client has gone (serving_chat's generator is cancelled and
``AsyncOmni.generate`` aborts the request in every stage).

Failures fail the turn, never the engine: a server that cannot be reached, answers with an HTTP
error, reports an error in its stream, sends a chunk that is not serving_chat's, or ends its
stream early raises :class:`~pipeline.contract.EngineError` with a code and a fixed message (the
details go to the log). A stream that stalls is failed by the server's stall timeout
(app/serving/engines.py), which closes it. Each server's reachability (its ``GET /v1/models``,
asked every ``PROBE_INTERVAL_S`` and told by every turn) is in :meth:`VllmOmniEngine.describe`.

Preemptible turns (``pipeline.contract``; speculative answers, partial transcripts): a vLLM-Omni
server does not say how full its batches are, so the capacity rule is ours (*decided*): a server
takes a preemptible turn while this front streams fewer than ``SERVER_BATCH`` turns to it (64,
vllm-omni 0.32.0rc1's ``deploy/qwen3_omni_moe.yaml``: ``max_num_seqs`` of every stage) and fewer
than ``THROWAWAY_STREAMS`` preemptible ones, else it is refused (``no_spare_capacity``): each is
a whole prefill on a GPU that other fronts' visitors share, mostly thrown away. An ordinary turn that finds ``SERVER_BATCH`` turns streaming while a
preemptible one is among them preempts the newest: its stream is closed at once (its read is
interrupted; closing the connection makes vLLM-Omni abort the request, as for any cancel) and
its consumer gets ``preempted``. The rule counts this front's turns only: fronts sharing a server
(docs/DEPLOY.md) do not see each other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from media.rates import VOICE_RATE
from pipeline.contract import (
    AudioChunk,
    EngineCapabilities,
    EngineError,
    EngineErrorCode,
    EngineHealth,
    FinishReason,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallEvent,
    FunctionCallStarted,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    GenerationTimings,
    TextDelta,
    Usage,
)
from pipeline.pool import LeastLoadedPool
from pipeline.token_count import DEFAULT_MAX_PROMPT_TOKENS, PromptTooLong
from pipeline.vllm_omni.chat_completions import (
    DONE,
    AudioPiece,
    EventStream,
    EventStreamTooLarge,
    MalformedChunk,
    ServerError,
    StreamPiece,
    TextPiece,
    ToolCallPiece,
    UsagePiece,
    check_prompt_length,
    encode_chat_request,
    read_chunk,
)

logger = logging.getLogger(__name__)

# Seconds between reachability checks of an idle server; a turn that cannot connect marks its
# server unreachable at once, so the pool stops choosing it before the next check.
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 2.0
# A server on the same network accepts a connection in milliseconds; one that takes this long
# is down or unroutable, and the turn fails rather than wait for the stall timeout.
CONNECT_TIMEOUT_S = 5.0
# Qwen3-Omni's Code2Wav: one codec frame per 1,920 samples at 24 kHz (80 ms). Usage counts the
# answer's codec frames from its audio, since vLLM-Omni's usage counts only the Thinker's tokens.
CODEC_FRAME_SAMPLES = VOICE_RATE * 80 // 1000
# Of an HTTP error's body, this much goes to the log.
ERROR_BODY_BYTES = 2_000
# GET /v1/models answers a list of a few models (~1 KB); more is not a vLLM server.
MAX_MODELS_BODY_BYTES = 1024 * 1024
DEFAULT_NAME = "vllm-omni"
# Turns one server is taken to batch: vllm-omni 0.32.0rc1's deploy config for Qwen3-Omni
# (deploy/qwen3_omni_moe.yaml) sets max_num_seqs 64 for the Thinker, the Talker and Code2Wav.
SERVER_BATCH = 64
# Preemptible streams open at once to one server: a speculative answer per session speaking now
# on a busy demo box (a few at a time), not one per session of a full batch.
THROWAWAY_STREAMS = 8


@dataclass(eq=False)
class _Preemptible:
    """A preemptible turn streaming from a server: ``preempt`` interrupts the read it is in."""

    id: str
    preempted: bool = False
    scope: asyncio.Timeout | None = None  # armed while the turn awaits the server's next event

    def preempt(self) -> None:
        self.preempted = True
        if self.scope is not None:
            self.scope.reschedule(asyncio.get_running_loop().time())


def redacted(url: str) -> str:
    """``url`` without any user:password it carries (for logs and /healthz)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class VllmOmniEngine:
    """``pipeline.contract.Engine`` on one vLLM-Omni server.

    ``url`` is the server's API base (``http://host:8091/v1``); ``api_key`` is sent as
    ``Authorization: Bearer`` (``vllm serve --api-key``). ``model`` is the served model name
    sent with every turn; None sends none (vLLM answers with the one model it serves) and
    takes the engine's ``name`` from the server's ``/v1/models`` at start. ``seed`` is sent
    with every turn. A turn whose prompt may be longer than ``max_prompt_tokens``
    (``chat_completions.check_prompt_length``) fails ``prompt_too_long`` before it is sent.
    """

    # Function calls: tools go with tool_choice "auto" and the server's tool parser streams the calls
    # (``chat_completions``, docs/VLLM_OMNI.md); none forced: vLLM forces a call with structured
    # output, which vLLM-Omni's Talker would speak. No end-of-turn scores: a chat completion returns
    # text, not the next token's probability. Images go as image_url parts; preemptible turns follow
    # the module docstring's rule.
    capabilities = EngineCapabilities(function_calls=True, forced_function_calls=False, end_of_turn_scores=False,
                                      images=True, preemptible_generations=True)

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        seed: int | None = None,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    ) -> None:
        self.url = url.rstrip("/")
        self._max_prompt_tokens = max_prompt_tokens
        self.name = model or DEFAULT_NAME
        self._model = model
        self._seed = seed
        # Bodies are read as sent (aiter_raw) and bounded by their size on the wire: a compressed
        # body would inflate past any bound in one read, so none is asked for.
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=self.url + "/",
            headers=headers,
            # No read timeout: a stream that stalls is the stall timeout's (turn_stall_timeout_s). A
            # request body is at most a few MB (the history's audio): seconds even on a slow link.
            timeout=httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=None, write=30.0, pool=CONNECT_TIMEOUT_S),
            # One connection per streaming turn; sessions (--max-sessions) bound how many.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )
        self.reachable = False
        self.running = 0
        self.turns = 0  # finished, cancelled or failed
        self.failures = 0
        self.last_error: str | None = None  # the code of the latest failure, until a turn or probe succeeds
        self.probe_ms: float | None = None  # the latest successful GET /v1/models
        self._preemptible: dict[str, _Preemptible] = {}  # streaming now, oldest first
        self._prober: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        """True while the server answers (its latest probe or turn got through)."""
        return self.reachable

    @property
    def load(self) -> int:
        """Ordinary turns streaming (preemptible ones give way to a new one)."""
        return self.running - len(self._preemptible)

    @property
    def spare(self) -> int:
        """Preemptible turns it would take now (the module docstring's rule); 0 while unreachable."""
        if not self.reachable:
            return 0
        return max(0, min(SERVER_BATCH - self.running, THROWAWAY_STREAMS - len(self._preemptible)))

    async def promote(self, preemptible_id: str) -> bool:
        """The streaming preemptible turn ``preemptible_id`` becomes ordinary (``pipeline.contract``)."""
        turn = self._preemptible.get(preemptible_id)
        if turn is None or turn.preempted:
            return False
        del self._preemptible[preemptible_id]
        return True

    def health(self) -> EngineHealth:
        """Alive while the server answers; nothing restarts or queues here (the server does its own)."""
        return EngineHealth(alive=self.reachable)

    def describe(self) -> dict[str, Any]:
        """This server's state for health reports (as a pool's member)."""
        return {
            "url": redacted(self.url),
            "alive": self.reachable,
            "model": self.name,
            "running": self.running,
            "turns": self.turns,
            "failures": self.failures,
            "last_error": self.last_error,
            "probe_ms": None if self.probe_ms is None else round(self.probe_ms, 1),
        }

    async def start(self) -> None:
        """Checks the server once and keeps checking it. A server that is down does not stop the
        start: it may still be loading its model, and health reports say it is not reachable."""
        if self._closed:
            raise EngineError("the engine is closed")
        if self._prober is not None:
            return
        await self.probe()
        self._prober = asyncio.create_task(self._probe_every(), name=f"probe {redacted(self.url)}")

    async def close(self) -> None:
        """Stops the checks and closes the connections (a streaming turn's fails); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
        await self._client.aclose()

    async def probe(self) -> None:
        """``GET /v1/models``: reachable when it answers 200; the served model names the engine."""
        started = time.monotonic()
        try:
            # The whole answer within the timeout: httpx's applies to each read, and a body
            # trickled a byte at a time would hold the probe for as long as the server likes.
            async with asyncio.timeout(PROBE_TIMEOUT_S), self._client.stream("GET", "models") as response:
                if response.status_code != 200:
                    self._unreachable("engine_http_error", f"GET /v1/models answered HTTP {response.status_code}")
                    return
                body = await _bounded_body(response, MAX_MODELS_BODY_BYTES)
            models = [entry["id"] for entry in json.loads(body)["data"]]
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            self._unreachable("engine_unavailable", f"GET /v1/models failed: {type(exc).__name__}: {exc}")
            return
        self.probe_ms = (time.monotonic() - started) * 1000
        if self._model is None and models and self.name != models[0]:
            self.name = str(models[0])
        self._reached()

    async def _probe_every(self) -> None:
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            await self.probe()

    def _reached(self) -> None:
        if not self.reachable:
            logger.info("engine server %s is reachable (%s)", redacted(self.url), self.name)
        self.reachable = True
        self.last_error = None

    def _unreachable(self, code: EngineErrorCode, detail: str) -> None:
        if self.reachable or self.last_error != code:
            logger.warning("engine server %s is not reachable: %s", redacted(self.url), detail)
        self.reachable = False
        self.last_error = code

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._run_generation(request)

    async def _run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        if self._closed:
            raise EngineError("the engine was closed")
        preemptible = None
        if request.preemptible_id is not None:
            if self.spare == 0:
                raise EngineError("The engine server has no spare capacity for a preemptible turn.",
                                  code="no_spare_capacity")
            preemptible = self._preemptible[request.preemptible_id] = _Preemptible(request.preemptible_id)
        elif self.running >= SERVER_BATCH:
            self._preempt_newest()
        submitted = time.monotonic()
        self.running += 1  # before the first await: a pool choosing for the next turn counts this one
        try:
            try:
                body = await asyncio.to_thread(self._request_body, request)
            except PromptTooLong as exc:
                # The turn's, not the server's: the server's health is not touched.
                logger.warning("engine server %s: a turn refused before it was sent: %s", redacted(self.url), exc)
                raise EngineError("The turn's prompt is longer than this engine takes.", code=exc.code) from None
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
            async with self._client.stream("POST", "chat/completions", content=body, headers=headers) as response:
                await self._check_status(response)
                self._reached()
                async with contextlib.aclosing(self._stream(response, request, submitted, preemptible)) as events:
                    async for event in events:
                        yield event
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self._unreachable("engine_unavailable", f"{type(exc).__name__}: {exc}")
            raise self._failed("engine_unavailable", "The engine server could not be reached.") from None
        except httpx.HTTPError as exc:
            logger.warning("engine server %s: the stream broke off: %s: %s", redacted(self.url), type(exc).__name__, exc)
            raise self._failed("engine_stream_error", "The engine server's stream broke off.") from None
        finally:
            self.running -= 1
            self.turns += 1
            if preemptible is not None and self._preemptible.get(preemptible.id) is preemptible:
                del self._preemptible[preemptible.id]

    def _preempt_newest(self) -> None:
        """Closes the newest preemptible turn's stream, for an ordinary turn (the module docstring)."""
        for turn in reversed(self._preemptible.values()):
            if not turn.preempted:
                turn.preempt()
                return

    def _request_body(self, request: GenerationRequest) -> bytes:
        """The turn's request, its prompt's length checked first (blocking: a worker thread's)."""
        check_prompt_length(request, self._max_prompt_tokens)
        return encode_chat_request(request, model=self._model, seed=self._seed)

    async def _check_status(self, response: httpx.Response) -> None:
        if response.status_code == 200:
            if response.headers.get("content-type", "").partition(";")[0].strip() == "text/event-stream":
                return
            logger.warning("engine server %s answered %s, not an event stream", redacted(self.url),
                           response.headers.get("content-type"))
            raise self._failed("engine_stream_error", "The engine server's answer is not an event stream.")
        body = b""
        async for data in response.aiter_raw():
            body += data
            if len(body) >= ERROR_BODY_BYTES:
                break
        logger.warning(
            "engine server %s refused a turn: HTTP %d %s", redacted(self.url), response.status_code,
            body[:ERROR_BODY_BYTES].decode(errors="replace"),
        )
        raise self._failed("engine_http_error", f"The engine server refused the turn (HTTP {response.status_code}).")

    async def _stream(
        self, response: httpx.Response, request: GenerationRequest, submitted: float, preemptible: _Preemptible | None
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The server's events as turn events, ending with ``GenerationDone`` at ``[DONE]``."""
        text: list[str] = []
        calls = _StreamedCalls()
        audio_samples = 0
        usage: UsagePiece | None = None
        finish: str | None = None
        first_text = first_audio = None
        async with contextlib.aclosing(self._events(response)) as events:
            while True:
                try:
                    data = await _next_unless_preempted(events, preemptible)
                except StopAsyncIteration:
                    raise self._failed("engine_stream_error",
                                       "The engine server's stream ended before the answer did.") from None
                if data == DONE:
                    break
                for piece in self._read(data):
                    if isinstance(piece, TextPiece) and calls.started:
                        continue  # text after a call is neither spoken nor delivered (docs/SESSION.md)
                    if isinstance(piece, ToolCallPiece):
                        first_text = first_text if first_text is not None else time.monotonic() - submitted
                        for call_event in self._call_events(calls, piece):
                            yield call_event
                    elif isinstance(piece, TextPiece):
                        first_text = first_text if first_text is not None else time.monotonic() - submitted
                        text.append(piece.text)
                        # One chunk per Thinker step: vLLM streams each step's new text (stream_interval 1).
                        yield TextDelta(piece.text)
                    elif isinstance(piece, AudioPiece):
                        first_audio = first_audio if first_audio is not None else time.monotonic() - submitted
                        audio_samples += piece.pcm.size
                        # No codec frames: the session estimates what was heard from the audio itself.
                        yield AudioChunk(piece.pcm)
                    elif isinstance(piece, UsagePiece):
                        usage = piece
                    else:
                        finish = piece.reason
        finish_reason = _finish_reason(finish, usage, request)
        for call_event in calls.done(cut=finish_reason == "length"):
            yield call_event
        yield GenerationDone(
            text="".join(text),
            usage=_usage(usage, text_deltas=len(text), audio_samples=audio_samples),
            finish_reason=finish_reason,
            timings=GenerationTimings(first_text=first_text, first_audio=first_audio, total=time.monotonic() - submitted),
        )

    def _call_events(self, calls: _StreamedCalls, piece: ToolCallPiece) -> list[FunctionCallEvent]:
        try:
            return calls.read(piece)
        except MalformedChunk as exc:
            logger.warning("engine server %s sent a malformed chunk: %s", redacted(self.url), exc)
            raise self._failed("engine_protocol_error", "The engine server sent a malformed stream chunk.") from None

    async def _events(self, response: httpx.Response) -> AsyncGenerator[str, None]:
        """The stream's events' data, every line bounded (``chat_completions.EventStream``)."""
        stream = EventStream()
        async for chunk in response.aiter_raw():
            try:
                events = stream.feed(chunk)
            except EventStreamTooLarge as exc:
                logger.warning("engine server %s sent a malformed stream: %s", redacted(self.url), exc)
                raise self._failed("engine_protocol_error", "The engine server sent a malformed stream chunk.") from None
            for data in events:
                yield data

    def _read(self, data: str) -> list[StreamPiece]:
        try:
            return read_chunk(data)
        except MalformedChunk as exc:
            logger.warning("engine server %s sent a malformed chunk: %s", redacted(self.url), exc)
            raise self._failed("engine_protocol_error", "The engine server sent a malformed stream chunk.") from None
        except ServerError as exc:
            logger.warning("engine server %s failed a turn: %s", redacted(self.url), exc)
            raise self._failed("engine_error", "The engine server failed the turn.") from None

    def _failed(self, code: EngineErrorCode, message: str) -> EngineError:
        self.failures += 1
        self.last_error = code
        return EngineError(message, code=code)


class _StreamedCalls:
    """An answer's function calls as the server's tool parser streams them, as the events the
    in-process engine gives (``pipeline.local.tool_calls``): ``FunctionCallStarted`` at a call's
    first delta (its name), ``FunctionCallDelta`` per fragment of its arguments, and every call's
    ``FunctionCallDone`` (its fragments joined) once the stream ends. Calls begin in order, each
    named once; a delta that breaks that is ``MalformedChunk``."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._arguments: list[list[str]] = []

    @property
    def started(self) -> bool:
        """A call has begun: the answer's speech is over."""
        return bool(self._names)

    def read(self, piece: ToolCallPiece) -> list[FunctionCallEvent]:
        events: list[FunctionCallEvent] = []
        if piece.name is not None:
            if piece.index != len(self._names):
                raise MalformedChunk(f"call {piece.index} named after {len(self._names)} calls")
            self._names.append(piece.name)
            self._arguments.append([])
            events.append(FunctionCallStarted(piece.index, piece.name))
        elif not 0 <= piece.index < len(self._names):
            raise MalformedChunk(f"arguments for call {piece.index}, which was never named")
        if piece.arguments:
            self._arguments[piece.index].append(piece.arguments)
            events.append(FunctionCallDelta(piece.index, piece.arguments))
        return events

    def done(self, *, cut: bool) -> list[FunctionCallEvent]:
        """Every call written. ``cut``: the answer stopped at its token limit, inside its last call
        (the parser does not say whether ``</tool_call>`` was written; a call that stopped early
        is its last). Arguments are delivered as written: the session checks them."""
        last = len(self._names) - 1
        return [
            FunctionCallDone(index, name, "".join(self._arguments[index]), closed=not (cut and index == last))
            for index, name in enumerate(self._names)
        ]


async def _bounded_body(response: httpx.Response, limit: int) -> bytes:
    """The body as sent, ``ValueError`` once it passes ``limit`` bytes (read no further)."""
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            raise ValueError(f"a body of more than {limit} bytes")
    return bytes(body)


T = TypeVar("T")


async def _next_unless_preempted(events: AsyncIterator[T], preemptible: _Preemptible | None) -> T:
    """The stream's next event; ``EngineError`` ``preempted`` once ``preemptible`` is preempted,
    also while it waits (``_Preemptible.preempt`` expires the scope around the read)."""
    if preemptible is None:
        return await anext(events)
    if not preemptible.preempted:
        try:
            async with asyncio.timeout(None) as scope:
                preemptible.scope = scope
                return await anext(events)
        except TimeoutError:
            if not preemptible.preempted:
                raise
        finally:
            preemptible.scope = None
    raise EngineError("An ordinary turn needed this turn's place on the engine server.", code="preempted")


def _usage(usage: UsagePiece | None, *, text_deltas: int, audio_samples: int) -> Usage:
    frames = audio_samples // CODEC_FRAME_SAMPLES
    if usage is None:  # a server that sends no usage chunk: what the stream itself shows
        return Usage(input_text_tokens=0, input_audio_tokens=0, output_text_tokens=text_deltas, output_audio_tokens=frames)
    audio_tokens = usage.audio_prompt_tokens or 0
    return Usage(
        input_text_tokens=usage.prompt_tokens - audio_tokens,
        input_audio_tokens=audio_tokens,
        output_text_tokens=usage.completion_tokens,
        output_audio_tokens=frames,
    )


def _finish_reason(finish: str | None, usage: UsagePiece | None, request: GenerationRequest) -> FinishReason:
    """"length" when the Thinker hit ``max_output_tokens``. With audio, serving_chat passes on only
    the audio stage's finish_reason, so the token count tells."""
    if finish == "length":
        return "length"
    limit = request.max_output_tokens
    if limit is not None and usage is not None and usage.completion_tokens >= limit:
        return "length"
    return "stop"


class VllmOmniEnginePool(LeastLoadedPool[VllmOmniEngine]):
    """``pipeline.contract.Engine`` over several vLLM-Omni servers: each turn goes to the least loaded
    reachable one (fewest turns streaming; ties to the first listed). With none reachable, turns
    still go to the least loaded server, and fail there if it is still down."""

    def __init__(self, urls: list[str], **engine_options: Any) -> None:
        if not urls:
            raise ValueError("a remote engine pool needs at least one URL")
        super().__init__([VllmOmniEngine(url, **engine_options) for url in urls])

    async def start(self) -> None:
        await asyncio.gather(*(engine.start() for engine in self.engines))
        names = {engine.name for engine in self.engines if engine.alive}
        reachable = [engine for engine in self.engines if engine.alive]
        self.name = (reachable or self.engines)[0].name
        if len(names) > 1:
            logger.warning("the engine servers serve different models: %s; sessions report %s", sorted(names), self.name)
