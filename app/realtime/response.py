"""One response: its settings, its run from engine turn to ``response.done``, and its events.

The session decides *when* to respond and when to cancel; :class:`ResponseRun` does the rest in
one task it owns: it waits for the response before it to send its ``response.done``, renders
the conversation, runs the engine turn (or takes the speculative one that answers the same
request), streams text, audio and function calls into items and out as events, and finishes
(``response.done``; an ``error`` event when it failed). It reports to its
:class:`ResponseOwner` (the session). The event sequences are plain functions
(:func:`created_event`, :func:`message_events`, :func:`finish_events`, :func:`call_events`), so
the order a client sees is tested without a session. docs/SESSION.md "One server-VAD turn" and
"Function calling".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.realtime.failures import FailureCode, failure_event
from app.realtime.history import AssistantEntry, FunctionCallEntry, History, checked_text
from app.realtime.playback import AnswerAudio
from app.realtime.protocol import (
    AudioFormat,
    ContentPart,
    ConversationItemAddedEvent,
    ConversationItemDoneEvent,
    InputTokenDetails,
    OutputTokenDetails,
    ProtocolError,
    ResponseAudio,
    ResponseAudioOutput,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCreateParams,
    ResponseDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseLatency,
    ResponseObject,
    ResponseOutputAudioDoneEvent,
    ResponseOutputAudioTranscriptDeltaEvent,
    ResponseOutputAudioTranscriptDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputTextDeltaEvent,
    ResponseOutputTextDoneEvent,
    ResponseStatus,
    ResponseUsage,
    ServerEvent,
    StatusDetails,
    StatusError,
    new_id,
)
from app.realtime.session_config import Modality, SessionConfig, read_max_output_tokens, read_voice
from app.realtime.speculation import Speculation
from app.realtime.tools import arguments_problem, check_choice, read_tool_choice, read_tools
from app.realtime.turn_report import ToolCallReport, TurnReport
from pipeline.contract import (
    AudioChunk,
    Engine,
    EngineError,
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
    Voice,
)
from pipeline.conversation import Conversation
from pipeline.tool_format import Tool, ToolChoice, offers_tools

# ---- response ----

# How long response.done may wait for the answer's first frame to reach the transport. A paced
# track sends the first queued frame within 20 ms; only a worker far behind takes longer, and
# then the reported latency should include that wait. Bounded so that response.done never hangs.
FIRST_FRAME_WAIT_S = 1.0


@dataclass
class Response:
    id: str
    conversation_id: str
    modality: Modality
    voice: Voice
    temperature: float
    max_output_tokens: int | None
    instructions: str | None
    metadata: dict[str, str] | None
    started_at: float  # monotonic: commit (VAD) or response.create
    silence_wait_ms: float = 0.0  # audio the VAD waited through before committing
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    # Its items in output order: the message (``entry``) and the function calls after it.
    output: list[AssistantEntry | FunctionCallEntry] = field(default_factory=list)
    announced: bool = False  # response.created sent
    written: dict[str, FunctionCallDone] = field(default_factory=dict)  # calls the model finished, by item id
    call_problems: list[str] = field(default_factory=list)  # calls not as their function takes them
    cancelling: bool = False
    cancel_reason: str | None = None
    first_audio_at: float | None = None  # monotonic: the first audio chunk handed to the output
    # Monotonic: the output handed that audio's first frame to the transport (its on_playback_started).
    first_frame_sent_at: float | None = None
    expects_first_frame: bool = False
    first_frame_sent: asyncio.Event = field(default_factory=asyncio.Event)
    # Set at its first audio, or when it ends: work for the engine that must not delay the
    # answer (input transcription) waits for it.
    output_started: asyncio.Event = field(default_factory=asyncio.Event)
    # The speculation taken at its commit (app.realtime.speculation), and, once its held answer
    # is used, when that answer's engine turn started (monotonic).
    speculation: Speculation | None = None
    speculation_started_at: float | None = None
    # Monotonic: its engine turn was submitted (a used speculation's: when that one started).
    engine_started_at: float | None = None
    # Monotonic, by call item id: the model began each call, and wrote it whole.
    calls_started_at: dict[str, float] = field(default_factory=dict)
    calls_written_at: dict[str, float] = field(default_factory=dict)

    @property
    def entry(self) -> AssistantEntry | None:
        """The message item (audio or text), once opened."""
        return next((item for item in self.output if isinstance(item, AssistantEntry)), None)

    @entry.setter
    def entry(self, entry: AssistantEntry | None) -> None:
        self.output = [item for item in self.output if not isinstance(item, AssistantEntry)]
        if entry is not None:
            self.output.insert(0, entry)

    @property
    def first_audio_out_at(self) -> float | None:
        """Monotonic: its first audio left, as its latency counts it: the first frame handed to the
        transport when the output reported it, else the first chunk handed to the output."""
        return self.first_frame_sent_at or self.first_audio_at

    @property
    def calls(self) -> list[FunctionCallEntry]:
        return [item for item in self.output if isinstance(item, FunctionCallEntry)]

    @property
    def may_call(self) -> bool:
        """The model sees tools (and may answer with calls only)."""
        return offers_tools(self.tools, self.tool_choice)

    def object(self, status: ResponseStatus, **fields: Any) -> ResponseObject:
        return ResponseObject(
            id=self.id,
            status=status,
            conversation_id=self.conversation_id,
            output_modalities=[self.modality],
            max_output_tokens="inf" if self.max_output_tokens is None else self.max_output_tokens,
            audio=ResponseAudio(output=ResponseAudioOutput(format=AudioFormat(), voice=self.voice)),
            metadata=self.metadata,
            **fields,
        )

    @classmethod
    def for_session(
        cls, config: SessionConfig, conversation_id: str, started_at: float, silence_wait_ms: float = 0.0
    ) -> Response:
        """A response with the session's settings (what the server starts by itself)."""
        return cls(
            id=new_id("resp"),
            conversation_id=conversation_id,
            modality=config.output_modality,
            voice=config.voice,
            temperature=config.temperature,
            max_output_tokens=config.max_output_tokens,
            instructions=config.instructions,
            metadata=None,
            started_at=started_at,
            silence_wait_ms=silence_wait_ms,
            tools=config.tools,
            tool_choice=config.tool_choice,
        )

    def audio_written(self, *, to_idle_paced_output: bool) -> None:
        """Audio of this response went to the output (a paced one with nothing queued, or not)."""
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
            # A paced output reports the first frame it sends (on_playback_started) when nothing plays before it.
            self.expects_first_frame = to_idle_paced_output
            self.output_started.set()

    def first_frame_out(self, response_id: str) -> None:
        """The output sent the first frame of ``response_id``'s audio (its ``on_playback_started``)."""
        if response_id == self.id and self.first_frame_sent_at is None:
            self.first_frame_sent_at = time.monotonic()
            self.first_frame_sent.set()

    async def wait_first_frame(self) -> None:
        """Before ``response.done``: let the first frame reach the transport, so that its latency does."""
        if not self.expects_first_frame or self.first_frame_sent_at is not None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_FRAME_WAIT_S):
                await self.first_frame_sent.wait()

    def content_ids(self) -> dict[str, Any]:
        entry = self.entry
        assert entry is not None
        return {"response_id": self.id, "item_id": entry.id, "output_index": self.output.index(entry), "content_index": 0}

    def call_ids(self, call: FunctionCallEntry) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": call.id, "output_index": self.output.index(call), "call_id": call.call_id}

    def part(self, text: str) -> ContentPart:
        if self.modality == "audio":
            return ContentPart(type="audio", transcript=text)
        return ContentPart(type="text", text=text)


