"""Server events: one model per event the server sends, each with every field of the GA schema
(optional ones as ``null``), because OpenAI's own clients validate strictly and drop events that
miss fields. Their union is ``app.realtime.protocol.unions``'s."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from app.realtime.protocol.ids import new_event_id
from app.realtime.protocol.objects import (
    ContentPart,
    RealtimeItem,
    ResponseLatency,
    ResponseObject,
    ServerModel,
    SessionObject,
)


class _ServerEventBase(ServerModel):
    event_id: str = Field(default_factory=new_event_id)

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict that goes on the data channel."""
        return self.model_dump(mode="json")


# -- the events ----------------------------------------------------------------------------


class ErrorDetails(ServerModel):
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


class TranscriptionInputTokenDetails(ServerModel):
    text_tokens: int
    audio_tokens: int


class TranscriptionUsage(ServerModel):
    """Token usage of one transcription (OpenAI's ``tokens`` variant)."""

    type: Literal["tokens"] = "tokens"
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: TranscriptionInputTokenDetails


class TranscriptionError(ServerModel):
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


class PlaybackAcknowledgement(ServerModel):
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
