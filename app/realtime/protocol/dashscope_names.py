"""DashScope's names for server events: Qwen's hosted qwen-omni realtime API (and its SDK,
``dashscope.audio.qwen_omni``) speaks OpenAI's beta names (``app.transports.websocket.dashscope``)."""

from __future__ import annotations

from app.realtime.protocol.server_events import (
    ConversationItemAddedEvent,
    ConversationItemDoneEvent,
    ResponseOutputAudioDeltaEvent,
    ResponseOutputAudioDoneEvent,
    ResponseOutputAudioTranscriptDeltaEvent,
    ResponseOutputAudioTranscriptDoneEvent,
    ResponseOutputTextDeltaEvent,
    ResponseOutputTextDoneEvent,
)
from app.realtime.protocol.unions import event_type

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
