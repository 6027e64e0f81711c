"""The objects server events carry (every GA field present; optional ones are null): items and
their content, the session, and responses with their usage and latency."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from app.realtime.protocol.client_events import ImageDetail


class ServerModel(BaseModel):
    model_config = ConfigDict(extra="forbid")



# -- items ---------------------------------------------------------------------------------


class InputTextContent(ServerModel):
    type: Literal["input_text"] = "input_text"
    text: str


class InputAudioContent(ServerModel):
    type: Literal["input_audio"] = "input_audio"
    transcript: str | None = None  # set once input audio transcription completed (if the session asks)


class InputImageContent(ServerModel):
    type: Literal["input_image"] = "input_image"
    image_url: str | None = None  # never echoed (see app.realtime.protocol's docstring)
    detail: ImageDetail | None = None  # as the client gave it; None for a camera frame


class OutputTextContent(ServerModel):
    type: Literal["output_text"] = "output_text"
    text: str


class OutputAudioContent(ServerModel):
    type: Literal["output_audio"] = "output_audio"
    transcript: str


ItemContent = InputTextContent | InputAudioContent | InputImageContent | OutputTextContent | OutputAudioContent
ItemStatus = Literal["completed", "incomplete", "in_progress"]


class MessageItem(ServerModel):
    id: str
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus
    role: Literal["user", "assistant", "system"]
    content: list[ItemContent]


class FunctionCallItem(ServerModel):
    """A call the model made (or a client created): ``arguments`` is JSON text, as written."""

    id: str
    type: Literal["function_call"] = "function_call"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(ServerModel):
    id: str
    type: Literal["function_call_output"] = "function_call_output"
    object: Literal["realtime.item"] = "realtime.item"
    status: ItemStatus = "completed"
    call_id: str
    output: str


RealtimeItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class ContentPart(ServerModel):
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


class AudioFormat(ServerModel):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int | None = 24_000


class ServerVadObject(ServerModel):
    type: Literal["server_vad"] = "server_vad"
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    idle_timeout_ms: int | None
    create_response: bool
    interrupt_response: bool
    speculative_response: bool  # extension: answers start at a candidate end of turn
    interrupt_min_speech_ms: int  # extension: speech over the answer interrupts after this long
    interrupt_resume_silence_ms: int  # extension: quiet this long first, the paused answer plays on
    speech_floor_dbfs: float | None  # extension: speech quieter than this is another voice (null: off)
    speech_over_background_db: float | None  # extension: speech stands this far above the room (null: off)
    speech_under_user_db: float | None  # extension: speech no further below the user's own (null: off)


class SemanticVadObject(ServerModel):
    type: Literal["semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"]
    create_response: bool
    interrupt_response: bool
    speculative_response: bool  # extension: answers start at a candidate end of turn
    interrupt_min_speech_ms: int  # extension: speech over the answer interrupts after this long
    interrupt_resume_silence_ms: int  # extension: quiet this long first, the paused answer plays on
    speech_floor_dbfs: float | None  # extension: speech quieter than this is another voice (null: off)
    speech_over_background_db: float | None  # extension: speech stands this far above the room (null: off)
    speech_under_user_db: float | None  # extension: speech no further below the user's own (null: off)


class TranscriptionObject(ServerModel):
    """``audio.input.transcription``: the model named is reported; Qwen3-Omni itself transcribes."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    partials: bool = True  # an extension: partial transcripts while the user speaks (docs/SESSION.md)


class NoiseReductionObject(ServerModel):
    """``audio.input.noise_reduction``: WebRTC's noise suppressor on the input (docs/SESSION.md)."""

    type: Literal["near_field", "far_field"]


class SessionAudioInput(ServerModel):
    format: AudioFormat
    transcription: TranscriptionObject | None = None
    noise_reduction: NoiseReductionObject | None = None
    echo_cancellation: bool = True  # an extension: a WebRTC call takes the answer's echo out of the input
    turn_detection: ServerVadObject | SemanticVadObject | None