# ---- response_events ----

def ended_as(response: Response, done: GenerationDone) -> tuple[ResponseStatus, str | None]:
    """The status (and reason) of a response whose engine turn ended with ``done``."""
    if done.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if done.finish_reason == "cancelled":
        return "cancelled", response.cancel_reason or "client_cancelled"
    return "completed", None


def generation_request(response: Response, conversation: Conversation) -> GenerationRequest:
    """The engine turn that answers ``conversation`` with ``response``'s settings."""
    return GenerationRequest(
        conversation=dataclasses.replace(conversation, tools=response.tools, tool_choice=response.tool_choice),
        voice=response.voice,
        temperature=response.temperature,
        max_output_tokens=response.max_output_tokens,
        output_audio=response.modality == "audio",
    )


def apply_response_params(response: Response, params: ResponseCreateParams, *, max_chars: int) -> None:
    """``response.create``'s overrides of the session's settings, each checked (``ProtocolError``)."""
    if params.input is not None:
        raise ProtocolError(
            "invalid_value", "Responses always use the session's conversation; 'input' is not supported.",
            param="response.input",
        )
    modalities = params.output_modalities or params.modalities
    if modalities:
        response.modality = "audio" if "audio" in modalities else "text"
    voice = params.audio.output.voice if params.audio and params.audio.output else params.voice
    if voice is not None:
        response.voice = read_voice(voice, "response.audio.output.voice", response.voice)
    if params.temperature is not None:
        response.temperature = params.temperature
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in params.model_fields_set:
            response.max_output_tokens = read_max_output_tokens(getattr(params, key), f"response.{key}")
    if params.instructions is not None:
        response.instructions = checked_text(params.instructions, "response.instructions", max_chars=max_chars)
    if params.tools is not None:
        response.tools = read_tools(params.tools, "response.tools", max_chars=max_chars)
    if params.tool_choice is not None:
        response.tool_choice = read_tool_choice(params.tool_choice, "response.tool_choice")
    check_choice(response.tools, response.tool_choice, "response.tool_choice")
    response.metadata = params.metadata


