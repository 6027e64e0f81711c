"""RealtimeSession: one conversation, transport-agnostic.

In: 16 kHz float32 PCM (``push_audio``) and client events as JSON text (``handle_message``).
Out: server events as JSON-ready dicts (``send``) and 24 kHz float32 PCM (``AudioOutput.write``).

The session hears utterances end (server VAD) or takes client commits, runs one engine turn per
response, streams the answer, and keeps the conversation *as the user heard it*: an assistant
item enters the history whole once its audio has been played out, and truncated in proportion
to what was played when it is cut off (barge-in, ``output_audio_buffer.clear``).

Turn detection modes (``audio.input.turn_detection``):
- ``interrupt_response: false`` (default, half-duplex): from the moment a response starts until
  its audio has played out, plus ``ECHO_TAIL_MS``, input audio is heard but not acted on, and
  speech still going on then is dropped when it ends: no second, overlapping turn.
- ``interrupt_response: true`` (barge-in): speech start cancels the response, clears the
  output (``output_audio_buffer.cleared``) and truncates the assistant item.
- ``null``: manual mode, ``input_audio_buffer.commit`` + ``response.create``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import soxr

from app.ledger import Playback, PlaybackLedger
from app.limits import EventGate
from app.protocol import (
    AudioFormat,
    ClientContentPart,
    ClientEvent,
    ContentPart,
    ConversationItemAddedEvent,
    ConversationItemCreateEvent,
    ConversationItemDeletedEvent,
    ConversationItemDeleteEvent,
    ConversationItemDoneEvent,
    ConversationItemTruncatedEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferAppendEvent,
    InputAudioBufferClearedEvent,
    InputAudioBufferClearEvent,
    InputAudioBufferCommitEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    InputAudioBufferTimeoutTriggeredEvent,
    InputAudioContent,
    InputTextContent,
    InputTokenDetails,
    ItemContent,
    MessageItem,
    OutputAudioBufferClearedEvent,
    OutputAudioBufferClearEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
    OutputAudioContent,
    OutputTextContent,
    OutputTokenDetails,
    ProtocolError,
    ResponseAudio,
    ResponseAudioOutput,
    ResponseCancelEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCreateEvent,
    ResponseDoneEvent,
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
    SessionCreatedEvent,
    SessionObject,
    SessionUpdatedEvent,
    SessionUpdateEvent,
    StatusDetails,
    StatusError,
    new_id,
    parse_client_event,
)
from app.session_config import (
    Modality,
    SessionConfig,
    TurnDetection,
    read_max_output_tokens,
    read_voice,
)
from media.turn_detection import (
    SpeechStarted,
    SpeechStopped,
    TurnDetectionParams,
    UtteranceCommitted,
    VoiceActivityDetector,
)
from media.vad import SileroVad
from pipeline.conversation import (
    INPUT_SAMPLE_RATE,
    AssistantText,
    Conversation,
    ConversationItem,
    UserAudio,
    UserText,
)
from pipeline.turn import (
    OUTPUT_SAMPLE_RATE,
    AudioChunk,
    Engine,
    EngineError,
    TextDelta,
    TurnDone,
    TurnRequest,
    TurnTimings,
    Usage,
    Voice,
)

logger = logging.getLogger(__name__)

PROTOCOL_AUDIO_RATE = 24_000  # OpenAI's audio/pcm: PCM16 mono at 24 kHz
SESSION_LIFETIME_S = 3_600  # expires_at in session objects, as OpenAI's 60-minute sessions
# After the assistant's audio has been sent, its tail is still in the browser's jitter buffer
# and speaker, and its echo reaches the microphone ~100-300 ms later; half-duplex keeps not
# listening for this long so that tail is not heard as the user.
ECHO_TAIL_MS = 400
MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than 100 ms of audio
# Manual mode keeps at most this much uncommitted input audio (the oldest is dropped).
MAX_MANUAL_BUFFER_MS = 60_000
# What an idle user "said" when idle_timeout_ms triggers a response: a second of silence.
IDLE_CLIP_MS = 1_000
# User items not yet answered (created without a response) kept before the oldest is dropped.
MAX_UNANSWERED_ITEMS = 16


class AudioOutput(Protocol):
    """Where the assistant's 24 kHz float32 audio goes; ``media.outbound.OutboundAudioTrack`` is one."""

    def write(self, pcm: np.ndarray) -> None: ...

    def clear(self) -> None: ...

    @property
    def played_samples(self) -> int: ...

    def set_listener(self, listener: Any) -> None: ...


# ---------------------------------------------------------------------------------------------
# Conversation entries and responses
# ---------------------------------------------------------------------------------------------


@dataclass
class _UserEntry:
    id: str
    parts: tuple[ConversationItem, ...]  # UserAudio / UserText, in content order
    content: list[ItemContent]

    def item(self) -> MessageItem:
        return MessageItem(id=self.id, status="completed", role="user", content=self.content)


