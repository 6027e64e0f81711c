"""The effective session: what ``session.update`` may change, read tolerantly, applied atomically.

:class:`SessionConfig` reads GA nesting and the older flat beta keys, ignores what does not
apply, maps what has a sensible meaning (``semantic_vad`` eagerness, OpenAI voice names) and
rejects only values that are wrong; one bad value rejects the whole update. The session is
then fitted to what its engine can do (:func:`first_config`, :func:`fitted`, the ``check_*``
functions: refused, or turned off) and its system message held to its token budget
(:func:`check_session`, :func:`check_system_budget`: ``--instructions-max-tokens``, 16,000 by
default, counted in a worker thread past what the bytes alone allow). docs/SESSION.md
"Tolerant reader" and "What the engine can do".
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from app.realtime.gate import MAX_EVENT_BURST, MAX_EVENTS_PER_SECOND
from app.realtime.protocol import (
    AudioFormat,
    ClientItem,
    ClientMessageItem,
    NoiseReductionObject,
    ProtocolError,
    RetentionRatioTruncation,
    SemanticVadObject,
    ServerVadObject,
    SessionAudio,
    SessionAudioInput,
    SessionAudioOutput,
    SessionObject,
    SessionRecording,
    SessionVideo,
    TokenLimits,
    TranscriptionObject,
    invalid_value,
)
from app.realtime.tools import check_choice, choice_object, read_tool_choice, read_tools, tool_objects
from media.noise_suppression import NoiseReduction
from media.speech_level import LevelRules
from pipeline.contract import DEFAULT_TEMPERATURE, VOICES, EngineCapabilities, TranscriptionHint, Voice
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, HistoryLimits
from pipeline.images import MIN_PIXELS
from pipeline.token_bounds import text_tokens_bound
from pipeline.token_count import MESSAGE_MARKERS, system_message_text, system_tokens_at_most
from pipeline.tool_format import Tool, ToolChoice

# ---- session_config ----

Modality = Literal["audio", "text"]
AudioFormatType = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]

MAX_OUTPUT_TOKENS_LIMIT = 4096  # OpenAI's bound for max_output_tokens
MAX_TEMPERATURE = 2.0
# OpenAI's voice names: accepted from unchanged OpenAI clients, mapped to the session's Qwen voice.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar", "fable", "onyx", "nova"}
)
Eagerness = Literal["low", "medium", "high", "auto"]
# An image's pixel budget by OpenAI's ``detail``. "low" is 448 x 224 pixels, at most 98 tokens (a
# 4:3 image is 352 x 256, 88 tokens: about what "low" costs on OpenAI's models, 85); it is also
# the camera's default, because frames cost time to first audio: on the dev model 4 frames at
# 88 tokens add 36% to a spoken turn's, at 192 tokens (448 x 448) 94% (tests/bench/README.md,
# "vision"). "high" is about a megapixel (at most 980 tokens). "auto" lets the image keep what it
# has up to "high": small images stay small (the processor never enlarges past 3,136 pixels).
DETAIL_MAX_PIXELS = {"low": 100_352, "high": 1_003_520, "auto": 1_003_520}
# session.video bounds: frames beyond these add prompt tokens, not understanding.
MAX_VIDEO_FPS = 5.0
MAX_FRAMES_PER_TURN = 16
MAX_VIDEO_PIXELS = DETAIL_MAX_PIXELS["high"]
# PCM16 input rates taken in ``audio.input.format.rate`` (OpenAI's GA takes 24000 only): DashScope's
# clients send 16 kHz, and its SDK offers 8, 16, 24 and 48 kHz (``AudioSampleRate``). Each is
# resampled to the 16 kHz the VAD and the model hear. Output stays 24 kHz, Code2Wav's rate.
INPUT_PCM_RATES = (8_000, 16_000, 24_000, 48_000)
_BETA_AUDIO_FORMATS: dict[str, AudioFormatType] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}


# OpenAI's minimum: the idle timeout answers a silence the user left, so the server never talks to
# itself (at 0 it answered its own answers 39 times in 21 s).
MIN_IDLE_TIMEOUT_MS = 5_000

@dataclass(frozen=True)
class TurnDetection:
    """Turn detection settings (``audio.input.turn_detection``): server VAD, or semantic VAD."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    eagerness: Eagerness = "auto"  # semantic_vad only
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    # Barge-in, OpenAI's default: clients that send no turn detection (pipecat) or leave the field
    # out rely on it. The server's default for sessions is ``Settings.default_interrupt_response``
    # (``SessionConfig.default_interrupt_response``); the page sends its own toggle.
    interrupt_response: bool = True
    # No speech for this long after the assistant's audio ended: the server prompts a response.
    idle_timeout_ms: int | None = None
    # An extension: the answer starts at a candidate end of turn and is held until the commit
    # (app.realtime.speculation); its default is the server's (Settings.speculative_responses).
    speculative_response: bool = True
    # Extensions (app.realtime.interruption): speech over the playing answer pauses it and
    # interrupts once it has gone on this long since the pause. 700 ms: longer than "mm-hmm",
    # "okay", "I see" (250-600 ms) and than a speakerphone echo lasts once the answer is paused
    # (under 500 ms); the figures are in docs/SESSION.md "Interruptions".
    interrupt_min_speech_ms: int = 700
    # Quiet for this long before the speech was confirmed: the answer plays on where it paused.
    interrupt_resume_silence_ms: int = 250
    # Extensions (media.speech_level): a speech window is the user's only at or above this level,
    # this far above the room's steady level and no further below the user's own; None: off.
    # Chosen from tests/bench/room_levels.py (docs/SESSION.md "Other voices").
    speech_floor_dbfs: float | None = LevelRules.floor_dbfs
    speech_over_background_db: float | None = LevelRules.over_background_db
    speech_under_user_db: float | None = LevelRules.under_user_db

    def as_server_vad(self) -> TurnDetection:
        """The same settings with server VAD's silence wait (when semantic VAD is not available)."""
        return dataclasses.replace(self, type="server_vad", eagerness="auto")