def announce_events(response: Response, previous_item_id: str | None) -> list[ServerEvent]:
    """``response.created`` and the empty output item and part, once ``response.entry`` is set."""
    return [created_event(response), *message_events(response, previous_item_id)]


def created_event(response: Response) -> ServerEvent:
    response.announced = True
    return ResponseCreatedEvent(response=response.object("in_progress"))


def message_events(response: Response, previous_item_id: str | None) -> list[ServerEvent]:
    """The message item, empty, and its part, once ``response.entry`` is set."""
    entry = response.entry
    assert entry is not None
    index = response.output.index(entry)
    return [
        ResponseOutputItemAddedEvent(response_id=response.id, output_index=index, item=entry.item()),
        ConversationItemAddedEvent(previous_item_id=previous_item_id, item=entry.item()),
        ResponseContentPartAddedEvent(**response.content_ids(), part=response.part("")),
    ]


def delta_event(response: Response, text: str) -> ServerEvent:
    if response.modality == "audio":
        return ResponseOutputAudioTranscriptDeltaEvent(**response.content_ids(), delta=text)
    return ResponseOutputTextDeltaEvent(**response.content_ids(), delta=text)


def finish_events(
    response: Response,
    status: ResponseStatus,
    *,
    previous_item_id: str | None,
    reason: str | None = None,
    done: GenerationDone | None = None,
    error_code: str | None = None,
) -> list[ServerEvent]:
    """The events that close the response; marks its item completed or incomplete.

    A response cancelled before it was announced (``response.entry`` unset) gets its
    ``response.created`` here, so every ``response.done`` has one before it. Sets
    ``output_started``: work waiting for the answer's first output need wait no longer.
    """
    response.output_started.set()
    entry = response.entry
    events: list[ServerEvent] = []
    if not response.announced:
        events.append(created_event(response))
    if entry is not None:
        ids = response.content_ids()
        if response.modality == "audio":
            events.append(ResponseOutputAudioDoneEvent(**ids))
            events.append(ResponseOutputAudioTranscriptDoneEvent(**ids, transcript=entry.text))
        else:
            events.append(ResponseOutputTextDoneEvent(**ids, text=entry.text))
        events.append(ResponseContentPartDoneEvent(**ids, part=response.part(entry.text)))
        entry.status = "completed" if status == "completed" else "incomplete"
        index = response.output.index(entry)
        events.append(ResponseOutputItemDoneEvent(response_id=response.id, output_index=index, item=entry.item()))
        events.append(ConversationItemDoneEvent(previous_item_id=previous_item_id, item=entry.item()))
    details = None
    if status != "completed":
        details = StatusDetails(
            type=status,
            reason=reason,
            error=StatusError(type="server_error", code=error_code) if error_code else None,
        )
    elif response.call_problems:  # delivered as the model wrote them; the client should know
        details = StatusDetails(
            type="completed",
            error=StatusError(
                type="invalid_function_call", code="invalid_function_arguments",
                message="; ".join(response.call_problems),
            ),
        )
    events.append(
        ResponseDoneEvent(
            response=response.object(
                status,
                status_details=details,
                output=[item.item() for item in response.output],
                usage=response_usage(done.usage) if done is not None else None,
            ),
            latency=latency(response, done.timings if done is not None else None),
        )
    )
    return events


