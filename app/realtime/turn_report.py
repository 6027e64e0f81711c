"""What a session tells an observer of its turns: typed reports, with the monotonic times they came from.

A :class:`SessionObserver` (``app.tracing``'s spans, ``app.turn_timelines``' timeline,
``app.recording``'s recorder, together through :class:`SessionObservers`, or none) hears a session start, each response end (:class:`TurnReport`,
at its ``response.done``), each answer's playback end (:class:`PlaybackReport`: played out, or
cut) and the session close; and what passes through it: every client event as received, every
server event as sent, the input audio as the session heard it and the answer's audio as written
to the call. The times are
``time.monotonic()`` seconds, the very ones the ``latency`` block of ``response.done`` is computed
from (``app.realtime.response.latency``), so whatever an observer draws from them matches it.
Every call is made on the session's event loop and must not block it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from app.realtime.protocol import ResponseLatency, ResponseStatus
from pipeline.contract import FinishReason, GenerationTimings, Usage

ToolCallStatus = Literal["completed", "incomplete"]


@dataclass(frozen=True)
class SessionStart:
    """A session announced itself (``session.created``)."""

    session_id: str
    conversation_id: str
    model: str  # the engine's name, as the session object reports it
    at: float


@dataclass(frozen=True)
class ToolCallReport:
    """One function call item the model wrote in a response."""

    item_id: str
    call_id: str
    name: str
    started_at: float  # the model began the call (its name known)
    ended_at: float  # the model wrote it whole, or the response ended with it unfinished
    status: ToolCallStatus


@dataclass(frozen=True)
class TurnReport:
    """One response as its ``response.done`` told it.

    ``started_at`` is the commit (server VAD) or ``response.create``; the user stopped speaking
    ``silence_wait_ms`` before it. ``engine_started_at``: the engine turn was submitted (before the
    commit for a speculative answer); ``timings`` are the engine's own, from that moment.
    ``first_audio_at``: the first frame handed to the transport (or the first chunk written to an
    output that does not report frames). ``audio_item_id``: the message whose audio was written,
    whose playback a :class:`PlaybackReport` ends; None when nothing of it is to be played.
    """

    response_id: str
    status: ResponseStatus
    status_reason: str | None
    error_code: str | None  # a failed one's status_details.error.code
    output_audio: bool
    temperature: float
    max_output_tokens: int | None
    started_at: float
    silence_wait_ms: float
    engine_started_at: float | None
    timings: GenerationTimings | None
    first_audio_at: float | None
    done_at: float
    latency: ResponseLatency | None
    usage: Usage | None
    finish_reason: FinishReason | None
    speculative: bool
    tool_calls: tuple[ToolCallReport, ...]
    audio_item_id: str | None


@dataclass(frozen=True)
class PlaybackReport:
    """One answer's audio is over: played out, or dropped unplayed (``truncated``).

    Samples are 24 kHz. ``interrupted``: the user's speech cut it (barge-in); ``truncated`` with it
    false: the client cleared the output or truncated the item.
    """

    response_id: str
    item_id: str
    ended_at: float
    played_samples: int
    written_samples: int
    truncated: bool
    interrupted: bool


class SessionObserver(Protocol):
    """Hears one session's turns (see the module docstring)."""

    def session_started(self, start: SessionStart) -> None: ...

    def turn_done(self, report: TurnReport) -> None: ...

    def playback_over(self, report: PlaybackReport) -> None: ...

    def session_closed(self, at: float) -> None:
        """The session is closed: every response has reported; playbacks not over never will be."""
        ...

    def client_event(self, raw: str | bytes, at: float) -> None:
        """A client event as received (before the session reads it; it may be refused)."""
        ...

    def server_event(self, event: Mapping[str, Any], at: float) -> None:
        """A server event as sent: the session's, or one its transport sent itself (a WebSocket's
        audio deltas, a refusal, the call's last word); the mapping is not changed afterwards."""
        ...

    def input_audio(self, pcm: np.ndarray) -> None:
        """16 kHz float32 mono input as the VAD and the model hear it (after noise suppression)."""
        ...

    def output_audio(self, pcm: np.ndarray) -> None:
        """24 kHz float32 mono answer audio as written to the call's output."""
        ...


class SessionObservers:
    """Several observers as one: each hears every call, in order."""

    def __init__(self, observers: Sequence[SessionObserver]) -> None:
        self._observers = tuple(observers)

    @staticmethod
    def of(*observers: SessionObserver | None) -> SessionObserver | None:
        """The observers given (None ones left out) as one, or None when there are none."""
        present = [observer for observer in observers if observer is not None]
        if not present:
            return None
        return present[0] if len(present) == 1 else SessionObservers(present)

    def session_started(self, start: SessionStart) -> None:
        for observer in self._observers:
            observer.session_started(start)

    def turn_done(self, report: TurnReport) -> None:
        for observer in self._observers:
            observer.turn_done(report)

    def playback_over(self, report: PlaybackReport) -> None:
        for observer in self._observers:
            observer.playback_over(report)

    def session_closed(self, at: float) -> None:
        for observer in self._observers:
            observer.session_closed(at)

    def client_event(self, raw: str | bytes, at: float) -> None:
        for observer in self._observers:
            observer.client_event(raw, at)

    def server_event(self, event: Mapping[str, Any], at: float) -> None:
        for observer in self._observers:
            observer.server_event(event, at)

    def input_audio(self, pcm: np.ndarray) -> None:
        for observer in self._observers:
            observer.input_audio(pcm)

    def output_audio(self, pcm: np.ndarray) -> None:
        for observer in self._observers:
            observer.output_audio(pcm)