@dataclass(frozen=True)
class InputTranscription:
    """``audio.input.transcription``: committed user audio is transcribed (by Qwen3-Omni itself).

    ``model`` is any name the client gave, only reported back; ``language`` (ISO-639-1) and
    ``prompt`` are hints for the ASR prompt (``pipeline.local.prompt``). ``partials``, an extension:
    the words are also transcribed while the user speaks (``app.realtime.transcription``);
    left out, the server's ``--partial-transcripts`` (``SessionConfig.partial_transcripts``).
    """

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    partials: bool = True

    def hint(self) -> TranscriptionHint:
        return TranscriptionHint(language=self.language, prompt=self.prompt)


@dataclass(frozen=True)
class Truncation:
    """``truncation``: how the history keeps to its token budget, as OpenAI's token-based truncation.

    The budget is the server's ``HistoryLimits.max_prompt_tokens`` (``--history-max-tokens``);
    ``retention_ratio``'s ``token_limits.post_instructions`` may lower it, never raise it. "auto":
    past the budget the oldest items go until it holds. ``retention_ratio``: past it they go until
    ``retention_ratio`` of it is used, so the next truncations come later (OpenAI: amortized, for
    its prompt cache). "disabled": nothing goes for tokens; a response over the budget fails
    (``context_length_exceeded``). The item and byte bounds hold in every mode (server memory);
    so does the turn rule of the prompt (``HistoryLimits.max_turns``, the audio limits), which is
    how this server renders Qwen3-Omni's prompt, not a token truncation (docs/SESSION.md).
    """

    type: Literal["auto", "disabled", "retention_ratio"] = "auto"
    retention_ratio: float = 1.0  # retention_ratio only
    post_instructions: int | None = None  # retention_ratio's token_limits; None: the server's budget

    def token_budget(self, limits: HistoryLimits) -> tuple[int, int] | None:
        """(the tokens past which items go, the tokens kept then); None: nothing goes for tokens."""
        if self.type == "disabled":
            return None
        limit = limits.max_prompt_tokens
        if self.type == "auto":
            return limit, limit
        if self.post_instructions is not None:
            limit = min(limit, self.post_instructions)
        return limit, int(limit * self.retention_ratio)

    def to_object(self) -> Literal["auto", "disabled"] | RetentionRatioTruncation:
        if self.type != "retention_ratio":
            return self.type
        limits = None if self.post_instructions is None else TokenLimits(post_instructions=self.post_instructions)
        return RetentionRatioTruncation(retention_ratio=self.retention_ratio, token_limits=limits)


@dataclass(frozen=True)
class VideoInput:
    """``video`` (an extension): how camera frames join user turns.

    LiveKit samples 1 fps while the user speaks and ~0.3 fps otherwise; OpenAI's own camera
    example sends 1 fps. A committed utterance takes the last ``frames_per_turn`` frames sampled
    while it was spoken plus the last one before it started, so a short "what is this?" still
    sees what was in front of the camera.
    """

    speaking_fps: float = 1.0
    idle_fps: float = 0.25
    frames_per_turn: int = 4  # 0: camera frames never join a turn
    max_pixels: int = DETAIL_MAX_PIXELS["low"]

    def to_object(self) -> SessionVideo:
        return SessionVideo(**dataclasses.asdict(self))


