"""Recent sessions' turn timelines, kept in memory for the operator page (``GET /debug/turns``).

Each session this process carries gets a :class:`SessionTimeline`: a ``SessionObserver``
(``app.realtime.turn_report``) that also reads the events the session sends (``server_event``,
``record_event``).
It keeps, per turn, the marks of those events as the session sent them, the report's own times
(end of speech, engine start, first audio frame, playback end), the user's speech and the
answer's audio as spans, and the ``latency`` block. Times are ``time.monotonic()`` seconds
turned into ms since the session started. :class:`TurnTimelines` holds the last
``capacity`` sessions (a ring: the oldest is dropped), each with its last ``MAX_TURNS`` turns.
Everything runs on the event loop, in O(1) per event.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from app.realtime.turn_report import PlaybackReport, SessionStart, TurnReport
from media.rates import VOICE_RATE

RECENT_SESSIONS = 20  # the sessions GET /debug/turns shows
MAX_TURNS = 100  # per session: a long call keeps its last ones
MAX_PENDING_MARKS = 50  # marks not yet in a turn (speech that got no response)

# The events a turn's timeline marks, with their labels (the call page's, static/js/timeline.js).
MARKED_EVENTS: Mapping[str, str] = {
    "input_audio_buffer.speech_started": "speech started",
    "input_audio_buffer.speech_stopped": "speech stopped",
    "input_audio_buffer.committed": "committed",
    "response.created": "response created",
    "output_audio_buffer.started": "audio started",
    "output_audio_buffer.stopped": "audio stopped",
    "output_audio_buffer.cleared": "output cleared",
    "conversation.item.truncated": "truncated",
    "response.done": "response done",
}


@dataclass(frozen=True)
class Mark:
    kind: str  # an event type, or one of the report's: end_of_speech, engine_started, first_audio, playback_end, function_call
    label: str
    at_ms: float


@dataclass(frozen=True)
class Span:
    start_ms: float
    end_ms: float


@dataclass
class TimelineTurn:
    """One response's turn: its marks, the user's speech before it and its answer's audio."""

    response_id: str
    marks: list[Mark] = field(default_factory=list)
    status: str | None = None  # response.done's, once it came
    status_reason: str | None = None
    speculative: bool = False
    latency: dict[str, Any] | None = None  # response.done's latency block (``network``: a WebRTC call's figures)
    user_speech: Span | None = None  # speech started (or the end of speech, when not seen) to the end of speech
    answer_audio: Span | None = None  # the first frame handed to the transport to the playback's end
    played_ms: float | None = None
    truncated: bool = False