def response_usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        input_token_details=InputTokenDetails(
            text_tokens=usage.input_text_tokens,
            audio_tokens=usage.input_audio_tokens,
            image_tokens=usage.input_image_tokens,
        ),
        output_token_details=OutputTokenDetails(
            text_tokens=usage.output_text_tokens, audio_tokens=usage.output_audio_tokens
        ),
    )


def latency(response: Response, timings: GenerationTimings | None) -> ResponseLatency | None:
    """Where the time from end of speech to first audio went; None for a response without audio.

    First audio is the first frame handed to the transport when the output reported it (a paced
    WebRTC track), else the first chunk handed to the output. A speculative answer's engine time
    is split at the commit (``ResponseLatency``).
    """
    first_audio_at = response.first_audio_out_at
    if first_audio_at is None:
        return None
    to_first_audio_ms = response.silence_wait_ms + (first_audio_at - response.started_at) * 1000
    engine_ms = timings.first_audio * 1000 if timings is not None and timings.first_audio is not None else None
    hidden_ms = 0.0
    if response.speculation_started_at is not None and engine_ms is not None:
        hidden_ms = min(engine_ms, max(0.0, (response.started_at - response.speculation_started_at) * 1000))
        engine_ms -= hidden_ms
    return ResponseLatency(
        end_of_speech_to_first_audio_ms=round(to_first_audio_ms, 1),
        silence_wait_ms=round(response.silence_wait_ms, 1),
        engine_first_audio_ms=None if engine_ms is None else round(engine_ms, 1),
        queue_wait_ms=round(timings.queue_wait * 1000, 1) if timings is not None else 0.0,
        other_ms=round(to_first_audio_ms - response.silence_wait_ms - (engine_ms or 0.0), 1),
        speculative=response.speculation_started_at is not None,
        speculation_hidden_ms=round(hidden_ms, 1),
    )


def turn_report(response: Response, done_event: ResponseDoneEvent, done: GenerationDone | None, *,
                done_at: float) -> TurnReport:
    """``response`` as its ``response.done`` (``done_event``) tells it, with the times its latency came from."""
    entry = response.entry
    status, details = done_event.response.status, done_event.response.status_details
    return TurnReport(
        response_id=response.id,
        status=status,
        status_reason=details.reason if details is not None else None,
        error_code=details.error.code if status == "failed" and details is not None and details.error else None,
        output_audio=response.modality == "audio",
        temperature=response.temperature,
        max_output_tokens=response.max_output_tokens,
        started_at=response.started_at,
        silence_wait_ms=response.silence_wait_ms,
        engine_started_at=response.engine_started_at,
        timings=done.timings if done is not None else None,
        first_audio_at=response.first_audio_out_at,
        done_at=done_at,
        latency=done_event.latency,
        usage=done.usage if done is not None else None,
        finish_reason=done.finish_reason if done is not None else None,
        speculative=response.speculation_started_at is not None,
        tool_calls=tuple(
            ToolCallReport(
                item_id=call.id, call_id=call.call_id, name=call.name,
                started_at=response.calls_started_at.get(call.id, done_at),
                ended_at=response.calls_written_at.get(call.id, done_at),
                status="completed" if call.status == "completed" else "incomplete",
            )
            for call in response.calls
        ),
        audio_item_id=entry.id if entry is not None and entry.audio_samples > 0 else None,
    )