class SessionAudioOutput(ServerModel):
    format: AudioFormat
    voice: str
    speed: float = 1.0


class SessionAudio(ServerModel):
    input: SessionAudioInput
    output: SessionAudioOutput


class FunctionTool(ServerModel):
    """A function the model may call, as the session holds it (``session.tools``)."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any]


class ToolChoiceFunction(ServerModel):
    type: Literal["function"] = "function"
    name: str


class SessionVideo(ServerModel):
    """Extension: how frames of the call's video track (the camera) join user turns.

    Frames are sampled ``speaking_fps`` times a second while the user speaks and ``idle_fps``
    otherwise; a committed utterance takes the last ``frames_per_turn`` sampled while it was
    spoken plus the last one before it, each scaled to at most ``max_pixels``.
    """

    speaking_fps: float
    idle_fps: float
    frames_per_turn: int
    max_pixels: int


class SessionRecording(ServerModel):
    """Extension: whether this session is recorded (the server keeps recordings and the session
    did not ask not to be; docs/OPERATING.md "Recordings")."""

    enabled: bool


class TokenLimits(ServerModel):
    post_instructions: int | None = None


class RetentionRatioTruncation(ServerModel):
    """``truncation: {type: "retention_ratio", …}``: past the token limit, drop to this share of it."""

    type: Literal["retention_ratio"] = "retention_ratio"
    retention_ratio: float
    token_limits: TokenLimits | None = None


class SessionObject(ServerModel):
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
    recording: SessionRecording  # extension: whether the session is recorded


# -- responses -----------------------------------------------------------------------------


class StatusError(ServerModel):
    type: str
    code: str | None
    message: str | None = None


class StatusDetails(ServerModel):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: StatusError | None = None


class CachedTokensDetails(ServerModel):
    text_tokens: int = 0
    audio_tokens: int = 0
    image_tokens: int = 0


class InputTokenDetails(ServerModel):
    text_tokens: int
    audio_tokens: int
    image_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_details: CachedTokensDetails = Field(default_factory=CachedTokensDetails)


class OutputTokenDetails(ServerModel):
    text_tokens: int
    audio_tokens: int


class ResponseUsage(ServerModel):
    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: InputTokenDetails
    output_token_details: OutputTokenDetails


class ResponseAudioOutput(ServerModel):
    format: AudioFormat
    voice: str


class ResponseAudio(ServerModel):
    output: ResponseAudioOutput


ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]


class ResponseObject(ServerModel):
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


class NetworkLatency(ServerModel):
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


class ResponseLatency(ServerModel):
    """Extension: where the time from end of speech to the first audio went, in milliseconds.

    ``end_of_speech_to_first_audio_ms`` = ``silence_wait_ms`` (audio the VAD waited through
    before committing; 0 for client commits and text turns) + time from commit to the first
    audio frame handed to the transport (WebRTC: the outbound track's first frame of the answer;
    an output that does not report its frames: the first chunk handed to it). Of the latter,
    ``engine_first_audio_ms`` is the engine's own time to first audio (``GenerationTimings.first_audio``,
    including ``queue_wait_ms``) and ``other_ms`` the rest (session, transport to the engine
    process, event loop, and the wait for the outbound track's next frame slot).

    ``speculative``: the answer was started before the commit, at a candidate end of turn
    (``app.realtime.speculation``), and held until it. The engine's time to first audio is then
    split at the commit: ``speculation_hidden_ms`` ran before it (the user did not wait for it),
    ``engine_first_audio_ms`` is what was left after it (0 when the first audio was ready), so
    the two add up to the engine's own ``GenerationTimings.first_audio`` and the sum above still holds.
    """

    end_of_speech_to_first_audio_ms: float
    silence_wait_ms: float
    engine_first_audio_ms: float | None
    queue_wait_ms: float
    other_ms: float
    speculative: bool = False
    speculation_hidden_ms: float = 0.0
    network: NetworkLatency | None = None  # WebRTC calls: added by the call (app/transports/webrtc/network.py)