@dataclass(frozen=True)
class SessionConfig:
    instructions: str | None = None  # None: Qwen3-Omni's default speech system prompt
    voice: Voice = "ethan"
    output_modality: Modality = "audio"
    temperature: float = DEFAULT_TEMPERATURE
    max_output_tokens: int | None = None  # None: "inf"
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)  # None: manual commits
    input_audio_format: AudioFormatType = "audio/pcm"  # of base64 audio in events (WebRTC uses Opus)
    input_audio_rate: int = 24_000  # of audio/pcm input (G.711 is 8 kHz)
    # audio.input.noise_reduction; None: off. A session that says nothing gets the server's
    # (Settings.noise_reduction), as the base config holds it.
    noise_reduction: NoiseReduction | None = None
    # audio.input.echo_cancellation, an extension: a WebRTC call takes the answer's echo out of the
    # input (media.echo_canceller); the server's default (Settings.echo_cancellation) when left out.
    echo_cancellation: bool = True
    output_audio_format: AudioFormatType = "audio/pcm"
    transcription: InputTranscription | None = None  # None: user audio is not transcribed
    tools: tuple[Tool, ...] = ()  # functions the model may call
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    video: VideoInput = field(default_factory=VideoInput)
    # recording.enabled, an extension: false, the session asked not to be recorded (and stays so).
    recording: bool = True
    truncation: Truncation = field(default_factory=Truncation)
    # Server-side, not in the protocol:
    # What a turn detection object that leaves out ``interrupt_response`` gets (OpenAI: true);
    # Settings.default_interrupt_response. The session's own starts as ``turn_detection`` says.
    default_interrupt_response: bool = True
    history: HistoryLimits = field(default_factory=HistoryLimits)
    max_text_chars: int = 16_000  # one input_text or the instructions; Settings.max_text_chars
    # The system message's tokens: instructions and tools (app.realtime.session_config);
    # Settings.instructions_max_tokens.
    max_instructions_tokens: int = 16_000
    # Client events past these are answered with an error and dropped (app.realtime.gate.EventGate);
    # Settings.max_event_bytes, max_events_per_second, max_event_burst.
    max_event_bytes: int = 262_144
    max_events_per_second: float = MAX_EVENTS_PER_SECOND
    max_event_burst: int = MAX_EVENT_BURST
    # One input_image's bytes (decoded from its data URL); Settings.max_image_bytes.
    max_image_bytes: int = 10_485_760
    # turn_detection.speculative_response when a client's turn detection leaves it out;
    # Settings.speculative_responses.
    speculative_responses: bool = True
    # audio.input.transcription.partials when a client's transcription leaves it out;
    # Settings.partial_transcripts.
    partial_transcripts: bool = True
    # The server keeps recordings (Settings.record_dir): a session that does not refuse is recorded.
    record_sessions: bool = False

    @property
    def recorded(self) -> bool:
        """The session is recorded, as its session object's ``recording.enabled`` says."""
        return self.record_sessions and self.recording

    @classmethod
    def from_session(cls, session: Mapping[str, Any], *, base: SessionConfig | None = None) -> SessionConfig:
        """A config from a (partial) session object: the ``session`` of an offer or client secret."""
        return (base or cls()).updated(session)

    @property
    def max_image_event_bytes(self) -> int:
        """The largest client event: one image of ``max_image_bytes`` as base64, plus an ordinary event."""
        return self.max_event_bytes + 4 * math.ceil(self.max_image_bytes / 3)

    @property
    def effective_instructions(self) -> str:
        return DEFAULT_SYSTEM_PROMPT if self.instructions is None else self.instructions

    def updated(self, session: Mapping[str, Any]) -> SessionConfig:
        """This config with ``session`` (a ``session.update``'s object) applied; raises ``ProtocolError``."""
        return _SessionReader(self, session).read()

    def to_session_object(self, *, session_id: str, model: str, expires_at: int) -> SessionObject:
        td = self.turn_detection
        return SessionObject(
            id=session_id,
            model=model,
            output_modalities=[self.output_modality],
            instructions=self.effective_instructions,
            max_output_tokens="inf" if self.max_output_tokens is None else self.max_output_tokens,
            tools=tool_objects(self.tools),
            tool_choice=choice_object(self.tool_choice),
            expires_at=expires_at,
            temperature=self.temperature,
            video=self.video.to_object(),
            recording=SessionRecording(enabled=self.recorded),
            truncation=self.truncation.to_object(),
            audio=SessionAudio(
                input=SessionAudioInput(
                    format=_format_object(self.input_audio_format, self.input_audio_rate),
                    transcription=None if self.transcription is None else TranscriptionObject(
                        **dataclasses.asdict(self.transcription)
                    ),
                    noise_reduction=None if self.noise_reduction is None
                    else NoiseReductionObject(type=self.noise_reduction),
                    echo_cancellation=self.echo_cancellation,
                    turn_detection=None
                    if td is None
                    else SemanticVadObject(
                        eagerness=td.eagerness,
                        create_response=td.create_response,
                        interrupt_response=td.interrupt_response,
                        speculative_response=td.speculative_response,
                        interrupt_min_speech_ms=td.interrupt_min_speech_ms,
                        interrupt_resume_silence_ms=td.interrupt_resume_silence_ms,
                        speech_floor_dbfs=td.speech_floor_dbfs,
                        speech_over_background_db=td.speech_over_background_db,
                        speech_under_user_db=td.speech_under_user_db,
                    )
                    if td.type == "semantic_vad"
                    else ServerVadObject(
                        threshold=td.threshold,
                        prefix_padding_ms=td.prefix_padding_ms,
                        silence_duration_ms=td.silence_duration_ms,
                        idle_timeout_ms=td.idle_timeout_ms,
                        create_response=td.create_response,
                        interrupt_response=td.interrupt_response,
                        speculative_response=td.speculative_response,
                        interrupt_min_speech_ms=td.interrupt_min_speech_ms,
                        interrupt_resume_silence_ms=td.interrupt_resume_silence_ms,
                        speech_floor_dbfs=td.speech_floor_dbfs,
                        speech_over_background_db=td.speech_over_background_db,
                        speech_under_user_db=td.speech_under_user_db,
                    ),
                ),
                output=SessionAudioOutput(format=_format_object(self.output_audio_format), voice=self.voice),
            ),
        )