# ---- function_calls ----

def call_events(response: Response, event: FunctionCallEvent, history: History) -> list[ServerEvent]:
    """What a call event of the engine adds: a new call item, a piece of its arguments, or
    nothing yet (the call written whole is told when the response ends: ``close_calls``)."""
    if isinstance(event, FunctionCallStarted):
        call = FunctionCallEntry(new_id("item"), new_id("call"), event.name)
        response.output.append(call)
        response.calls_started_at[call.id] = time.monotonic()
        return call_added_events(response, call, history.append(call))
    call = response.calls[event.index]
    if isinstance(event, FunctionCallDelta):
        call.arguments += event.delta
        return [call_delta_event(response, call, event.delta)]
    call.arguments = event.arguments
    response.written[call.id] = event
    response.calls_written_at[call.id] = time.monotonic()
    return []


def check_arguments(response: Response) -> dict[str, str | None]:
    """Why each call the model wrote whole is not what its function takes (None: it is), by item
    id. The client's schema runs here, so a run calls this in a worker thread."""
    return {
        call.id: arguments_problem(response.tools, call.name, call.arguments)
        for call in response.calls
        if (written := response.written.get(call.id)) is not None and written.closed and written.well_formed
    }


def close_calls(
    response: Response, status: ResponseStatus, history: History, checked: Mapping[str, str | None]
) -> list[ServerEvent]:
    """Each call done as ``response`` ends with ``status``. A call the model wrote whole is
    completed unless the response was cancelled or failed; one it did not finish is incomplete
    (and never reaches a prompt). Arguments that are not what the function takes (``checked``:
    :func:`check_arguments`) are delivered as written, and ``response.done`` says so
    (``response.call_problems``)."""
    events: list[ServerEvent] = []
    for call in response.calls:
        written = response.written.get(call.id)
        made = written is not None and written.closed and status in ("completed", "incomplete")
        call.status = "completed" if made else "incomplete"
        if made and written is not None:
            problem = None if written.well_formed else 'the call is not {"name": …, "arguments": …}'
            if problem or (problem := checked.get(call.id)):
                response.call_problems.append(f"{call.call_id} ({call.name or 'no name'}): {problem}")
        events.extend(call_done_events(response, call, history.previous_id(call)))
    return events


def call_added_events(response: Response, call: FunctionCallEntry, previous_item_id: str | None) -> list[ServerEvent]:
    """A function call the model began (its name known, its arguments to come)."""
    index = response.output.index(call)
    return [
        ResponseOutputItemAddedEvent(response_id=response.id, output_index=index, item=call.item()),
        ConversationItemAddedEvent(previous_item_id=previous_item_id, item=call.item()),
    ]


def call_delta_event(response: Response, call: FunctionCallEntry, delta: str) -> ServerEvent:
    return ResponseFunctionCallArgumentsDeltaEvent(**response.call_ids(call), delta=delta)


def call_done_events(response: Response, call: FunctionCallEntry, previous_item_id: str | None) -> list[ServerEvent]:
    """A call written whole (``call.status`` completed) or cut off (incomplete: no arguments done)."""
    events: list[ServerEvent] = []
    if call.status == "completed":
        events.append(ResponseFunctionCallArgumentsDoneEvent(**response.call_ids(call), name=call.name,
                                                              arguments=call.arguments))
    index = response.output.index(call)
    events.append(ResponseOutputItemDoneEvent(response_id=response.id, output_index=index, item=call.item()))
    events.append(ConversationItemDoneEvent(previous_item_id=previous_item_id, item=call.item()))
    return events


