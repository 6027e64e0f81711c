"""The OpenAI Realtime protocol (GA names) spoken on the ``oai-events`` data channel.

One pydantic model per client and server event this server speaks, a discriminated union per
direction, and ``parse_client_event`` for strict validation of what clients send. Event type
strings live in this module only. Server events carry every field of the GA schema (optional
ones as ``null``), because OpenAI's own clients validate strictly and drop events that miss
fields; ``ServerEvent.to_json()`` gives the dict the transport serialises.

Extensions, clearly named and ignored by clients that do not know them:
- ``response.done`` carries ``latency``: where the time from end of speech to first audio went
  (see ``ResponseLatency``), and whether the answer was started speculatively.
- ``turn_detection`` carries ``speculative_response``: whether answers start at a candidate end
  of turn, before the commit (``app.realtime.speculation``).
- sessions and ``response.create`` accept ``temperature`` (the beta name), like OpenAI's beta.
- sessions carry ``video``: how camera frames (a WebRTC video track) join user turns
  (``SessionVideo``); ``session.update`` may change it.
- ``input_image`` content parts are echoed without their ``image_url`` (``null``): the server
  keeps the image, sending megabytes back twice per item helps no one.
- ``input_image_buffer.append`` (a camera frame as a base64 JPEG or PNG, joining the next
  committed utterance as the call's video frames do) and ``session.finish`` (answered with
  ``session.finished``, after which the session takes nothing more): DashScope's events, taken
  from any client.
- The DashScope dialect (``app.realtime.dashscope``) renames server events for Qwen's own
  realtime clients: ``DASHSCOPE_EVENT_NAMES`` below.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Annotated, Any, Literal, get_args

import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

# The data channel WebRTC clients open for events (OpenAI's name for it).
EVENTS_CHANNEL = "oai-events"


def new_id(prefix: str) -> str:
    """An id like OpenAI's: ``event_…``, ``item_…``, ``resp_…``, ``sess_…``, ``conv_…``."""
    return f"{prefix}_{secrets.token_hex(10)}"


def _new_event_id() -> str:
    return new_id("event")


# ---------------------------------------------------------------------------------------------
# Errors as data
# ---------------------------------------------------------------------------------------------