class SessionTimeline:
    """One session's turns, from its observer calls and the events it sends."""

    def __init__(self, transport: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.transport = transport
        self._clock = clock
        self.session_id = ""
        self.model = ""
        self.started_unix = time.time()
        self._started_at = clock()
        self.closed_ms: float | None = None
        self.turns: deque[TimelineTurn] = deque(maxlen=MAX_TURNS)
        self._by_response: dict[str, TimelineTurn] = {}
        self._pending: deque[Mark] = deque(maxlen=MAX_PENDING_MARKS)  # input marks awaiting their response

    def _ms(self, monotonic_s: float) -> float:
        return round((monotonic_s - self._started_at) * 1000, 1)

    def record_event(self, event: Mapping[str, Any]) -> None:
        """An event the session sends, as it sends it (the wire's JSON object)."""
        kind = event.get("type")
        if not isinstance(kind, str) or kind not in MARKED_EVENTS:
            return
        mark = Mark(kind, MARKED_EVENTS[kind], self._ms(self._clock()))
        response = event.get("response")
        response_id = response.get("id") if isinstance(response, Mapping) else event.get("response_id")
        if kind == "response.created" and isinstance(response_id, str):
            turn = TimelineTurn(response_id, marks=[*self._pending, mark])
            self._pending.clear()
            if len(self.turns) == self.turns.maxlen:
                self._by_response.pop(self.turns[0].response_id, None)
            self.turns.append(turn)
            self._by_response[response_id] = turn
        elif isinstance(response_id, str) and response_id in self._by_response:
            self._by_response[response_id].marks.append(mark)
        else:
            self._pending.append(mark)

    # -- SessionObserver -------------------------------------------------------------------

    def session_started(self, start: SessionStart) -> None:
        self.session_id, self.model = start.session_id, start.model
        self._started_at = start.at

    def turn_done(self, report: TurnReport) -> None:
        turn = self._by_response.get(report.response_id)
        if turn is None:
            return
        end_of_speech = report.started_at - report.silence_wait_ms / 1000
        turn.status, turn.status_reason, turn.speculative = report.status, report.status_reason, report.speculative
        turn.latency = report.latency.model_dump() if report.latency is not None else None
        if report.silence_wait_ms > 0:
            turn.marks.append(Mark("end_of_speech", "end of speech", self._ms(end_of_speech)))
            started = [m.at_ms for m in turn.marks if m.kind == "input_audio_buffer.speech_started"]
            turn.user_speech = Span(started[-1] if started else self._ms(end_of_speech), self._ms(end_of_speech))
        if report.engine_started_at is not None:
            turn.marks.append(Mark("engine_started", "engine started", self._ms(report.engine_started_at)))
        if report.first_audio_at is not None:
            turn.marks.append(Mark("first_audio", "first audio out", self._ms(report.first_audio_at)))
            # To the playback's end; when it has not reported yet, the response's end until it does
            # (a barge-in cuts the audio before the cancelled response reports).
            played = turn.answer_audio if turn.played_ms is not None else None
            end = played.end_ms if played is not None else self._ms(report.done_at)
            turn.answer_audio = Span(self._ms(report.first_audio_at), end)
        for call in report.tool_calls:
            turn.marks.append(Mark("function_call", f"call {call.name}", self._ms(call.ended_at)))

    def playback_over(self, report: PlaybackReport) -> None:
        turn = self._by_response.get(report.response_id)
        if turn is None:
            return
        end = self._ms(report.ended_at)
        turn.marks.append(Mark("playback_end", "playback cut" if report.truncated else "played out", end))
        start = turn.answer_audio.start_ms if turn.answer_audio is not None else end
        turn.answer_audio = Span(start, end)
        turn.played_ms = round(report.played_samples * 1000 / VOICE_RATE, 1)
        turn.truncated = report.truncated

    def session_closed(self, at: float) -> None:
        self.closed_ms = self._ms(at)

    def server_event(self, event: Mapping[str, Any], at: float) -> None:
        self.record_event(event)

    # The timeline's lanes are drawn from the reports and the events: the audio itself is not kept.
    def client_event(self, raw: str | bytes, at: float) -> None:
        pass

    def input_audio(self, pcm: np.ndarray) -> None:
        pass

    def output_audio(self, pcm: np.ndarray) -> None:
        pass

    def to_json(self) -> dict[str, Any]:
        turns = []
        for turn in self.turns:
            shown = asdict(turn)
            shown["marks"] = sorted(shown["marks"], key=lambda mark: mark["at_ms"])
            turns.append(shown)
        return {
            "session_id": self.session_id,
            "transport": self.transport,
            "model": self.model,
            "started_at": round(self.started_unix, 3),
            "closed_ms": self.closed_ms,
            "turns": turns,
        }


class TurnTimelines:
    """The last ``capacity`` sessions' timelines in this process, newest last."""

    def __init__(self, capacity: int = RECENT_SESSIONS) -> None:
        self._sessions: deque[SessionTimeline] = deque(maxlen=capacity)

    def new_session(self, transport: str) -> SessionTimeline:
        timeline = SessionTimeline(transport)
        self._sessions.append(timeline)
        return timeline

    def to_json(self) -> list[dict[str, Any]]:
        return [timeline.to_json() for timeline in self._sessions]