def _format_object(format_type: AudioFormatType, pcm_rate: int = 24_000) -> AudioFormat:
    return AudioFormat(type=format_type, rate=pcm_rate if format_type == "audio/pcm" else None)


class _SessionReader:
    """Reads one session object into a new config; the first bad value raises ``ProtocolError``."""

    def __init__(self, base: SessionConfig, session: Mapping[str, Any]) -> None:
        self._base = base
        self._session = session
        self._changes: dict[str, Any] = {}

    def read(self) -> SessionConfig:
        s = self._session
        if not isinstance(s, Mapping):
            raise invalid_value("session", "must be an object")
        if "type" in s and s["type"] != "realtime":
            raise invalid_value("session.type", "must be 'realtime' (transcription sessions are not supported)")
        if "model" in s and not isinstance(s["model"], str):
            raise invalid_value("session.model", "must be a string")
        if "instructions" in s:
            value = s["instructions"]
            if value is not None and not isinstance(value, str):
                raise invalid_value("session.instructions", "must be a string")
            if value is not None and len(value) > self._base.max_text_chars:
                raise invalid_value("session.instructions", f"longer than {self._base.max_text_chars} characters")
            self._changes["instructions"] = value
        for key in ("output_modalities", "modalities"):
            if key in s:
                self._changes["output_modality"] = _modality(s[key], f"session.{key}")
        for key in ("max_output_tokens", "max_response_output_tokens"):
            if key in s:
                self._changes["max_output_tokens"] = read_max_output_tokens(s[key], f"session.{key}")
        if "temperature" in s:
            self._changes["temperature"] = read_temperature(s["temperature"], "session.temperature")
        # Beta flat keys first, so that GA nesting wins when a client sends both.
        if "voice" in s:
            self._voice(s["voice"], "session.voice")
        if "speed" in s:
            _speed(s["speed"], "session.speed")
        if "input_audio_format" in s:
            self._changes["input_audio_format"] = _beta_format(s["input_audio_format"], "session.input_audio_format")
            self._changes["input_audio_rate"] = 24_000  # the beta's pcm16 is 24 kHz
        if "output_audio_format" in s:
            self._changes["output_audio_format"] = _beta_format(s["output_audio_format"], "session.output_audio_format")
        if "turn_detection" in s:
            self._changes["turn_detection"] = self._turn_detection(s["turn_detection"], "session.turn_detection")
        if "input_audio_noise_reduction" in s:
            self._changes["noise_reduction"] = _noise_reduction(s["input_audio_noise_reduction"],
                                                                "session.input_audio_noise_reduction")
        if "input_audio_transcription" in s:
            self._transcription(s["input_audio_transcription"], "session.input_audio_transcription")
        if "audio" in s:
            self._audio(s["audio"])
        if "video" in s:
            self._changes["video"] = _video(s["video"], self._base.video, "session.video")
        if "recording" in s:
            self._changes["recording"] = _recording(s["recording"], self._base.recording, "session.recording")
        if "tools" in s:
            self._changes["tools"] = read_tools(s["tools"], "session.tools", max_chars=self._base.max_text_chars)
        if "tool_choice" in s:
            self._changes["tool_choice"] = read_tool_choice(s["tool_choice"], "session.tool_choice")
        if "truncation" in s:
            self._changes["truncation"] = _truncation(s["truncation"], "session.truncation")
        # tracing, prompt, include: accepted, and not implemented.
        config = dataclasses.replace(self._base, **self._changes)
        check_choice(config.tools, config.tool_choice, "session.tool_choice")
        return config

    def _turn_detection(self, value: Any, param: str) -> TurnDetection | None:
        return _turn_detection(value, param, interrupt_response=self._base.default_interrupt_response,
                               speculative_response=self._base.speculative_responses)

    def _voice(self, value: Any, param: str) -> None:
        self._changes["voice"] = read_voice(value, param, self._changes.get("voice", self._base.voice))

    def _transcription(self, value: Any, param: str) -> None:
        """Any ``model`` name is accepted (and reported); ``delay``, ``keywords``… are accepted and
        ignored; ``partials`` left out is the server's (the object sent is the object used)."""
        value = _object_or_none(value, param)
        if value is None:
            self._changes["transcription"] = None
            return
        fields: dict[str, str | None] = {}
        for key in ("model", "language", "prompt"):
            field_value = value.get(key)
            if field_value is not None and not isinstance(field_value, str):
                raise invalid_value(f"{param}.{key}", "must be a string or null")
            if field_value is not None and len(field_value) > self._base.max_text_chars:
                raise invalid_value(f"{param}.{key}", f"longer than {self._base.max_text_chars} characters")
            fields[key] = field_value
        partials = value.get("partials", self._base.partial_transcripts)
        if not isinstance(partials, bool):
            raise invalid_value(f"{param}.partials", "must be a boolean")
        self._changes["transcription"] = InputTranscription(**fields, partials=partials)

    def _audio(self, audio: Any) -> None:
        if audio is None:
            return
        if not isinstance(audio, Mapping):
            raise invalid_value("session.audio", "must be an object")
        audio_input = _object_or_none(audio.get("input"), "session.audio.input")
        if audio_input:
            if "format" in audio_input:
                self._changes["input_audio_format"], self._changes["input_audio_rate"] = _format(
                    audio_input["format"], "session.audio.input.format", rates=INPUT_PCM_RATES
                )
            if "echo_cancellation" in audio_input:
                if not isinstance(audio_input["echo_cancellation"], bool):
                    raise invalid_value("session.audio.input.echo_cancellation", "must be a boolean")
                self._changes["echo_cancellation"] = audio_input["echo_cancellation"]
            if "noise_reduction" in audio_input:
                self._changes["noise_reduction"] = _noise_reduction(audio_input["noise_reduction"],
                                                                    "session.audio.input.noise_reduction")
            if "transcription" in audio_input:
                self._transcription(audio_input["transcription"], "session.audio.input.transcription")
            if "turn_detection" in audio_input:
                self._changes["turn_detection"] = self._turn_detection(
                    audio_input["turn_detection"], "session.audio.input.turn_detection"
                )
        audio_output = _object_or_none(audio.get("output"), "session.audio.output")
        if audio_output:
            if "format" in audio_output:
                self._changes["output_audio_format"], _ = _format(audio_output["format"], "session.audio.output.format")
            if "voice" in audio_output:
                self._voice(audio_output["voice"], "session.audio.output.voice")
            if "speed" in audio_output:
                _speed(audio_output["speed"], "session.audio.output.speed")