class ProtocolError(Exception):
    """A client mistake; the session answers it with an ``error`` event and goes on."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.type = type

    def for_event(self, event_id: str | None) -> ProtocolError:
        """The same error naming the client event that caused it."""
        return ProtocolError(self.code, self.message, param=self.param, event_id=event_id, type=self.type)

    def to_event(self) -> ErrorEvent:
        return ErrorEvent(
            error=ErrorDetails(
                type=self.type, code=self.code, message=self.message, param=self.param, event_id=self.event_id
            )
        )


# ---------------------------------------------------------------------------------------------
# Client events (strict: wrong types are errors, unknown keys are ignored)
# ---------------------------------------------------------------------------------------------


class _ClientModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _ClientEventBase(_ClientModel):
    event_id: str | None = None


ImageDetail = Literal["low", "high", "auto"]


class ClientContentPart(_ClientModel):
    """One part of a message the client creates.

    ``input_text``, ``input_audio`` (base64 PCM16 in the session's input format) and
    ``input_image`` (``image_url``: a PNG or JPEG data URL; ``detail``) for user messages;
    ``output_text`` / ``text`` / ``output_audio`` (its ``transcript``) for assistant messages
    seeded into the history.
    """

    type: Literal["input_text", "input_audio", "input_image", "output_text", "text", "output_audio", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: ImageDetail | None = None


class ClientMessageItem(_ClientModel):
    type: Literal["message"]
    role: Literal["user", "assistant", "system"]
    content: list[ClientContentPart]
    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class ClientFunctionCallItem(_ClientModel):
    """A function call the client puts into the history (one it made elsewhere, say)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=64)
    arguments: str
    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class ClientFunctionCallOutputItem(_ClientModel):
    """What a function call returned: the client ran the call the model made."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=64)
    output: str
    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


def _item_tag(item: Any) -> str | None:
    """The tag of an item by its ``type``; None (pydantic's ``union_tag_not_found``) without one."""
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return None if kind is None else f"item:{kind}"


# Tagged by type; the tags name no field (":"), so error params read "item.content", not
# "item.message.content" (see _param_path).
ClientItem = Annotated[
    Annotated[ClientMessageItem, Tag("item:message")]
    | Annotated[ClientFunctionCallItem, Tag("item:function_call")]
    | Annotated[ClientFunctionCallOutputItem, Tag("item:function_call_output")],
    Discriminator(_item_tag),
]


class SessionUpdateEvent(_ClientEventBase):
    type: Literal["session.update"]
    # Validated field by field by ``app.realtime.session_config`` (tolerant of OpenAI-only fields).
    session: dict[str, Any]


class InputAudioBufferAppendEvent(_ClientEventBase):
    type: Literal["input_audio_buffer.append"]
    audio: str  # base64 PCM16 in the session's input format (transports without a media track)


class InputAudioBufferCommitEvent(_ClientEventBase):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClearEvent(_ClientEventBase):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreateEvent(_ClientEventBase):
    type: Literal["conversation.item.create"]
    item: ClientItem
    previous_item_id: str | None = None  # None: append; "root": first; an id: right after it

    @property
    def carries_image(self) -> bool:
        """An ``input_image`` upload: the one event allowed past ``max_event_bytes``."""
        return isinstance(self.item, ClientMessageItem) and any(part.type == "input_image" for part in self.item.content)

    @property
    def image_url_chars(self) -> int:
        """The characters of its ``input_image`` data URLs: all an image upload may hold past
        ``max_event_bytes`` (the rest of it is bounded as any event is)."""
        if not isinstance(self.item, ClientMessageItem):
            return 0
        return sum(len(part.image_url or "") for part in self.item.content if part.type == "input_image")


class ConversationItemDeleteEvent(_ClientEventBase):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemRetrieveEvent(_ClientEventBase):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ConversationItemTruncateEvent(_ClientEventBase):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseAudioOutputParams(_ClientModel):
    format: dict[str, Any] | None = None
    voice: str | None = None


class ResponseAudioParams(_ClientModel):
    output: ResponseAudioOutputParams | None = None


class ResponseCreateParams(_ClientModel):
    """Per-response overrides of the session; fields this server cannot honour are rejected."""

    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = Field(default=None, min_length=1)
    modalities: list[Literal["audio", "text"]] | None = Field(default=None, min_length=1)  # beta name
    max_output_tokens: Annotated[int, Field(ge=1, le=4096)] | Literal["inf"] | None = None
    max_response_output_tokens: Annotated[int, Field(ge=1, le=4096)] | Literal["inf"] | None = None  # beta
    audio: ResponseAudioParams | None = None
    voice: str | None = None  # beta name
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    conversation: Literal["auto"] | None = None  # out-of-band ("none") responses are not supported
    input: list[Any] | None = None  # a custom context: rejected by the session
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)
    tools: list[Any] | None = None  # read by app.realtime.tools, as the session's
    tool_choice: Any = None


class ResponseCreateEvent(_ClientEventBase):
    type: Literal["response.create"]
    response: ResponseCreateParams | None = None


class ResponseCancelEvent(_ClientEventBase):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioBufferClearEvent(_ClientEventBase):
    type: Literal["output_audio_buffer.clear"]


class InputImageBufferAppendEvent(_ClientEventBase):
    """DashScope's camera frame (its SDK's ``append_video``): a base64 JPEG (or PNG), no data URL."""

    type: Literal["input_image_buffer.append"]
    image: str


class SessionFinishEvent(_ClientEventBase):
    """DashScope's end of a session (its SDK's ``end_session``): answered with ``session.finished``."""

    type: Literal["session.finish"]


