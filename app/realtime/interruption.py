"""Interruption: whether speech over the playing answer is the user taking the turn.

Barge-in (``interrupt_response: true``) does not cancel the answer at the first sound. Speech
heard while the answer's audio plays *pauses* it at once (the first 32 ms window the VAD scores
as speech), and the speech is judged:

- it goes on for ``interrupt_min_speech_ms`` after the pause began: an interruption
  (:class:`Confirmed`); the answer is cancelled and truncated to what was heard, as before. While
  the answer is paused its echo dies out (a speakerphone's comes back within a few hundred ms),
  so speech heard that long after the pause is the user's, never the answer's own voice;
- it goes quiet for ``interrupt_resume_silence_ms`` first: a false interruption (a cough, a
  knock, a "mm-hmm", the answer's echo), and the answer plays on from where it paused
  (:class:`Resumed`); more speech in the same utterance pauses it again;
- the utterance ends without having been confirmed: a backchannel (:class:`Backchannel`): not a
  turn, nothing of it enters the history.

:class:`InterruptionJudge` is sans-IO: the detector's state in, :data:`InterruptionEvent` s out;
turn taking (``app.realtime.turn_taking``) carries them out. The rule, the defaults and the
measurements: docs/SESSION.md, "Interruptions".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from media.rates import SPEECH_RATE
from media.vad import WINDOW_SAMPLES


class JudgedSpeech(Enum):
    NONE = "none"  # no speech over the answer is being judged
    PAUSED = "paused"  # speech over the answer: its audio is paused while the speech is judged
    RESUMED = "resumed"  # the speech went quiet unconfirmed: the answer plays on; the utterance is open
    CONFIRMED = "confirmed"  # an interruption: the answer is cancelled


@dataclass(frozen=True)
class InterruptionRules:
    """``turn_detection``'s interruption settings, in 16 kHz samples."""

    min_speech_samples: int
    resume_silence_samples: int

    @classmethod
    def from_ms(cls, min_speech_ms: int, resume_silence_ms: int) -> InterruptionRules:
        return cls(min_speech_ms * SPEECH_RATE // 1000, resume_silence_ms * SPEECH_RATE // 1000)


@dataclass(frozen=True)
class Paused:
    """Speech over the playing answer: pause its audio."""


@dataclass(frozen=True)
class Resumed:
    """The speech went quiet before it was confirmed: the answer's audio plays on."""


@dataclass(frozen=True)
class Confirmed:
    """The speech is an interruption: announce it and cancel the answer."""


@dataclass(frozen=True)
class Backchannel:
    """An utterance over the answer ended without being confirmed: it is not a turn."""


InterruptionEvent = Paused | Resumed | Confirmed | Backchannel

# What a session reports of speech over its answers (metrics): a pause that played on, an
# utterance that was not a turn.
InterruptionOutcome = Literal["resumed", "backchannel"]
InterruptionObserver = Callable[[InterruptionOutcome], None]


class InterruptionJudge:
    """One session's judgement of speech over its answer, one utterance at a time.

    ``hear`` takes the detector's state after each push while the answer's audio is queued or
    playing; ``utterance_over`` the end of the utterance (committed or dropped)."""

    def __init__(self) -> None:
        self.state = JudgedSpeech.NONE
        self._paused_at = 0  # stream position of the window that paused the answer
        self._heard_until = 0  # the end of the last speech window acted on (pauses once per window)

    @property
    def judging(self) -> bool:
        """An utterance begun over the answer is being judged (not yet a turn, not yet dropped)."""
        return self.state in (JudgedSpeech.PAUSED, JudgedSpeech.RESUMED)

    @property
    def paused(self) -> bool:
        return self.state is JudgedSpeech.PAUSED

    def hear(self, *, speech_heard_until: int | None, position: int, in_speech: bool,
             rules: InterruptionRules) -> list[InterruptionEvent]:
        """The detector's state after a push, while the answer plays; ``speech_heard_until`` is None
        between utterances."""
        if self.state is JudgedSpeech.CONFIRMED:
            return []
        if speech_heard_until is None:
            # A sound too short to be speech (a click, a cough), dropped by the detector.
            events: list[InterruptionEvent] = [Resumed()] if self.paused else []
            self.state = JudgedSpeech.NONE
            return events
        events = []
        if self.state is not JudgedSpeech.PAUSED and speech_heard_until > self._heard_until:
            self.state = JudgedSpeech.PAUSED
            self._paused_at = speech_heard_until - WINDOW_SAMPLES
            events.append(Paused())
        self._heard_until = max(self._heard_until, speech_heard_until)
        if self.state is JudgedSpeech.PAUSED:
            if in_speech and speech_heard_until - self._paused_at >= rules.min_speech_samples:
                self.state = JudgedSpeech.CONFIRMED
                events.append(Confirmed())
            elif position - speech_heard_until >= rules.resume_silence_samples:
                self.state = JudgedSpeech.RESUMED
                events.append(Resumed())
        return events

    def begin(self, position: int) -> list[Paused]:
        """The detector confirmed speech over the playing answer (``speech_started``): judged from
        here if it was not yet (its first windows came before the answer played)."""
        if self.state is not JudgedSpeech.NONE:
            return []
        self.state = JudgedSpeech.PAUSED
        self._paused_at = self._heard_until = position
        return [Paused()]

    def utterance_over(self) -> list[Resumed | Backchannel]:
        """The utterance was committed: unconfirmed, it was a backchannel; the answer plays on."""
        events: list[Resumed | Backchannel] = []
        if self.state is JudgedSpeech.PAUSED:
            events.append(Resumed())
        if self.judging:
            events.append(Backchannel())
        self.state = JudgedSpeech.NONE
        return events

    def reset(self) -> None:
        """The answer is over or cleared: nothing is judged any more."""
        self.state = JudgedSpeech.NONE