def _noise_reduction(value: Any, param: str) -> NoiseReduction | None:
    """``{"type": "near_field" | "far_field"}``, or null: off."""
    value = _object_or_none(value, param)
    if value is None:
        return None
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in get_args(NoiseReduction):
        raise invalid_value(f"{param}.type", "must be 'near_field' or 'far_field'")
    noise_reduction: NoiseReduction = kind  # type: ignore[assignment]  # checked against its Literal above
    return noise_reduction


def _object_or_none(value: Any, param: str) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object or null")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _modality(value: Any, param: str) -> Modality:
    if not isinstance(value, list) or not value or any(m not in ("audio", "text") for m in value):
        raise invalid_value(param, 'must be ["audio"] or ["text"]')
    # Beta clients send ["text", "audio"]: audio output always carries its text transcript.
    return "audio" if "audio" in value else "text"


def read_max_output_tokens(value: Any, param: str) -> int | None:
    """``max_output_tokens``: 1–4096 or ``"inf"`` (``None``)."""
    if value == "inf" or value is None:
        return None
    if not _is_int(value) or not 1 <= value <= MAX_OUTPUT_TOKENS_LIMIT:
        raise invalid_value(param, f'must be an integer from 1 to {MAX_OUTPUT_TOKENS_LIMIT} or "inf"')
    return value