class PlaybackAckEvent(_ClientEventBase):
    """vLLM-Omni's playback acknowledgement, for transports without a media track (WebSocket).

    The shape of ``AckPlayback`` in vllm-omni 0.30.0 (``vllm_omni/protocol/duplex/commands.py``,
    read by ``vllm_omni/engine/duplex/realtime_commands.py``): ``played_ms`` is the cumulative
    audio of one response the client has played; ``committed_ms`` (default ``played_ms``) how
    much of it counts as heard; the response is named by ``response_id`` or ``item_id`` (neither:
    the oldest answer not yet played out). Milliseconds may be fractional, as vllm-omni accepts.
    """

    type: Literal["playback.ack"]
    played_ms: Annotated[int | float, Field(ge=0, le=86_400_000)]  # a day bounds any real playback
    committed_ms: Annotated[int | float, Field(ge=0, le=86_400_000)] | None = None
    response_id: str | None = None
    item_id: str | None = None


ClientEvent = Annotated[
    SessionUpdateEvent
    | InputAudioBufferAppendEvent
    | InputAudioBufferCommitEvent
    | InputAudioBufferClearEvent
    | ConversationItemCreateEvent
    | ConversationItemDeleteEvent
    | ConversationItemRetrieveEvent
    | ConversationItemTruncateEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
    | OutputAudioBufferClearEvent
    | PlaybackAckEvent
    | InputImageBufferAppendEvent
    | SessionFinishEvent,
    Field(discriminator="type"),
]
_client_event_adapter: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES: tuple[str, ...] = tuple(
    get_args(model.model_fields["type"].annotation)[0] for model in get_args(get_args(ClientEvent)[0])
)
# The wire type of an audio append, which the event gate meets before the event is parsed.
APPEND_EVENT_TYPE: str = get_args(InputAudioBufferAppendEvent.model_fields["type"].annotation)[0]

# pydantic error types → OpenAI's error codes.
_MISSING_CODES = {"missing"}
_TYPE_CODES = {"string_type", "int_type", "float_type", "bool_type", "list_type", "dict_type", "model_type"}


def _param_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, str) and not part.isidentifier():
            continue  # a union member's tag ("constrained-int", "literal['inf']"), not a field
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += part if not path else f".{part}"
    return path


# Past this an event is parsed by pydantic-core's parser (jiter): only image uploads are let in
# that large, and they are parsed on the loop like any event; jiter reads a 14 MB one in ~8 ms
# where the json module takes ~49 (the loaded dev box). Both read valid JSON alike.
LARGE_EVENT_CHARS = 1024 * 1024
_JITER_POSITION = re.compile(r"at line (\d+) column (\d+)")


