"""Playback: the answers' audio on its way to the listener, and what of it was played.

- :class:`AudioOutput` is where the session writes 24 kHz float32 answer audio: the WebRTC
  call's paced outbound track, or the WebSocket's delta events. Each declares what it can tell:
  ``paced`` (it reports an answer's first frame leaving and the output running dry) and
  ``playback_reports`` (the client acknowledges what it played: ``playback.ack``).
- :class:`PlaybackLedger` holds each queued answer's stretch of the output's clock. The session
  writes one response's audio at a time, so an answer queued now is one contiguous stretch
  ``[segment_start, segment_start + segment_written)`` and what was heard of it is
  ``played_samples - segment_start``, clamped. When the output runs dry everything written has
  played, whatever the clock says (the track resamples 24 → 48 kHz and may be off by a sample
  or two). A clear drops unplayed audio: each answer keeps what had been heard then.
- :class:`AnswerAudio` sends ``output_audio_buffer.started`` / ``stopped`` / ``cleared`` and
  says which answers' playback is over (:class:`Settled`) and when the audio is over
  (:class:`AudioIdle`); the session takes those into the history as heard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.realtime.protocol import (
    OutputAudioBufferClearedEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
)


@dataclass
class AudioSegment:
    """One answer's audio on an output's clock (24 kHz samples since the session began)."""

    response_id: str
    item_id: str
    start: int
    written: int = 0

    @property
    def end(self) -> int:
        return self.start + self.written


class PlaybackReports(Protocol):
    """An output whose client reports what it played (``playback.ack``)."""

    def find(self, *, item_id: str | None, response_id: str | None) -> AudioSegment | None:
        """The answer an ack names; naming neither: the oldest not yet played out, else the last."""
        ...

    def acknowledge(self, segment: AudioSegment, played_samples: int) -> None:
        """The client has played ``played_samples`` of ``segment`` (and everything before it)."""
        ...

    def played_out(self, item_id: str) -> None:
        """The client stopped playing this answer (it truncated it): its playback is over."""
        ...


class AudioOutput(Protocol):
    """Where the assistant's 24 kHz float32 audio goes; ``media.outbound.OutboundAudioTrack`` is one.

    ``paced``: the output reports the first frame of audio written to it while idle
    (``on_playback_started``) and running dry (``on_playback_stopped``) to its listener.
    ``playback_reports``: the client's own account of what it played, where the transport has one.
    ``pause`` holds the queued audio where it stands (silence goes out, the clock stops) until
    ``resume``; ``clear`` also ends a pause. An output whose client plays the audio (the
    WebSocket's) cannot pause what it already sent.
    """

    @property
    def paced(self) -> bool: ...

    @property
    def playback_reports(self) -> PlaybackReports | None: ...

    def write(self, pcm: np.ndarray) -> None: ...

    def clear(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    @property
    def played_samples(self) -> int: ...

    def set_listener(self, listener: Any) -> None: ...


@dataclass
class Playback:
    """One assistant item's audio on the output's clock."""

    item_id: str
    response_id: str
    heard_before: int = 0  # samples played out before the output last ran dry
    segment_start: int | None = None  # clock position of the first sample queued since then
    segment_written: int = 0  # samples queued since the output last ran dry
    complete: bool = False  # the response has finished writing
    limit: int | None = None  # samples that count, after a cut or a client truncate
    unfinished: bool = False  # cleared before its response had written all its audio
    truncated: bool = False  # the client's conversation.item.truncate cut it (and was answered)

    @property
    def written(self) -> int:
        return self.heard_before + self.segment_written

    def heard(self, played_samples: int) -> int:
        segment = 0
        if self.segment_start is not None:
            segment = min(max(played_samples - self.segment_start, 0), self.segment_written)
        heard = self.heard_before + segment
        return heard if self.limit is None else min(heard, self.limit)

    def finished(self, played_samples: int) -> bool:
        """All written, and all of it played."""
        if not self.complete:
            return False
        return self.segment_start is None or played_samples >= self.segment_start + self.segment_written


class PlaybackLedger:
    """The items whose audio is queued or playing, oldest first; bounded by what is in flight."""

    def __init__(self) -> None:
        self._queue_end = 0  # output clock position right after the last queued sample
        self._open: dict[str, Playback] = {}

    def __len__(self) -> int:
        return len(self._open)

    def get(self, item_id: str) -> Playback | None:
        return self._open.get(item_id)

    def oldest(self) -> Playback | None:
        return next(iter(self._open.values()), None)

    def write(self, item_id: str, response_id: str, samples: int, played_samples: int) -> Playback:
        """Record ``samples`` more of ``item_id``'s audio, queued right after everything before it."""
        playback = self._open.get(item_id)
        if playback is None:
            playback = self._open[item_id] = Playback(item_id, response_id)
        if playback.segment_start is None:
            playback.segment_start = max(self._queue_end, played_samples)
            self._queue_end = playback.segment_start
        playback.segment_written += samples
        self._queue_end += samples
        return playback

    def complete(self, item_id: str) -> None:
        """The item's response has finished: no more audio will be written for it."""
        playback = self._open.get(item_id)
        if playback is not None:
            playback.complete = True

    def drained(self, played_samples: int) -> None:
        """The output ran dry: everything written so far has been played."""
        for playback in self._open.values():
            playback.heard_before += playback.segment_written
            playback.segment_written = 0
            playback.segment_start = None
        self._queue_end = played_samples

    def cut(self, played_samples: int) -> list[Playback]:
        """The output dropped everything unplayed: each open item keeps what was heard; all close."""
        cut = list(self._open.values())
        for playback in cut:
            playback.limit = playback.heard(played_samples)
            playback.unfinished = not playback.complete
            playback.complete = True
        self._open.clear()
        self._queue_end = played_samples
        return cut

    def pop_finished(self, played_samples: int) -> list[Playback]:
        """Items whose response has finished and whose audio has all been played, oldest first."""
        finished = [playback for playback in self._open.values() if playback.finished(played_samples)]
        for playback in finished:
            del self._open[playback.item_id]
        return finished




@dataclass(frozen=True)
class Settled:
    """Answers whose playback is over (played out, or cut at ``played``): the history takes
    them as heard (``History.settle_all``)."""

    playbacks: list[Playback]
    played: int


@dataclass(frozen=True)
class AudioIdle:
    """The answers' audio is over: played out, or cleared."""


PlaybackEvent = (
    OutputAudioBufferStartedEvent | OutputAudioBufferStoppedEvent | OutputAudioBufferClearedEvent | Settled | AudioIdle
)


class AnswerAudio:
    """The session's output and ledger: writes answers' audio and says what its playback did."""

    def __init__(self, output: AudioOutput, on_written: Callable[[np.ndarray], None] | None = None) -> None:
        """``on_written``: each chunk of answer audio as it is written to ``output`` (a recording)."""
        self.output = output
        self._on_written = on_written
        self.ledger = PlaybackLedger()
        self._speaking_response_id: str | None = None  # output_audio_buffer.started sent
        self.last_response_id: str | None = None  # the latest response started (cleared names it)
        self._clearing = False  # inside output.clear(), whose stop callback is not a drain

    def __len__(self) -> int:
        """Answers whose audio is written and not yet played out."""
        return len(self.ledger)

    def idle_and_paced(self) -> bool:
        """Nothing is queued and the output is paced: it will report the next audio's first frame
        (``on_playback_started``)."""
        return len(self.ledger) == 0 and self.output.paced

    def write(self, response_id: str, item_id: str, pcm: np.ndarray) -> None:
        """Queue response ``response_id``'s audio for its item ``item_id``."""
        self.ledger.write(item_id, response_id, pcm.size, self.output.played_samples)
        self.output.write(pcm)
        if self._on_written is not None:
            self._on_written(pcm)

    def started(self) -> OutputAudioBufferStartedEvent | None:
        """The output sent a first frame after being idle: ``output_audio_buffer.started`` when
        this starts the assistant speaking, else None."""
        if self._speaking_response_id is not None:
            return None
        playback = self.ledger.oldest()
        if playback is None:
            return None
        self._speaking_response_id = playback.response_id
        return OutputAudioBufferStartedEvent(response_id=playback.response_id)

    def stopped(self) -> list[PlaybackEvent]:
        """The output ran dry: everything written has played."""
        if self._clearing:
            return []  # a clear is accounted for by clear() itself
        self.ledger.drained(self.output.played_samples)
        return self.settle()

    def settle(self) -> list[PlaybackEvent]:
        """Retire answers whose audio has played out; announce when the assistant stopped speaking."""
        played = self.output.played_samples
        finished = self.ledger.pop_finished(played)
        events: list[PlaybackEvent] = [Settled(finished, played)] if finished else []
        if len(self.ledger) == 0:
            if self._speaking_response_id is not None:
                response_id = finished[-1].response_id if finished else self._speaking_response_id
                self._speaking_response_id = None
                events.append(OutputAudioBufferStoppedEvent(response_id=response_id))
            events.append(AudioIdle())
        return events

    def pause(self) -> None:
        """Speech over the answer is being judged: hold its audio where it stands."""
        self.output.pause()

    def resume(self) -> None:
        """It was not an interruption: the answer plays on from where it paused."""
        self.output.resume()

    def clear(self, *, always_announce: bool) -> list[PlaybackEvent]:
        """Drop unplayed audio; answers keep what was heard (``conversation.item.truncated``)."""
        had_audio = len(self.ledger) > 0
        self._clearing = True
        try:
            self.output.clear()
        finally:
            self._clearing = False
        played = self.output.played_samples
        cut = self.ledger.cut(played)
        response_id = cut[0].response_id if cut else self.last_response_id
        events: list[PlaybackEvent] = []
        if (had_audio or always_announce) and response_id is not None:
            events.append(OutputAudioBufferClearedEvent(response_id=response_id))
        self._speaking_response_id = None
        if cut:
            events.append(Settled(cut, played))
        events.append(AudioIdle())
        return events