# ---- response_run ----

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResponseContext:
    """What a response run works with: its session's id, engine, history and answer audio."""

    session_id: str
    engine: Engine
    history: History
    audio: AnswerAudio


class ResponseOwner(Protocol):
    """The session, as a response run reports to it."""

    @property
    def config(self) -> SessionConfig:
        """The session's settings now (``session.update`` may change them while a response runs)."""
        ...

    def emit(self, event: ServerEvent) -> None: ...

    def prune_history(self) -> None:
        """Keep the history within the session's limits (an item settled as heard)."""
        ...

    def release_speculation(self, speculation: Speculation) -> None: ...

    def response_done(self, run: ResponseRun, report: TurnReport) -> None:
        """``run`` has sent its ``response.done`` (``report`` tells it): the session forgets it as its
        current response, lets the audio settle and looks at speculation again."""
        ...

    def response_over(self, run: ResponseRun) -> None:
        """``run``'s task is over (done, cancelled or crashed): the session stops tracking it."""
        ...


class ResponseRun:
    """Runs ``response``; ``start`` starts its task, ``cancel`` and ``close`` end it."""

    def __init__(self, response: Response, context: ResponseContext, owner: ResponseOwner) -> None:
        self.response = response
        self._context = context
        self._owner = owner
        self._task: asyncio.Task[None] | None = None
        # Answer tokens and codec frames the engine decoded for it, as they streamed (a cancelled
        # turn's too): what it cost the engine beyond its prompt.
        self.decoded_steps = 0

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def cancelling(self) -> bool:
        return self.response.cancelling

    @property
    def task(self) -> asyncio.Task[None]:
        if self._task is None:
            raise RuntimeError(f"response {self.id} was never started")
        return self._task

    def start(self, previous: ResponseRun | None) -> None:
        """Starts the run; it waits for ``previous`` (one being cancelled) to send its ``response.done`` first."""
        self._task = asyncio.create_task(self._run(previous._task if previous is not None else None),
                                         name=f"response {self.id}")
        self._task.add_done_callback(self._on_task_done)

    def cancel(self, reason: str) -> asyncio.Task[None]:
        """Cancels the run (its ``response.done`` says ``reason``); its task, to await when the
        caller must see it end."""
        self.response.cancelling = True
        self.response.cancel_reason = reason
        self.task.cancel()
        return self.task

    async def close(self) -> None:
        """Cancels the task and awaits it; safe to call twice."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait({self._task})

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._owner.response_over(self)
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: %s crashed", self._context.session_id, task.get_name(), exc_info=task.exception())

    async def _run(self, previous: asyncio.Task[None] | None) -> None:
        response, context, owner = self.response, self._context, self._owner
        try:
            if previous is not None and not previous.done():
                await asyncio.wait({previous})  # a cancelled response first sends its response.done
            request = generation_request(response, context.history.conversation(response.instructions, owner.config.history))
            events = await self._engine_generation(request)
            self._announce()
            self._check_context()
            done: GenerationDone | None = None
            async with contextlib.aclosing(events) as turn:
                async for event in turn:
                    if isinstance(event, TextDelta):
                        self.decoded_steps += event.tokens
                        self._on_text(event)
                    elif isinstance(event, AudioChunk):
                        self.decoded_steps += event.frames
                        self._on_audio(event)
                    elif isinstance(event, FunctionCallEvent):
                        for server_event in call_events(response, event, context.history):
                            owner.emit(server_event)
                    elif isinstance(event, GenerationDone):
                        done = event
            if done is None:
                raise EngineError("The engine ended the turn without GenerationDone.", code="engine_protocol_error")
            checked = await asyncio.to_thread(check_arguments, response) if response.calls else {}
            await response.wait_first_frame()
            status, reason = ended_as(response, done)
            self._finish(status, reason=reason, done=done, checked=checked)
        except asyncio.CancelledError:
            self._finish("cancelled", reason=response.cancel_reason or "client_cancelled")
            raise
        except EngineError as exc:
            self._finish("failed", failure=(exc.code, str(exc)))
        except Exception as exc:
            self._finish("failed", failure=("server_error", exc))
        finally:
            if response.speculation is not None:  # used, or thrown away: the speculator awaits what is left
                owner.release_speculation(response.speculation)

    async def _engine_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        """The answer's engine turn: the speculative one taken at the commit when it answers
        ``request`` (its held events first), else a new one."""
        response = self.response
        held = await response.speculation.use(request) if response.speculation is not None else None
        if held is None:
            response.engine_started_at = time.monotonic()  # the turn is submitted at its first step, next
            return self._context.engine.run_generation(request)
        response.speculation_started_at = response.engine_started_at = held.started_at
        return held.events()

    def _check_context(self) -> None:
        """With truncation "disabled" nothing is dropped for tokens: past the budget a response fails."""
        config = self._owner.config
        limits = config.history
        tokens = self._context.history.prompt_tokens()
        if config.truncation.token_budget(limits) is None and tokens > limits.max_prompt_tokens:
            raise EngineError(f"the history holds {tokens} prompt tokens, past the {limits.max_prompt_tokens} "
                              "of its budget, and truncation is disabled", code="context_length_exceeded")

    def _announce(self) -> None:
        self._owner.emit(created_event(self.response))
        if not self.response.may_call:  # with tools, the message opens at its first text: there may be none
            self._open_message()

    def _open_message(self) -> AssistantEntry:
        response = self.response
        entry = response.entry
        if entry is None:
            entry = AssistantEntry(new_id("item"), response.modality)
            response.entry = entry
            previous_id = self._context.history.append(entry)
            for event in message_events(response, previous_id):
                self._owner.emit(event)
        return entry

    def _on_text(self, delta: TextDelta) -> None:
        if not delta.text:
            return
        self._open_message().add_delta(delta.text, tokens=delta.tokens)
        self._owner.emit(delta_event(self.response, delta.text))

    def _on_audio(self, chunk: AudioChunk) -> None:
        pcm = chunk.pcm
        if self.response.modality != "audio" or pcm.size == 0:
            return
        entry = self._open_message()
        self.response.audio_written(to_idle_paced_output=self._context.audio.idle_and_paced())
        entry.add_audio(pcm.size)
        self._context.audio.write(self.response.id, entry.id, pcm)

    def _finish(
        self,
        status: ResponseStatus,
        *,
        reason: str | None = None,
        done: GenerationDone | None = None,
        failure: tuple[FailureCode, BaseException | str] | None = None,
        checked: Mapping[str, str | None] | None = None,
    ) -> None:
        """Ends the response; a ``failure`` (its code, and its cause for the log) is told in an ``error`` event."""
        response, context, owner = self.response, self._context, self._owner
        for event in close_calls(response, status, context.history, checked or {}):
            owner.emit(event)
        if response.announced and not response.output:  # a plain answer has its item, even empty
            self._open_message()
        entry = response.entry
        previous_id = context.history.previous_id(entry) if entry is not None else None
        if entry is not None:  # its text ran ahead of its audio: only what is heard counts
            entry.ended_early = status in ("cancelled", "failed")
        events = finish_events(
            response, status, previous_item_id=previous_id, reason=reason, done=done,
            error_code=failure[0] if failure else None,
        )
        for event in events:
            owner.emit(event)
        done_event = events[-1]
        assert isinstance(done_event, ResponseDoneEvent)
        report = turn_report(response, done_event, done, done_at=time.monotonic())
        if failure is not None:
            code, cause = failure
            owner.emit(failure_event(code, cause, where=f"session {context.session_id}: response {response.id}"))
        if entry is not None:
            if entry.audio_samples == 0:  # nothing to hear: text-only, or cut before any audio
                entry.heard = entry.text if response.modality == "text" else ""
                owner.prune_history()
            else:
                context.audio.ledger.complete(entry.id)
        owner.response_done(self, report)