def _load_large(text: str) -> Any:
    try:
        return pydantic_core.from_json(text, cache_strings=False)  # an image upload's keys are few
    except ValueError as exc:
        where = _JITER_POSITION.search(str(exc))
        position = f" (line {where[1]}, column {where[2]})" if where else ""
        raise ProtocolError("invalid_json", f"The message is not valid JSON{position}.") from None


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """One client event from its JSON text; raises ``ProtocolError`` naming the event's ``event_id``."""
    # The parser's own words never reach the client (errors carry fixed messages): where it
    # stopped is what helps.
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
        data = json.loads(text) if len(text) <= LARGE_EVENT_CHARS else _load_large(text)
    except UnicodeDecodeError:
        raise ProtocolError("invalid_json", "The message is not UTF-8 text.") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(
            "invalid_json", f"The message is not valid JSON (line {exc.lineno}, column {exc.colno})."
        ) from None
    # Valid JSON that Python refuses to hold: an integer over 4300 digits (ValueError, CPython's
    # int_max_str_digits) or nesting deeper than the recursion limit (~1000 levels).
    except (ValueError, RecursionError):
        raise ProtocolError(
            "invalid_json", "The message cannot be decoded: a number over 4,300 digits, or nesting over ~1,000 levels."
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "A client event must be a JSON object.")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    event_type = data.get("type")
    if event_type is None:
        raise ProtocolError("missing_required_parameter", "Missing required parameter: 'type'.", param="type",
                            event_id=event_id)
    if event_type not in CLIENT_EVENT_TYPES:
        raise ProtocolError(
            "invalid_value",
            f"Invalid value: {event_type!r}. Supported values are: {', '.join(CLIENT_EVENT_TYPES)}.",
            param="type",
            event_id=event_id,
        )
    try:
        return _client_event_adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = tuple(first["loc"][1:])  # the first element is the union tag (the event type)
        param = _param_path(loc)
        if first["type"] == "union_tag_not_found" and not isinstance(first["input"], dict):
            code, message = "invalid_type", f"Invalid type for {param!r}: Input should be an object."
        elif first["type"] == "union_tag_not_found":
            param = f"{param}.type"
            code, message = "missing_required_parameter", f"Missing required parameter: {param!r}."
        elif first["type"] == "union_tag_invalid":
            param = f"{param}.type"
            expected = first.get("ctx", {}).get("expected_tags", "").replace("'", "").split(", ")
            tags = ", ".join(repr(tag.split(":", 1)[-1]) for tag in expected)
            code, message = "invalid_value", f"Invalid value for {param!r}: supported values are {tags}."
        elif first["type"] in _MISSING_CODES:
            code, message = "missing_required_parameter", f"Missing required parameter: {param!r}."
        elif first["type"] in _TYPE_CODES:
            code, message = "invalid_type", f"Invalid type for {param!r}: {first['msg']}."
        else:
            code, message = "invalid_value", f"Invalid value for {param!r}: {first['msg']}."
        raise ProtocolError(code, message, param=param or None, event_id=event_id) from None


# ---------------------------------------------------------------------------------------------
# Server events (every GA field present; optional ones are null)
# ---------------------------------------------------------------------------------------------


class _ServerModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ServerEventBase(_ServerModel):
    event_id: str = Field(default_factory=_new_event_id)

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict that goes on the data channel."""
        return self.model_dump(mode="json")


# -- items ---------------------------------------------------------------------------------


class InputTextContent(_ServerModel):
    type: Literal["input_text"] = "input_text"
    text: str


class InputAudioContent(_ServerModel):
    type: Literal["input_audio"] = "input_audio"
    transcript: str | None = None  # set once input audio transcription completed (if the session asks)


class InputImageContent(_ServerModel):
    type: Literal["input_image"] = "input_image"
    image_url: str | None = None  # never echoed (see the module docstring)
    detail: ImageDetail | None = None  # as the client gave it; None for a camera frame


class OutputTextContent(_ServerModel):
    type: Literal["output_text"] = "output_text"
    text: str


class OutputAudioContent(_ServerModel):
    type: Literal["output_audio"] = "output_audio"
    transcript: str


ItemContent = InputTextContent | InputAudioContent | InputImageContent | OutputTextContent | OutputAudioContent
ItemStatus = Literal["completed", "incomplete", "in_progress"]


class MessageItem(_ServerModel):
    id: str
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus
    role: Literal["user", "assistant", "system"]
    content: list[ItemContent]


class FunctionCallItem(_ServerModel):
    """A call the model made (or a client created): ``arguments`` is JSON text, as written."""

    id: str
    type: Literal["function_call"] = "function_call"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_ServerModel):
    id: str
    type: Literal["function_call_output"] = "function_call_output"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus = "completed"
    call_id: str
    output: str


RealtimeItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class ContentPart(_ServerModel):
    """``response.content_part.*``'s part: ``audio`` (with transcript) or ``text``.

    The fields a part does not have are left out, not null, as OpenAI sends them: the OpenAI
    Agents SDK's schema takes each as an optional string and drops a part with a null.
    """

    type: Literal["audio", "text"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None

    @model_serializer(mode="wrap")
    def _without_absent_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


# -- session -------------------------------------------------------------------------------


class AudioFormat(_ServerModel):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int | None = 24_000


class ServerVadObject(_ServerModel):
    type: Literal["server_vad"] = "server_vad"
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    idle_timeout_ms: int | None
    create_response: bool
    interrupt_response: bool
    speculative_response: bool  # extension: answers start at a candidate end of turn


class SemanticVadObject(_ServerModel):
    type: Literal["semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"]
    create_response: bool
    interrupt_response: bool
    speculative_response: bool  # extension: answers start at a candidate end of turn


class TranscriptionObject(_ServerModel):
    """``audio.input.transcription``: the model named is reported; Qwen3-Omni itself transcribes."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    partials: bool = True  # an extension: partial transcripts while the user speaks (docs/SESSION.md)