def read_temperature(value: Any, param: str) -> float:
    if not _is_number(value) or not 0.0 <= value <= MAX_TEMPERATURE:
        raise invalid_value(param, f"must be a number from 0 to {MAX_TEMPERATURE}")
    return float(value)


def read_voice(value: Any, param: str, current: Voice) -> Voice:
    """A Qwen voice name; OpenAI voice names keep ``current``."""
    if not isinstance(value, str):
        raise invalid_value(param, "must be a string")
    name = value.lower()
    if name in VOICES:
        return name
    if name in OPENAI_VOICES:
        return current
    raise invalid_value(param, f"unknown voice {value!r}; Qwen3-Omni speaks as {', '.join(VOICES)}")


def _speed(value: Any, param: str) -> None:
    # OpenAI's range; the speed itself is not applied (Qwen3-Omni speaks at its own pace).
    if not _is_number(value) or not 0.25 <= value <= 1.5:
        raise invalid_value(param, "must be a number from 0.25 to 1.5")


def _format(value: Any, param: str, *, rates: tuple[int, ...] = (24_000,)) -> tuple[AudioFormatType, int]:
    """A GA format object: its type, and its PCM rate (one of ``rates``; 24000 when not given)."""
    if not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object like {type: 'audio/pcm', rate: 24000}")
    format_type = value.get("type", "audio/pcm")
    if format_type not in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        raise invalid_value(f"{param}.type", "must be 'audio/pcm', 'audio/pcmu' or 'audio/pcma'")
    rate = value.get("rate", 24_000) if format_type == "audio/pcm" else 24_000
    if not _is_number(rate) or rate not in rates:
        raise invalid_value(f"{param}.rate", "must be " + " or ".join(str(r) for r in rates))
    return format_type, int(rate)


def _beta_format(value: Any, param: str) -> AudioFormatType:
    if not isinstance(value, str) or value not in _BETA_AUDIO_FORMATS:  # a list or object is unhashable
        raise invalid_value(param, "must be 'pcm16', 'g711_ulaw' or 'g711_alaw'")
    return _BETA_AUDIO_FORMATS[value]


def _video(value: Any, current: VideoInput, param: str) -> VideoInput:
    """``video``: the fields given change, the others keep their current values."""
    if not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object")
    changes: dict[str, Any] = {}
    for key, low in (("speaking_fps", None), ("idle_fps", 0.0)):
        if key in value:
            fps = value[key]
            valid = _is_number(fps) and fps <= MAX_VIDEO_FPS and (fps > 0 if low is None else fps >= low)
            if not valid:
                bound = "above 0" if low is None else "from 0"
                raise invalid_value(f"{param}.{key}", f"must be a number {bound} to {MAX_VIDEO_FPS:g}")
            changes[key] = float(fps)
    if "frames_per_turn" in value:
        frames = value["frames_per_turn"]
        if not _is_int(frames) or not 0 <= frames <= MAX_FRAMES_PER_TURN:
            raise invalid_value(f"{param}.frames_per_turn", f"must be an integer from 0 to {MAX_FRAMES_PER_TURN}")
        changes["frames_per_turn"] = frames
    if "max_pixels" in value:
        pixels = value["max_pixels"]
        if not _is_int(pixels) or not MIN_PIXELS <= pixels <= MAX_VIDEO_PIXELS:
            raise invalid_value(f"{param}.max_pixels", f"must be an integer from {MIN_PIXELS} to {MAX_VIDEO_PIXELS}")
        changes["max_pixels"] = pixels
    return dataclasses.replace(current, **changes)


def _recording(value: Any, current: bool, param: str) -> bool:
    """``recording``: ``{"enabled": false}`` asks not to be recorded; a session that asked stays
    unrecorded (what was kept of it is deleted when it asks, docs/OPERATING.md "Recordings")."""
    if not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object")
    if "enabled" not in value:
        return current
    enabled = value["enabled"]
    if not isinstance(enabled, bool):
        raise invalid_value(f"{param}.enabled", "must be a boolean")
    if enabled and not current:
        raise invalid_value(f"{param}.enabled", "a session that asked not to be recorded stays unrecorded")
    return enabled


