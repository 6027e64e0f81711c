"""One utterance and the answer to it, as both headless clients report it, and the tests on
server events that both use to find a turn's parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.realtime.protocol import (
    ConversationItemDoneEvent,
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionFailedEvent,
    InputAudioBufferCommittedEvent,
    ResponseOutputAudioTranscriptDoneEvent,
    ResponseOutputTextDoneEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
    event_type,
)
from media.rates import WIRE_RATE


@dataclass
class TurnResult:
    """One utterance and the answer to it."""

    events: list[dict[str, Any]]  # the server events of this turn, in arrival order
    response: dict[str, Any]  # the response object of response.done
    audio: np.ndarray  # answer audio as received: float32 mono, 48 kHz, first to last audible frame
    latency_s: float | None  # last utterance sample sent -> first audible frame received
    spoken_at: float = 0.0  # monotonic time the utterance's last sample was sent (WebRTC client)
    # Where the utterance began in the microphone's stream (ms of audio sent before it, silence
    # included; WebRTC client): against the server's audio_start_ms it shows how much was heard.
    spoken_from_ms: float = 0.0
    # Seconds of audible frames in ``audio``; less than its length when playback stalled (the
    # engine fell behind real time) or the answer pauses.
    audible_seconds: float = 0.0
    sample_rate: int = WIRE_RATE

    @property
    def status(self) -> str:
        return str(self.response.get("status"))

    @property
    def transcript(self) -> str:
        for event in self.events:
            if event["type"] == event_type(ResponseOutputAudioTranscriptDoneEvent):
                return str(event.get("transcript", ""))
            if event["type"] == event_type(ResponseOutputTextDoneEvent):
                return str(event.get("text", ""))
        return ""

    @property
    def user_transcript(self) -> str | None:
        """What the user said, as the server transcribed it; None when not transcribed (or it failed)."""
        committed = committed_item(self.events)
        for event in self.events:
            if (
                event["type"] == event_type(ConversationItemInputAudioTranscriptionCompletedEvent)
                and event.get("item_id") == committed
            ):
                return str(event.get("transcript", ""))
        return None

    @property
    def audio_seconds(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def usage(self) -> dict[str, Any]:
        return dict(self.response.get("usage") or {})

    @property
    def images_shown(self) -> int:
        """Camera frames (``input_image`` parts) the server put into the committed utterance's item."""
        committed = committed_item(self.events)
        for event in self.events:
            item = event.get("item") or {}
            if event["type"] == event_type(ConversationItemDoneEvent) and item.get("id") == committed:
                return sum(part.get("type") == "input_image" for part in item.get("content", []))
        return 0

    def event_types(self) -> list[str]:
        return [event["type"] for event in self.events]


def session_transcribes(events: list[dict[str, Any]]) -> bool:
    """Whether the session, as last announced among ``events``, transcribes input audio."""
    announced = (event_type(SessionCreatedEvent), event_type(SessionUpdatedEvent))
    for event in reversed(events):
        if event.get("type") in announced:
            audio_input = (event.get("session") or {}).get("audio", {}).get("input") or {}
            return audio_input.get("transcription") is not None
    return False


def committed_item(events: list[dict[str, Any]]) -> str | None:
    """The user item the server committed first among ``events``."""
    for event in events:
        if event.get("type") == event_type(InputAudioBufferCommittedEvent):
            return event.get("item_id")
    return None


def transcription_ended(event: dict[str, Any], item_id: str) -> bool:
    """``event`` ends the transcription of ``item_id`` (completed or failed)."""
    ended = (
        event_type(ConversationItemInputAudioTranscriptionCompletedEvent),
        event_type(ConversationItemInputAudioTranscriptionFailedEvent),
    )
    return event.get("type") in ended and event.get("item_id") == item_id