class SessionAudioInput(_ServerModel):
    format: AudioFormat
    transcription: TranscriptionObject | None = None
    noise_reduction: dict[str, Any] | None = None
    turn_detection: ServerVadObject | SemanticVadObject | None


class SessionAudioOutput(_ServerModel):
    format: AudioFormat
    voice: str
    speed: float = 1.0


class SessionAudio(_ServerModel):
    input: SessionAudioInput
    output: SessionAudioOutput


class FunctionTool(_ServerModel):
    """A function the model may call, as the session holds it (``session.tools``)."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any]


class ToolChoiceFunction(_ServerModel):
    type: Literal["function"] = "function"
    name: str


class SessionVideo(_ServerModel):
    """Extension: how frames of the call's video track (the camera) join user turns.

    Frames are sampled ``speaking_fps`` times a second while the user speaks and ``idle_fps``
    otherwise; a committed utterance takes the last ``frames_per_turn`` sampled while it was
    spoken plus the last one before it, each scaled to at most ``max_pixels``.
    """

    speaking_fps: float
    idle_fps: float
    frames_per_turn: int
    max_pixels: int


class TokenLimits(_ServerModel):
    post_instructions: int | None = None


class RetentionRatioTruncation(_ServerModel):
    """``truncation: {type: "retention_ratio", …}``: past the token limit, drop to this share of it."""

    type: Literal["retention_ratio"] = "retention_ratio"
    retention_ratio: float
    token_limits: TokenLimits | None = None


class SessionObject(_ServerModel):
    """The full effective session, as ``session.created`` and ``session.updated`` carry it."""

    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str
    model: str
    output_modalities: list[Literal["audio", "text"]]
    instructions: str
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction = "auto"
    max_output_tokens: int | Literal["inf"]
    tracing: Any = None
    truncation: Literal["auto", "disabled"] | RetentionRatioTruncation = "auto"
    prompt: Any = None
    expires_at: int
    audio: SessionAudio
    include: list[str] | None = None
    temperature: float  # extension (OpenAI's beta field): Qwen3-Omni samples with it
    video: SessionVideo  # extension: camera frames (SessionVideo)


# -- responses -----------------------------------------------------------------------------


class StatusError(_ServerModel):
    type: str
    code: str | None
    message: str | None = None


class StatusDetails(_ServerModel):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: StatusError | None = None


class CachedTokensDetails(_ServerModel):
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0


class InputTokenDetails(_ServerModel):
    text_tokens: int
    audio_tokens: int
    image_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_details: CachedTokensDetails = Field(default_factory=CachedTokensDetails)


class OutputTokenDetails(_ServerModel):
    text_tokens: int
    audio_tokens: int


class ResponseUsage(_ServerModel):
    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: OutputTokenDetails


class ResponseAudioOutput(_ServerModel):
    format: AudioFormat
    voice: str


class ResponseAudio(_ServerModel):
    output: ResponseAudioOutput


ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]


class ResponseObject(_ServerModel):
    object: Literal["realtime.response"] = "realtime.response"
    id: str
    status: ResponseStatus
    status_details: StatusDetails | None = None
    output: list[RealtimeItem] = Field(default_factory=list)
    conversation_id: str
    output_modalities: list[Literal["audio", "text"]]
    max_output_tokens: int | Literal["inf"]
    audio: ResponseAudio
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = None


class NetworkLatency(_ServerModel):
    """Extension, WebRTC only: the call's network so far (cumulative counts since the call began).

    Inbound is the peer's audio to the server: packets that never arrived, that arrived after their
    20 ms frame had been concealed, that arrived faster than real time with the jitter buffer full
    (dropped: a peer sending ahead of its clock), and frames rebuilt from the next packet's in-band
    FEC or made up by Opus packet loss concealment; RFC 3550 jitter. Outbound is the answer's audio as the
    peer's RTCP receiver reports count it, and the loss the server's Opus FEC is tuned for.
    ``rtt_ms`` is the round trip from those reports (None until one has been measured).
    """

    inbound_packets_lost: int
    inbound_packets_late: int
    inbound_packets_overrun: int
    inbound_frames_recovered: int
    inbound_frames_concealed: int
    inbound_jitter_ms: float
    outbound_packets_lost: int
    outbound_fec_loss_percent: int
    rtt_ms: float | None


class ResponseLatency(_ServerModel):
    """Extension: where the time from end of speech to the first audio went, in milliseconds.

    ``end_of_speech_to_first_audio_ms`` = ``silence_wait_ms`` (audio the VAD waited through
    before committing; 0 for client commits and text turns) + time from commit to the first
    audio frame handed to the transport (WebRTC: the outbound track's first frame of the answer;
    an output that does not report its frames: the first chunk handed to it). Of the latter,
    ``engine_first_audio_ms`` is the engine's own time to first audio (``TurnTimings.first_audio``,
    including ``queue_wait_ms``) and ``other_ms`` the rest (session, transport to the engine
    process, event loop, and the wait for the outbound track's next frame slot).

    ``speculative``: the answer was started before the commit, at a candidate end of turn
    (``app.realtime.speculation``), and held until it. The engine's time to first audio is then
    split at the commit: ``speculation_hidden_ms`` ran before it (the user did not wait for it),
    ``engine_first_audio_ms`` is what was left after it (0 when the first audio was ready), so
    the two add up to the engine's own ``TurnTimings.first_audio`` and the sum above still holds.
    """

    end_of_speech_to_first_audio_ms: float
    silence_wait_ms: float
    engine_first_audio_ms: float | None
    queue_wait_ms: float
    other_ms: float
    speculative: bool = False
    speculation_hidden_ms: float = 0.0
    network: NetworkLatency | None = None  # WebRTC calls: added by the call (app/webrtc/network.py)


# -- the events ----------------------------------------------------------------------------


class ErrorDetails(_ServerModel):
    type: str
    code: str | None
    message: str
    param: str | None
    event_id: str | None


class ErrorEvent(_ServerEventBase):
    type: Literal["error"] = "error"
    error: ErrorDetails


class SessionCreatedEvent(_ServerEventBase):
    type: Literal["session.created"] = "session.created"
    session: SessionObject


class SessionUpdatedEvent(_ServerEventBase):
    type: Literal["session.updated"] = "session.updated"
    session: SessionObject


class InputAudioBufferSpeechStartedEvent(_ServerEventBase):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStoppedEvent(_ServerEventBase):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class InputAudioBufferCommittedEvent(_ServerEventBase):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


class InputAudioBufferTimeoutTriggeredEvent(_ServerEventBase):
    type: Literal["input_audio_buffer.timeout_triggered"] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class InputAudioBufferClearedEvent(_ServerEventBase):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class ConversationItemAddedEvent(_ServerEventBase):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None
    item: RealtimeItem


class ConversationItemDoneEvent(_ServerEventBase):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    previous_item_id: str | None
    item: RealtimeItem


class ConversationItemTruncatedEvent(_ServerEventBase):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDeletedEvent(_ServerEventBase):
    type: Literal["conversation.item.deleted"] = "conversation.item.deleted"
    item_id: str


class ConversationItemRetrievedEvent(_ServerEventBase):
    type: Literal["conversation.item.retrieved"] = "conversation.item.retrieved"
    item: RealtimeItem


class TranscriptionInputTokenDetails(_ServerModel):
    text_tokens: int
    audio_tokens: int


class TranscriptionUsage(_ServerModel):
    """Token usage of one transcription (OpenAI's ``tokens`` variant)."""

    type: Literal["tokens"] = "tokens"
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: TranscriptionInputTokenDetails


class TranscriptionError(_ServerModel):
    type: str
    code: str | None
    message: str
    param: str | None = None


class ConversationItemInputAudioTranscriptionDeltaEvent(_ServerEventBase):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta"
    )
    item_id: str
    content_index: int
    delta: str
    logprobs: list[Any] | None = None
    # Extensions (docs/SESSION.md "Partial transcripts"): ``partial`` is true for the deltas sent
    # while the user speaks, before the commit; ``transcript`` is the item part's whole text as
    # the server now hears it, which replaces the previous delta event's.
    partial: bool = False
    transcript: str


class ConversationItemInputAudioTranscriptionCompletedEvent(_ServerEventBase):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    item_id: str
    content_index: int
    transcript: str
    usage: TranscriptionUsage
    logprobs: list[Any] | None = None


class ConversationItemInputAudioTranscriptionFailedEvent(_ServerEventBase):
    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed"
    )
    item_id: str
    content_index: int
    error: TranscriptionError