@dataclass
class _AssistantEntry:
    id: str
    modality: Modality
    status: str = "in_progress"
    text: str = ""  # everything generated
    token_ends: list[int] = field(default_factory=list)  # end offset in ``text`` of each delta
    heard: str | None = None  # set once playback settled; None: the whole text (not cut so far)
    audio_samples: int = 0

    def add_delta(self, delta: str) -> None:
        self.text += delta
        self.token_ends.append(len(self.text))

    def history_text(self) -> str:
        return self.text if self.heard is None else self.heard

    def heard_text(self, heard_samples: int, total_samples: int) -> str:
        """The text heard when ``heard_samples`` of ``total_samples`` of its audio were played.

        The Talker consumes one Thinker token per 80 ms codec step, so cutting the tokens in
        proportion to the audio played is a sound first alignment.
        """
        if heard_samples >= total_samples:
            return self.text
        tokens = len(self.token_ends) * max(heard_samples, 0) // total_samples
        return self.text[: self.token_ends[tokens - 1]] if tokens else ""

    def content(self) -> list[ItemContent]:
        if self.status == "in_progress":
            return []
        if self.modality == "audio":
            return [OutputAudioContent(transcript=self.text)]
        return [OutputTextContent(text=self.text)]

    def item(self) -> MessageItem:
        return MessageItem(id=self.id, status=self.status, role="assistant", content=self.content())


_Entry = _UserEntry | _AssistantEntry


@dataclass
class _Response:
    id: str
    modality: Modality
    voice: Voice
    temperature: float
    max_output_tokens: int | None
    instructions: str | None
    metadata: dict[str, str] | None
    started_at: float  # monotonic: commit (VAD) or response.create
    silence_wait_ms: float = 0.0  # audio the VAD waited through before committing
    task: asyncio.Task[None] | None = None
    entry: _AssistantEntry | None = None  # set when response.created has been sent
    cancelling: bool = False
    cancel_reason: str | None = None
    first_audio_at: float | None = None

    def object(self, conversation_id: str, status: ResponseStatus, **fields: Any) -> ResponseObject:
        return ResponseObject(
            id=self.id,
            status=status,
            conversation_id=conversation_id,
            output_modalities=[self.modality],
            max_output_tokens="inf" if self.max_output_tokens is None else self.max_output_tokens,
            audio=ResponseAudio(output=ResponseAudioOutput(format=AudioFormat(), voice=self.voice)),
            metadata=self.metadata,
            **fields,
        )


def _vad_params(turn_detection: TurnDetection) -> TurnDetectionParams:
    return TurnDetectionParams(
        threshold=turn_detection.threshold,
        prefix_padding_ms=turn_detection.prefix_padding_ms,
        silence_duration_ms=turn_detection.silence_duration_ms,
    )


def _usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        input_token_details=InputTokenDetails(
            text_tokens=usage.input_text_tokens, audio_tokens=usage.input_audio_tokens
        ),
        output_token_details=OutputTokenDetails(
            text_tokens=usage.output_text_tokens, audio_tokens=usage.output_audio_tokens
        ),
    )