def _truncation(value: Any, param: str) -> Truncation:
    """``"auto"``, ``"disabled"`` or ``{type: "retention_ratio", retention_ratio, token_limits?}``."""
    if value in ("auto", "disabled"):
        return Truncation(type=value)
    if not isinstance(value, Mapping) or value.get("type") != "retention_ratio":
        raise invalid_value(param, "must be 'auto', 'disabled' or {type: 'retention_ratio', retention_ratio}")
    ratio: Any = value.get("retention_ratio")
    if not _is_number(ratio) or not 0.0 <= ratio <= 1.0:
        raise invalid_value(f"{param}.retention_ratio", "must be a number from 0 to 1")
    limits = _object_or_none(value.get("token_limits"), f"{param}.token_limits") or {}
    post_instructions = limits.get("post_instructions")
    if post_instructions is not None and (not _is_int(post_instructions) or post_instructions < 1):
        raise invalid_value(f"{param}.token_limits.post_instructions", "must be a positive integer")
    return Truncation(type="retention_ratio", retention_ratio=float(ratio), post_instructions=post_instructions)


def _turn_detection(
    value: Any, param: str, *, interrupt_response: bool, speculative_response: bool
) -> TurnDetection | None:
    """A turn detection object; omitted fields take their defaults (the object sent is the object
    used), ``interrupt_response`` and ``speculative_response`` the server's
    (``SessionConfig.default_interrupt_response``, ``SessionConfig.speculative_responses``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object or null")
    kind = value.get("type", "server_vad")
    defaults = TurnDetection(interrupt_response=interrupt_response, speculative_response=speculative_response)
    changes: dict[str, Any] = {}
    if kind == "semantic_vad":
        eagerness = value.get("eagerness", "auto")
        if not isinstance(eagerness, str) or eagerness not in get_args(Eagerness):
            raise invalid_value(f"{param}.eagerness", "must be 'low', 'medium', 'high' or 'auto'")
        changes["type"] = "semantic_vad"
        changes["eagerness"] = eagerness
    elif kind == "server_vad":
        if "threshold" in value:
            threshold = value["threshold"]
            if not _is_number(threshold) or not 0.0 < threshold < 1.0:
                raise invalid_value(f"{param}.threshold", "must be a number between 0 and 1 (exclusive)")
            changes["threshold"] = float(threshold)
        for key in ("prefix_padding_ms", "silence_duration_ms"):
            if key in value:
                # 10 s bounds both: longer prefixes or waits are mistakes, not preferences.
                if not _is_int(value[key]) or not 0 <= value[key] <= 10_000:
                    raise invalid_value(f"{param}.{key}", "must be an integer from 0 to 10000")
                changes[key] = value[key]
        if "idle_timeout_ms" in value:
            idle = value["idle_timeout_ms"]
            if idle is not None and (not _is_int(idle) or idle < MIN_IDLE_TIMEOUT_MS):
                raise invalid_value(f"{param}.idle_timeout_ms", f"must be an integer of at least {MIN_IDLE_TIMEOUT_MS}, "
                                                                "or null")
            changes["idle_timeout_ms"] = idle
    else:
        raise invalid_value(f"{param}.type", "must be 'server_vad' or 'semantic_vad'")
    for key, low, high in (("speech_floor_dbfs", -100, 0), ("speech_over_background_db", 0, 60),
                           ("speech_under_user_db", 0, 60)):
        if key in value:
            level = value[key]
            if level is not None and (not _is_number(level) or not low <= level <= high):
                raise invalid_value(f"{param}.{key}", f"must be a number from {low} to {high}, or null (off)")
            changes[key] = None if level is None else float(level)
    for key in ("interrupt_min_speech_ms", "interrupt_resume_silence_ms"):
        if key in value:
            if not _is_int(value[key]) or not 0 <= value[key] <= 10_000:
                raise invalid_value(f"{param}.{key}", "must be an integer from 0 to 10000")
            changes[key] = value[key]
    for key in ("create_response", "interrupt_response", "speculative_response"):
        if key in value:
            if not isinstance(value[key], bool):
                raise invalid_value(f"{param}.{key}", "must be a boolean")
            changes[key] = value[key]
    return dataclasses.replace(defaults, **changes)


# ---- session_capabilities ----

TOOLS_UNSUPPORTED = "tools_unsupported"
IMAGES_UNSUPPORTED = "images_unsupported"
_NO_CALLS = "This server's engine does not call functions"
_NO_FORCED_CALLS = "This server's engine does not start an answer with a call"
_NO_IMAGES = "This server's engine does not see images."


def fitted(config: SessionConfig, capabilities: EngineCapabilities) -> SessionConfig:
    """``config`` as it runs on an engine with ``capabilities``: what needs a missing capability off."""
    if not capabilities.preemptible_generations:
        detection, transcription = config.turn_detection, config.transcription
        config = dataclasses.replace(
            config,
            turn_detection=None if detection is None else dataclasses.replace(detection, speculative_response=False),
            transcription=None if transcription is None else dataclasses.replace(transcription, partials=False),
            speculative_responses=False,
            partial_transcripts=False,
        )
    if not capabilities.images and config.video.frames_per_turn:
        config = dataclasses.replace(config, video=dataclasses.replace(config.video, frames_per_turn=0))
    return config


def first_config(config: SessionConfig, capabilities: EngineCapabilities) -> tuple[SessionConfig, ProtocolError | None]:
    """The session a call starts with, fitted; a forced ``tool_choice`` the engine cannot keep
    becomes ``auto``, with the error to send after ``session.created``."""
    config = fitted(config, capabilities)
    try:
        check_tool_choice(config.tool_choice, capabilities, "session.tool_choice")
    except ProtocolError as exc:
        error = ProtocolError(exc.code, f"{exc.message} tool_choice stays 'auto'.", param=exc.param)
        return dataclasses.replace(config, tool_choice=ToolChoice()), error
    return config, None


def check_tool_choice(choice: ToolChoice, capabilities: EngineCapabilities, param: str) -> None:
    """``ProtocolError`` ``tools_unsupported`` naming ``param`` when ``choice`` forces a call the
    engine cannot force (``EngineCapabilities.forced_function_calls``)."""
    if choice.mode not in ("required", "function"):
        return
    if not capabilities.function_calls:
        raise ProtocolError(
            TOOLS_UNSUPPORTED, f"{_NO_CALLS}: tool_choice may be 'auto' or 'none' (it answers without calling).",
            param=param,
        )
    if not capabilities.forced_function_calls:
        raise ProtocolError(
            TOOLS_UNSUPPORTED, f"{_NO_FORCED_CALLS}: tool_choice may be 'auto' (the model decides) or 'none'.",
            param=param,
        )


def check_item(item: ClientItem, capabilities: EngineCapabilities) -> None:
    """``ProtocolError`` for an item of ``conversation.item.create`` the engine could not read:
    a function call or output without ``function_calls``, an image without ``images``."""
    if not capabilities.function_calls and item.type in ("function_call", "function_call_output"):
        raise ProtocolError(TOOLS_UNSUPPORTED, f"{_NO_CALLS}: its conversation holds no {item.type}.",
                            param="item.type")
    if not capabilities.images and isinstance(item, ClientMessageItem):
        for index, part in enumerate(item.content):
            if part.type == "input_image":
                raise ProtocolError(IMAGES_UNSUPPORTED, _NO_IMAGES, param=f"item.content[{index}]")


def check_pushed_image(capabilities: EngineCapabilities) -> None:
    """``ProtocolError`` for an ``input_image_buffer.append`` on an engine without ``images``."""
    if not capabilities.images:
        raise ProtocolError(IMAGES_UNSUPPORTED, _NO_IMAGES, param="image")


# ---- prompt_budget ----

async def check_system_budget(instructions: str | None, tools: Sequence[Tool], *, budget: int, param: str) -> None:
    """``ProtocolError`` ``invalid_value`` naming ``param`` when the system message of
    ``instructions`` (None: Qwen's default prompt) and ``tools`` is over ``budget`` tokens.
    Returns without suspending when its bytes are within the budget."""
    system_prompt = DEFAULT_SYSTEM_PROMPT if instructions is None else instructions
    if MESSAGE_MARKERS + text_tokens_bound(system_message_text(system_prompt, tools)) <= budget:
        return
    tokens = await asyncio.to_thread(system_tokens_at_most, system_prompt, tools, budget)
    if tokens > budget:
        raise ProtocolError(
            "invalid_value",
            f"The instructions and tools are {tokens:,} tokens; a session's budget for them is {budget:,} tokens.",
            param=param,
        )


async def check_session(config: SessionConfig, *, since: SessionConfig | None = None, param: str = "session") -> None:
    """``config``'s instructions and tools within its budget (not counted again when they are
    ``since``'s, already checked). ``param``: the session object's name in the error."""
    if since is not None and (since.instructions, since.tools) == (config.instructions, config.tools):
        return
    await check_system_budget(config.instructions, config.tools, budget=config.max_instructions_tokens, param=param)


def session_param(session: Mapping[str, Any], prefix: str = "session") -> str:
    """The field an over-budget session object is refused for: its tools when it gives them."""
    return f"{prefix}.tools" if "tools" in session else f"{prefix}.instructions"