class ResponseCreatedEvent(_ServerEventBase):
    type: Literal["response.created"] = "response.created"
    response: ResponseObject


class ResponseDoneEvent(_ServerEventBase):
    type: Literal["response.done"] = "response.done"
    response: ResponseObject
    latency: ResponseLatency | None = None  # extension, see ResponseLatency


class ResponseOutputItemAddedEvent(_ServerEventBase):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    response_id: str
    output_index: int
    item: RealtimeItem


class ResponseOutputItemDoneEvent(_ServerEventBase):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    response_id: str
    output_index: int
    item: RealtimeItem


class ResponseFunctionCallArgumentsDeltaEvent(_ServerEventBase):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDoneEvent(_ServerEventBase):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class _ContentEventBase(_ServerEventBase):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ResponseContentPartAddedEvent(_ContentEventBase):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    part: ContentPart


class ResponseContentPartDoneEvent(_ContentEventBase):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    part: ContentPart


class ResponseOutputAudioTranscriptDeltaEvent(_ContentEventBase):
    type: Literal["response.output_audio_transcript.delta"] = "response.output_audio_transcript.delta"
    delta: str


class ResponseOutputAudioTranscriptDoneEvent(_ContentEventBase):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class ResponseOutputAudioDeltaEvent(_ContentEventBase):
    """Answer audio as an event (WebSocket): base64 in the session's output format."""

    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str