def decode_pcm16(data: str, param: str) -> np.ndarray:
    """Base64 PCM16 little-endian mono → float32 in [-1, 1); ``ProtocolError`` naming ``param``."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    if len(raw) % 2:
        raise ProtocolError("invalid_value", f"{param} is not whole PCM16 samples (odd byte count).", param=param)
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


# ---------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------


class RealtimeSession:
    """One conversation over the OpenAI Realtime protocol; see the module docstring."""

    def __init__(
        self,
        *,
        engine: Engine,
        vad: SileroVad,
        output: AudioOutput,
        send: Callable[[dict[str, Any]], None],
        config: SessionConfig | None = None,
        session_id: str | None = None,
    ) -> None:
        self._engine = engine
        self._output = output
        self._send = send
        self._config = config or SessionConfig()
        self._gate = EventGate(
            max_bytes=self._config.max_event_bytes,
            per_second=self._config.max_events_per_second,
            burst=self._config.max_event_burst,
        )
        self.session_id = session_id or new_id("sess")
        self._conversation_id = new_id("conv")
        self._expires_at = int(time.time()) + SESSION_LIFETIME_S
        self._detector = VoiceActivityDetector(vad, _vad_params(self._config.turn_detection or TurnDetection()))
        self._input_samples = 0  # 16 kHz samples pushed since the session started
        self._manual_chunks: deque[np.ndarray] = deque()  # manual mode's uncommitted input
        self._manual_samples = 0
        self._append_resampler: soxr.ResampleStream | None = None  # input_audio_buffer.append
        self._entries: list[_Entry] = []
        self._speech_item_id: str | None = None  # the user item announced by speech_started
        self._user_speaking = False  # between SpeechStarted and its commit
        # Half-duplex: input is not acted on while this is set (see ECHO_TAIL_MS).
        self._deaf = False
        self._deaf_until_sample: int | None = None  # when listening may resume, once idle
        self._idle_since_sample: int | None = None  # the assistant's audio ended here (idle_timeout_ms)
        self._response: _Response | None = None  # generating, or queued behind a cancelling one
        self._tasks: set[asyncio.Task[None]] = set()
        self._ledger = PlaybackLedger()
        self._speaking_response_id: str | None = None  # output_audio_buffer.started sent
        self._last_response_id: str | None = None
        self._clearing = False  # inside output.clear(), whose stop callback is not a drain
        self._closed = False
        self._close_lock = asyncio.Lock()
        output.set_listener(self)

    # -- public API ------------------------------------------------------------------------

    @property
    def config(self) -> SessionConfig:
        return self._config

    async def start(self) -> None:
        """Announce the session: ``session.created`` with the full effective session."""
        self._emit(SessionCreatedEvent(session=self._session_object()))

    async def handle_message(self, raw: str | bytes) -> None:
        """Handle one client event (JSON text); every mistake is answered with an ``error``."""
        if self._closed:
            return
        rejection = self._gate.admit(raw)  # before parsing: a flood or a huge event costs nothing
        if rejection is not None:
            self._emit(ProtocolError(rejection.code, rejection.message).to_event())
            return
        event_id: str | None = None
        try:
            event = parse_client_event(raw)
            event_id = event.event_id
            await self._dispatch(event)
        except ProtocolError as exc:
            self._emit(exc.to_event() if exc.event_id else exc.for_event(event_id).to_event())
        except Exception as exc:  # a bug of ours: the client hears of it, the session goes on
            logger.exception("session %s: handling a client event failed", self.session_id)
            error = ProtocolError("server_error", f"{type(exc).__name__}: {exc}", event_id=event_id, type="server_error")
            self._emit(error.to_event())

    def push_audio(self, pcm: np.ndarray) -> None:
        """16 kHz float32 mono input (from the inbound track); runs the VAD inline, never awaits."""
        if self._closed:
            return
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if pcm.size == 0:
            return
        self._input_samples += pcm.size
        turn_detection = self._config.turn_detection
        if turn_detection is None:
            self._buffer_manual(pcm)
            return
        for event in self._detector.push(pcm):
            if isinstance(event, SpeechStarted):
                self._on_speech_started(event, turn_detection)
            elif isinstance(event, SpeechStopped):
                self._on_speech_stopped(event)
            elif isinstance(event, UtteranceCommitted):
                self._on_utterance_committed(event, turn_detection)
        self._maybe_listen_again()
        self._maybe_time_out(turn_detection)

    async def close(self) -> None:
        """Cancel the running response and await every task; safe to call twice."""
        async with self._close_lock:
            self._closed = True
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)

    def stats(self) -> dict[str, int]:
        """Sizes of the per-session structures (metrics; tests check they stay bounded)."""
        return {
            "items": len(self._entries),
            "audio_clips": sum(
                isinstance(part, UserAudio) for e in self._entries if isinstance(e, _UserEntry) for part in e.parts
            ),
            "playbacks": len(self._ledger),
            "tasks": len(self._tasks),
            "manual_buffer_samples": self._manual_samples,
            "responses": int(self._response is not None),
        }

    # -- AudioOutput listener --------------------------------------------------------------

    def on_playback_started(self) -> None:
        if self._closed or self._speaking_response_id is not None:
            return
        playback = self._ledger.oldest()
        if playback is not None:
            self._speaking_response_id = playback.response_id
            self._emit(OutputAudioBufferStartedEvent(response_id=playback.response_id))

    def on_playback_stopped(self) -> None:
        if self._closed or self._clearing:
            return  # a clear is accounted for by _clear_output itself
        self._ledger.drained(self._output.played_samples)
        self._settle_playback()

    # -- client events ---------------------------------------------------------------------

    async def _dispatch(self, event: ClientEvent) -> None:
        if isinstance(event, SessionUpdateEvent):
            self._update_session(event)
        elif isinstance(event, InputAudioBufferAppendEvent):
            self._append_audio(event)
        elif isinstance(event, InputAudioBufferCommitEvent):
            self._commit_manual()
        elif isinstance(event, InputAudioBufferClearEvent):
            self._clear_input()
        elif isinstance(event, ConversationItemCreateEvent):
            self._create_item(event)
        elif isinstance(event, ConversationItemDeleteEvent):
            self._delete_item(event)
        elif isinstance(event, ConversationItemTruncateEvent):
            self._truncate_item(event)
        elif isinstance(event, ResponseCreateEvent):
            self._create_response(event)
        elif isinstance(event, ResponseCancelEvent):
            await self._cancel_response(event)
        elif isinstance(event, OutputAudioBufferClearEvent):
            await self._clear_output_by_client()

    def _update_session(self, event: SessionUpdateEvent) -> None:
        old = self._config
        new = old.updated(event.session)
        self._config = new
        if new.turn_detection != old.turn_detection:
            if new.turn_detection is None:
                self._detector.reset()
                self._speech_item_id = None
                self._user_speaking = False
            else:
                self._detector.update(_vad_params(new.turn_detection))
                if old.turn_detection is None:  # manual audio is not the VAD's business
                    self._drop_manual_buffer()
            if new.turn_detection is None or new.turn_detection.interrupt_response:
                self._deaf = False
                self._deaf_until_sample = None
        self._emit(SessionUpdatedEvent(session=self._session_object()))

    def _append_audio(self, event: InputAudioBufferAppendEvent) -> None:
        if self._config.input_audio_format != "audio/pcm":
            raise ProtocolError(
                "invalid_value",
                "Base64 audio must be audio/pcm (PCM16, 24 kHz); set audio.input.format accordingly.",
                param="audio",
            )
        pcm24 = decode_pcm16(event.audio, "audio")
        if self._append_resampler is None:
            self._append_resampler = soxr.ResampleStream(PROTOCOL_AUDIO_RATE, INPUT_SAMPLE_RATE, 1, dtype="float32")
        self.push_audio(self._append_resampler.resample_chunk(pcm24))

    def _buffer_manual(self, pcm: np.ndarray) -> None:
        self._manual_chunks.append(pcm)
        self._manual_samples += pcm.size
        limit = MAX_MANUAL_BUFFER_MS * INPUT_SAMPLE_RATE // 1000
        while self._manual_samples - self._manual_chunks[0].size >= limit:
            self._manual_samples -= self._manual_chunks.popleft().size

    def _drop_manual_buffer(self) -> None:
        self._manual_chunks.clear()
        self._manual_samples = 0

    def _commit_manual(self) -> None:
        if self._config.turn_detection is not None:
            raise ProtocolError(
                "turn_detection_enabled",
                "Server VAD commits by itself; set audio.input.turn_detection to null to commit manually.",
            )
        if self._manual_samples < MIN_COMMIT_MS * INPUT_SAMPLE_RATE // 1000:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                f"Buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, "
                f"got {self._manual_samples * 1000 // INPUT_SAMPLE_RATE} ms.",
            )
        pcm = np.concatenate(self._manual_chunks)
        self._drop_manual_buffer()
        self._commit_user_audio(new_id("item"), pcm)

    def _clear_input(self) -> None:
        self._drop_manual_buffer()
        self._detector.reset()
        self._speech_item_id = None
        self._user_speaking = False
        self._emit(InputAudioBufferClearedEvent())

    def _create_item(self, event: ConversationItemCreateEvent) -> None:
        item = event.item
        if item.id is not None and self._find(item.id) is not None:
            raise ProtocolError("invalid_value", f"An item with id {item.id!r} already exists.", param="item.id")
        position = self._insert_position(event.previous_item_id)
        if not item.content:
            raise ProtocolError("invalid_value", "A message needs at least one content part.", param="item.content")
        item_id = item.id or new_id("item")
        entry: _Entry
        if item.role == "user":
            parts, content = self._user_content(item.content)
            entry = _UserEntry(item_id, parts, content)
        elif item.role == "assistant":
            entry = self._assistant_item(item_id, item.content)
        else:
            raise ProtocolError(
                "invalid_value",
                "System messages are not supported; set the system prompt with session.update instructions.",
                param="item.role",
            )
        previous_id = self._entries[position - 1].id if position > 0 else None
        self._entries.insert(position, entry)
        self._emit(ConversationItemAddedEvent(previous_item_id=previous_id, item=entry.item()))
        self._emit(ConversationItemDoneEvent(previous_item_id=previous_id, item=entry.item()))
        self._prune()

    def _insert_position(self, previous_item_id: str | None) -> int:
        if previous_item_id is None:
            return len(self._entries)
        if previous_item_id == "root":
            return 0
        for index, entry in enumerate(self._entries):
            if entry.id == previous_item_id:
                return index + 1
        raise ProtocolError(
            "item_not_found", f"No item with id {previous_item_id!r}.", param="previous_item_id"
        )

    def _user_content(
        self, content: list[ClientContentPart]
    ) -> tuple[tuple[ConversationItem, ...], list[ItemContent]]:
        parts: list[ConversationItem] = []
        echoed: list[ItemContent] = []
        for index, part in enumerate(content):
            param = f"item.content[{index}]"
            if part.type == "input_text":
                text = self._checked_text(part.text, f"{param}.text")
                parts.append(UserText(text))
                echoed.append(InputTextContent(text=text))
            elif part.type == "input_audio":
                if part.audio is None:
                    raise ProtocolError("missing_required_parameter", f"{param}.audio is required.",
                                        param=f"{param}.audio")
                if self._config.input_audio_format != "audio/pcm":
                    raise ProtocolError(
                        "invalid_value", "Base64 audio must be audio/pcm (PCM16, 24 kHz).", param=f"{param}.audio"
                    )
                pcm24 = decode_pcm16(part.audio, f"{param}.audio")
                if pcm24.size < MIN_COMMIT_MS * PROTOCOL_AUDIO_RATE // 1000:
                    raise ProtocolError("invalid_value", f"{param}.audio holds less than {MIN_COMMIT_MS} ms.",
                                        param=f"{param}.audio")
                pcm16 = soxr.resample(pcm24, PROTOCOL_AUDIO_RATE, INPUT_SAMPLE_RATE).astype(np.float32)
                parts.append(UserAudio(pcm16))
                echoed.append(InputAudioContent(transcript=part.transcript))
            else:
                raise ProtocolError(
                    "invalid_value", f"A user message takes input_text or input_audio, not {part.type}.",
                    param=f"{param}.type",
                )
        return tuple(parts), echoed

    def _assistant_item(self, item_id: str, content: list[ClientContentPart]) -> _AssistantEntry:
        if len(content) != 1:
            raise ProtocolError("invalid_value", "An assistant message takes exactly one content part.",
                                param="item.content")
        part = content[0]
        if part.type in ("output_text", "text"):
            modality: Modality = "text"
            text = part.text
        else:
            if part.type not in ("output_audio", "audio"):
                raise ProtocolError("invalid_value", f"An assistant message takes output_text or output_audio, "
                                    f"not {part.type}.", param="item.content[0].type")
            modality = "audio"
            text = part.transcript
        text = self._checked_text(text, "item.content[0].text" if modality == "text" else "item.content[0].transcript")
        entry = _AssistantEntry(item_id, modality, status="completed", heard=text)
        entry.add_delta(text)
        return entry

    def _checked_text(self, text: str | None, param: str) -> str:
        if text is None:
            raise ProtocolError("missing_required_parameter", f"{param} is required.", param=param)
        if len(text) > self._config.max_text_chars:
            raise ProtocolError(
                "invalid_value", f"{param} is longer than {self._config.max_text_chars} characters.", param=param
            )
        return text

    def _delete_item(self, event: ConversationItemDeleteEvent) -> None:
        entry = self._require_item(event.item_id)
        if self._response is not None and self._response.entry is entry:
            raise ProtocolError(
                "invalid_value", "The item belongs to the response in progress; cancel it first.", param="item_id"
            )
        self._entries.remove(entry)
        self._emit(ConversationItemDeletedEvent(item_id=entry.id))

    def _truncate_item(self, event: ConversationItemTruncateEvent) -> None:
        entry = self._require_item(event.item_id)
        if not isinstance(entry, _AssistantEntry) or entry.modality != "audio" or entry.status == "in_progress":
            raise ProtocolError(
                "invalid_value", "Only a finished assistant audio item can be truncated.", param="item_id"
            )
        if event.content_index != 0:
            raise ProtocolError("invalid_value", "An assistant item has one content part (index 0).",
                                param="content_index")
        samples = event.audio_end_ms * OUTPUT_SAMPLE_RATE // 1000
        if samples > entry.audio_samples:
            raise ProtocolError(
                "invalid_value",
                f"audio_end_ms {event.audio_end_ms} is past the item's audio "
                f"({entry.audio_samples * 1000 // OUTPUT_SAMPLE_RATE} ms).",
                param="audio_end_ms",
            )
        playback = self._ledger.get(entry.id)
        if playback is not None:  # still playing: what is heard later stays within the cut
            playback.limit = samples if playback.limit is None else min(playback.limit, samples)
        entry.heard = entry.heard_text(samples, entry.audio_samples)
        self._emit(ConversationItemTruncatedEvent(item_id=entry.id, content_index=0, audio_end_ms=event.audio_end_ms))

    def _create_response(self, event: ResponseCreateEvent) -> None:
        if self._response is not None and not self._response.cancelling:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self._response.id}. "
                "Wait until the response is finished before creating a new one.",
            )
        response = self._session_response(time.monotonic())
        params = event.response
        if params is not None:
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
                response.instructions = self._checked_text(params.instructions, "response.instructions")
            response.metadata = params.metadata
        self._start_response(response)

    async def _cancel_response(self, event: ResponseCancelEvent) -> None:
        response = self._response
        if response is None or response.cancelling or (event.response_id not in (None, response.id)):
            raise ProtocolError(
                "response_cancel_not_active",
                "Cancellation failed: no active response found"
                + (f" with id {event.response_id!r}." if event.response_id else "."),
            )
        self._request_cancel(response, "client_cancelled")
        assert response.task is not None
        await asyncio.wait({response.task})

    async def _clear_output_by_client(self) -> None:
        # OpenAI: clearing the output also stops generating the response whose audio it is.
        response = self._response
        if response is not None and not response.cancelling:
            self._request_cancel(response, "client_cancelled")
            assert response.task is not None
            await asyncio.wait({response.task})
        self._clear_output(always_announce=True)

    # -- server VAD ------------------------------------------------------------------------

    def _on_speech_started(self, event: SpeechStarted, turn_detection: TurnDetection) -> None:
        self._user_speaking = True
        self._idle_since_sample = None
        if self._deaf:
            return
        self._speech_item_id = new_id("item")
        self._emit(InputAudioBufferSpeechStartedEvent(audio_start_ms=event.audio_start_ms, item_id=self._speech_item_id))
        if turn_detection.interrupt_response and self._busy():
            self._interrupt()

    def _on_speech_stopped(self, event: SpeechStopped) -> None:
        if self._deaf:
            return
        if self._speech_item_id is None:
            self._speech_item_id = new_id("item")
        self._emit(InputAudioBufferSpeechStoppedEvent(audio_end_ms=event.audio_end_ms, item_id=self._speech_item_id))

    def _on_utterance_committed(self, event: UtteranceCommitted, turn_detection: TurnDetection) -> None:
        self._user_speaking = False
        if self._deaf:
            return
        committed_at = time.monotonic()
        item_id = self._speech_item_id or new_id("item")
        self._speech_item_id = None
        self._commit_user_audio(item_id, event.pcm)
        if not turn_detection.create_response:
            return
        if self._response is not None and not self._response.cancelling:
            logger.info("session %s: utterance %s committed while %s is responding; not answering it",
                        self.session_id, item_id, self._response.id)
            return
        # The VAD committed when the silence wait ended: the input stream is there now (give or
        # take the rest of this chunk, <= 20 ms from WebRTC).
        silence_wait_ms = 0.0 if event.forced else float(turn_detection.silence_duration_ms)
        self._start_response(self._session_response(committed_at, silence_wait_ms))

    def _session_response(self, started_at: float, silence_wait_ms: float = 0.0) -> _Response:
        """A response the server starts by itself, with the session's settings."""
        config = self._config
        return _Response(
            id=new_id("resp"),
            modality=config.output_modality,
            voice=config.voice,
            temperature=config.temperature,
            max_output_tokens=config.max_output_tokens,
            instructions=config.instructions,
            metadata=None,
            started_at=started_at,
            silence_wait_ms=silence_wait_ms,
        )

    def _maybe_time_out(self, turn_detection: TurnDetection) -> None:
        """idle_timeout_ms: no speech for that long after the assistant's audio ended prompts a response.

        Time is counted in input audio (WebRTC delivers 20 ms frames even from a muted mic), so
        it needs no timer task and is exact in tests.
        """
        timeout_ms = turn_detection.idle_timeout_ms
        idle_since = self._idle_since_sample
        if timeout_ms is None or idle_since is None or self._busy() or self._user_speaking:
            return
        if self._input_samples - idle_since < timeout_ms * INPUT_SAMPLE_RATE // 1000:
            return
        self._idle_since_sample = None
        item_id = new_id("item")
        self._emit(
            InputAudioBufferTimeoutTriggeredEvent(
                audio_start_ms=idle_since * 1000 // INPUT_SAMPLE_RATE,
                audio_end_ms=self._input_samples * 1000 // INPUT_SAMPLE_RATE,
                item_id=item_id,
            )
        )
        self._commit_user_audio(item_id, np.zeros(IDLE_CLIP_MS * INPUT_SAMPLE_RATE // 1000, dtype=np.float32))
        if turn_detection.create_response and self._response is None:
            self._start_response(self._session_response(time.monotonic()))

    def _commit_user_audio(self, item_id: str, pcm: np.ndarray) -> None:
        previous_id = self._entries[-1].id if self._entries else None
        entry = _UserEntry(item_id, (UserAudio(pcm),), [InputAudioContent()])
        self._entries.append(entry)
        self._emit(InputAudioBufferCommittedEvent(item_id=item_id, previous_item_id=previous_id))
        self._emit(ConversationItemAddedEvent(previous_item_id=previous_id, item=entry.item()))
        self._emit(ConversationItemDoneEvent(previous_item_id=previous_id, item=entry.item()))
        self._prune()

    # -- half-duplex -----------------------------------------------------------------------

    def _busy(self) -> bool:
        """The assistant is answering or its audio has not finished playing."""
        return self._response is not None or len(self._ledger) > 0

    def _maybe_listen_again(self) -> None:
        if (
            self._deaf
            and self._deaf_until_sample is not None
            and self._input_samples >= self._deaf_until_sample
            and not self._user_speaking
        ):
            # Whatever the VAD holds now began while the assistant spoke (or is its echo).
            self._detector.reset()
            self._speech_item_id = None
            self._deaf = False
            self._deaf_until_sample = None

    def _on_idle(self) -> None:
        """The assistant has finished speaking (or answering without audio)."""
        self._idle_since_sample = self._input_samples
        if self._deaf:
            self._deaf_until_sample = self._input_samples + ECHO_TAIL_MS * INPUT_SAMPLE_RATE // 1000

    # -- responses -------------------------------------------------------------------------

    def _start_response(self, response: _Response) -> None:
        previous = self._response.task if self._response is not None else None
        self._response = response
        self._last_response_id = response.id
        self._idle_since_sample = None
        turn_detection = self._config.turn_detection
        if turn_detection is not None and not turn_detection.interrupt_response:
            self._deaf = True
            self._deaf_until_sample = None
        task = asyncio.create_task(self._run_response(response, previous), name=f"response {response.id}")
        response.task = task
        self._tasks.add(task)
        task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: %s crashed", self.session_id, task.get_name(), exc_info=task.exception())

    def _request_cancel(self, response: _Response, reason: str) -> None:
        response.cancelling = True
        response.cancel_reason = reason
        assert response.task is not None
        response.task.cancel()

    async def _run_response(self, response: _Response, previous: asyncio.Task[None] | None) -> None:
        try:
            if previous is not None and not previous.done():
                await asyncio.wait({previous})  # a cancelled response first sends its response.done
            request = TurnRequest(
                conversation=self._conversation(response.instructions),
                voice=response.voice,
                temperature=response.temperature,
                max_output_tokens=response.max_output_tokens,
                output_audio=response.modality == "audio",
            )
            self._announce_response(response)
            done: TurnDone | None = None
            async with contextlib.aclosing(self._engine.run_turn(request)) as turn:  # type: ignore[type-var]
                async for event in turn:
                    if isinstance(event, TextDelta):
                        self._on_text(response, event.text)
                    elif isinstance(event, AudioChunk):
                        self._on_audio(response, event.pcm)
                    elif isinstance(event, TurnDone):
                        done = event
            if done is None:
                raise EngineError("The engine ended the turn without TurnDone.", code="engine_protocol_error")
            if done.finish_reason == "length":
                self._finish_response(response, "incomplete", reason="max_output_tokens", done=done)
            elif done.finish_reason == "cancelled":
                self._finish_response(response, "cancelled", reason=response.cancel_reason or "client_cancelled",
                                      done=done)
            else:
                self._finish_response(response, "completed", done=done)
        except asyncio.CancelledError:
            self._finish_response(response, "cancelled", reason=response.cancel_reason or "client_cancelled")
            raise
        except EngineError as exc:
            logger.warning("session %s: response %s failed in the engine: %s", self.session_id, response.id, exc)
            self._finish_response(response, "failed", error=(exc.code, str(exc)))
        except Exception as exc:
            logger.exception("session %s: response %s failed", self.session_id, response.id)
            self._finish_response(response, "failed", error=("server_error", f"{type(exc).__name__}: {exc}"))

    def _announce_response(self, response: _Response) -> None:
        entry = _AssistantEntry(new_id("item"), response.modality)
        response.entry = entry
        previous_id = self._entries[-1].id if self._entries else None
        self._entries.append(entry)
        self._emit(ResponseCreatedEvent(response=self._response_object(response, "in_progress")))
        self._emit(ResponseOutputItemAddedEvent(response_id=response.id, output_index=0, item=entry.item()))
        self._emit(ConversationItemAddedEvent(previous_item_id=previous_id, item=entry.item()))
        self._emit(ResponseContentPartAddedEvent(**self._content_ids(response), part=self._part(response, "")))

    def _content_ids(self, response: _Response) -> dict[str, Any]:
        assert response.entry is not None
        return {"response_id": response.id, "item_id": response.entry.id, "output_index": 0, "content_index": 0}

    @staticmethod
    def _part(response: _Response, text: str) -> ContentPart:
        if response.modality == "audio":
            return ContentPart(type="audio", transcript=text)
        return ContentPart(type="text", text=text)

    def _on_text(self, response: _Response, text: str) -> None:
        if not text or response.entry is None:
            return
        response.entry.add_delta(text)
        if response.modality == "audio":
            self._emit(ResponseOutputAudioTranscriptDeltaEvent(**self._content_ids(response), delta=text))
        else:
            self._emit(ResponseOutputTextDeltaEvent(**self._content_ids(response), delta=text))

    def _on_audio(self, response: _Response, pcm: np.ndarray) -> None:
        if response.modality != "audio" or response.entry is None or pcm.size == 0:
            return
        if response.first_audio_at is None:
            response.first_audio_at = time.monotonic()
        response.entry.audio_samples += pcm.size
        self._ledger.write(response.entry.id, response.id, pcm.size, self._output.played_samples)
        self._output.write(pcm)

    def _finish_response(
        self,
        response: _Response,
        status: ResponseStatus,
        *,
        reason: str | None = None,
        done: TurnDone | None = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        entry = response.entry
        if entry is None:  # never started (cancelled while queued): announce it to close it
            self._emit(ResponseCreatedEvent(response=self._response_object(response, "in_progress")))
        else:
            ids = self._content_ids(response)
            if response.modality == "audio":
                self._emit(ResponseOutputAudioDoneEvent(**ids))
                self._emit(ResponseOutputAudioTranscriptDoneEvent(**ids, transcript=entry.text))
            else:
                self._emit(ResponseOutputTextDoneEvent(**ids, text=entry.text))
            self._emit(ResponseContentPartDoneEvent(**ids, part=self._part(response, entry.text)))
            entry.status = "completed" if status == "completed" else "incomplete"
            self._emit(ResponseOutputItemDoneEvent(response_id=response.id, output_index=0, item=entry.item()))
            previous_id = self._previous_id(entry)
            self._emit(ConversationItemDoneEvent(previous_item_id=previous_id, item=entry.item()))
        details = None
        if status != "completed":
            details = StatusDetails(
                type=status,
                reason=reason,  # type: ignore[arg-type]
                error=StatusError(type="server_error", code=error[0]) if error else None,
            )
        self._emit(
            ResponseDoneEvent(
                response=self._response_object(
                    response,
                    status,
                    status_details=details,
                    output=[entry.item()] if entry is not None else [],
                    usage=_usage(done.usage) if done is not None else None,
                ),
                latency=self._latency(response, done.timings if done is not None else None),
            )
        )
        if error is not None:
            self._emit(ProtocolError(error[0], error[1], type="server_error").to_event())
        if entry is not None:
            if entry.audio_samples == 0:  # nothing to hear: text-only, or cut before any audio
                entry.heard = entry.text if response.modality == "text" else ""
                self._prune()
            else:
                self._ledger.complete(entry.id)
        if self._response is response:
            self._response = None
        self._settle_playback()

    def _latency(self, response: _Response, timings: TurnTimings | None) -> ResponseLatency | None:
        if response.first_audio_at is None:
            return None
        to_first_audio_ms = response.silence_wait_ms + (response.first_audio_at - response.started_at) * 1000
        engine_ms = timings.first_audio * 1000 if timings is not None and timings.first_audio is not None else None
        return ResponseLatency(
            end_of_speech_to_first_audio_ms=round(to_first_audio_ms, 1),
            silence_wait_ms=round(response.silence_wait_ms, 1),
            engine_first_audio_ms=None if engine_ms is None else round(engine_ms, 1),
            queue_wait_ms=round(timings.queue_wait * 1000, 1) if timings is not None else 0.0,
            other_ms=round(to_first_audio_ms - response.silence_wait_ms - (engine_ms or 0.0), 1),
        )

    # -- playback --------------------------------------------------------------------------

    def _settle_playback(self) -> None:
        """Retire items whose audio has played out; announce when the assistant stopped speaking."""
        played = self._output.played_samples
        finished = self._ledger.pop_finished(played)
        for playback in finished:
            self._settle_item(playback, played)
        if len(self._ledger) == 0:
            if self._speaking_response_id is not None:
                response_id = finished[-1].response_id if finished else self._speaking_response_id
                self._speaking_response_id = None
                self._emit(OutputAudioBufferStoppedEvent(response_id=response_id))
            if self._response is None:
                self._on_idle()
        if finished:
            self._prune()

    def _settle_item(self, playback: Playback, played: int) -> bool:
        """Put what was heard of the item into the history; True when it was cut short."""
        entry = self._find(playback.item_id)
        if not isinstance(entry, _AssistantEntry):
            return False  # deleted by the client meanwhile
        heard = playback.heard(played)
        cut_short = heard < playback.written
        if entry.heard is None or cut_short:
            entry.heard = entry.heard_text(heard, playback.written)
        return cut_short

    def _interrupt(self) -> None:
        """Barge-in: the user started speaking over the assistant."""
        response = self._response
        if response is not None and not response.cancelling:
            self._request_cancel(response, "turn_detected")
        self._clear_output(always_announce=False)

    def _clear_output(self, *, always_announce: bool) -> None:
        """Drop unplayed audio; items keep what was heard (``conversation.item.truncated``)."""
        had_audio = len(self._ledger) > 0
        self._clearing = True
        try:
            self._output.clear()
        finally:
            self._clearing = False
        played = self._output.played_samples
        cut = self._ledger.cut(played)
        response_id = cut[0].response_id if cut else self._last_response_id
        if (had_audio or always_announce) and response_id is not None:
            self._emit(OutputAudioBufferClearedEvent(response_id=response_id))
        self._speaking_response_id = None
        for playback in cut:
            if self._settle_item(playback, played):
                self._emit(
                    ConversationItemTruncatedEvent(
                        item_id=playback.item_id,
                        content_index=0,
                        audio_end_ms=playback.heard(played) * 1000 // OUTPUT_SAMPLE_RATE,
                    )
                )
        if cut:
            self._prune()
        if self._response is None:
            self._on_idle()

    # -- history ---------------------------------------------------------------------------

    def _conversation(self, instructions: str | None) -> Conversation:
        items: list[ConversationItem] = []
        for entry in self._entries:
            if isinstance(entry, _UserEntry):
                items.extend(entry.parts)
            elif entry.status != "in_progress" and (text := entry.history_text()):
                items.append(AssistantText(text))  # nothing heard: as if it had not been said
        return Conversation(items=tuple(items), instructions=instructions, limits=self._config.history)

    def _prune(self) -> None:
        """Keep whole turns, newest first, while the history limits hold (as the prompt renderer
        bounds them), and at most ``MAX_UNANSWERED_ITEMS`` unanswered user items."""
        limits = self._config.history
        turns: list[list[_Entry]] = []
        pending: list[_Entry] = []
        for entry in self._entries:
            pending.append(entry)
            if isinstance(entry, _AssistantEntry):
                turns.append(pending)
                pending = []
        kept: list[list[_Entry]] = []
        clips = 0
        seconds = 0.0
        for turn in reversed(turns):
            audio = [p for e in turn if isinstance(e, _UserEntry) for p in e.parts if isinstance(p, UserAudio)]
            clips += len(audio)
            seconds += sum(clip.seconds for clip in audio)
            in_progress = any(isinstance(e, _AssistantEntry) and e.status == "in_progress" for e in turn)
            if not in_progress and (
                len(kept) >= limits.max_turns or clips > limits.max_audio_clips or seconds > limits.max_audio_seconds
            ):
                break
            kept.append(turn)
        pending = pending[-MAX_UNANSWERED_ITEMS:]
        entries = [entry for turn in reversed(kept) for entry in turn] + pending
        if len(entries) != len(self._entries):
            self._entries = entries

    # -- helpers ---------------------------------------------------------------------------

    def _find(self, item_id: str) -> _Entry | None:
        return next((entry for entry in self._entries if entry.id == item_id), None)

    def _require_item(self, item_id: str) -> _Entry:
        entry = self._find(item_id)
        if entry is None:
            raise ProtocolError("item_not_found", f"Item with item_id not found: {item_id}.", param="item_id")
        return entry

    def _previous_id(self, entry: _Entry) -> str | None:
        for index, candidate in enumerate(self._entries):
            if candidate is entry:
                return self._entries[index - 1].id if index > 0 else None
        return None

    def _session_object(self) -> SessionObject:
        return self._config.to_session_object(
            session_id=self.session_id, model=self._engine.name, expires_at=self._expires_at
        )

    def _response_object(self, response: _Response, status: ResponseStatus, **fields: Any) -> ResponseObject:
        return response.object(self._conversation_id, status, **fields)

    def _emit(self, event: Any) -> None:
        if not self._closed:
            self._send(event.to_json())