class ResponseOutputAudioDoneEvent(_ContentEventBase):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class ResponseOutputTextDeltaEvent(_ContentEventBase):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class ResponseOutputTextDoneEvent(_ContentEventBase):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class OutputAudioBufferStartedEvent(_ServerEventBase):
    type: Literal["output_audio_buffer.started"] = "output_audio_buffer.started"
    response_id: str


class OutputAudioBufferStoppedEvent(_ServerEventBase):
    type: Literal["output_audio_buffer.stopped"] = "output_audio_buffer.stopped"
    response_id: str


class OutputAudioBufferClearedEvent(_ServerEventBase):
    type: Literal["output_audio_buffer.cleared"] = "output_audio_buffer.cleared"
    response_id: str


class PlaybackAcknowledgement(_ServerModel):
    """What ``playback.acknowledged`` reports under ``event``, after vllm-omni's reply
    (``PlaybackAcknowledged`` in ``vllm_omni/protocol/duplex/events.py``, filled by
    ``vllm_omni/engine/duplex/session/playback_ledger.py``): the item and response, the played
    and committed milliseconds as applied, and whether the item's history now holds them."""

    type: Literal["playback.acknowledged"] = "playback.acknowledged"
    session_id: str
    item_id: str
    response_id: str
    played_ms: int
    committed_ms: int
    audio_ms: int  # the item's whole audio: played out when played_ms reaches it
    history_committed: bool


class PlaybackAcknowledgedEvent(_ServerEventBase):
    type: Literal["playback.acknowledged"] = "playback.acknowledged"
    event: PlaybackAcknowledgement


class SessionFinishedEvent(_ServerEventBase):
    """The answer to ``session.finish``: the last event of the session; the transport then closes."""

    type: Literal["session.finished"] = "session.finished"


ServerEvent = Annotated[
    ErrorEvent
    | SessionCreatedEvent
    | SessionUpdatedEvent
    | InputAudioBufferSpeechStartedEvent
    | InputAudioBufferSpeechStoppedEvent
    | InputAudioBufferCommittedEvent
    | InputAudioBufferClearedEvent
    | InputAudioBufferTimeoutTriggeredEvent
    | ConversationItemAddedEvent
    | ConversationItemDoneEvent
    | ConversationItemTruncatedEvent
    | ConversationItemDeletedEvent
    | ConversationItemRetrievedEvent
    | ConversationItemInputAudioTranscriptionDeltaEvent
    | ConversationItemInputAudioTranscriptionCompletedEvent
    | ConversationItemInputAudioTranscriptionFailedEvent
    | ResponseCreatedEvent
    | ResponseDoneEvent
    | ResponseOutputItemAddedEvent
    | ResponseOutputItemDoneEvent
    | ResponseFunctionCallArgumentsDeltaEvent
    | ResponseFunctionCallArgumentsDoneEvent
    | ResponseContentPartAddedEvent
    | ResponseContentPartDoneEvent
    | ResponseOutputAudioTranscriptDeltaEvent
    | ResponseOutputAudioTranscriptDoneEvent
    | ResponseOutputAudioDeltaEvent
    | ResponseOutputAudioDoneEvent
    | ResponseOutputTextDeltaEvent
    | ResponseOutputTextDoneEvent
    | OutputAudioBufferStartedEvent
    | OutputAudioBufferStoppedEvent
    | OutputAudioBufferClearedEvent
    | PlaybackAcknowledgedEvent
    | SessionFinishedEvent,
    Field(discriminator="type"),
]
server_event_adapter: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)


def event_type(event: type[BaseModel]) -> str:
    """The wire ``type`` of a server event model, for code that reads events as JSON dicts."""
    return event.model_fields["type"].default


# -- the DashScope dialect ------------------------------------------------------------------
# Qwen's hosted qwen-omni realtime API (and its SDK, dashscope.audio.qwen_omni) speaks OpenAI's
# beta names. GA name → DashScope's; events not named here keep their names.
DASHSCOPE_EVENT_NAMES: dict[str, str] = {
    event_type(ConversationItemAddedEvent): "conversation.item.created",
    event_type(ResponseOutputAudioDeltaEvent): "response.audio.delta",
    event_type(ResponseOutputAudioDoneEvent): "response.audio.done",
    event_type(ResponseOutputAudioTranscriptDeltaEvent): "response.audio_transcript.delta",
    event_type(ResponseOutputAudioTranscriptDoneEvent): "response.audio_transcript.done",
    event_type(ResponseOutputTextDeltaEvent): "response.text.delta",
    event_type(ResponseOutputTextDoneEvent): "response.text.done",
}
# GA events DashScope has no counterpart for: not sent to its clients (``conversation.item.created``
# already told of the item; the media-track events are never sent over a WebSocket).
DASHSCOPE_UNSENT: frozenset[str] = frozenset({event_type(ConversationItemDoneEvent)})
