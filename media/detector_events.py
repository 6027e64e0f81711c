"""What a turn detector reports (``DetectorEvent``): speech started and stopped, segments and
utterances committed, end-of-turn checks to answer, and the silences that are candidates for a
speculative answer. ``media.commit_buffer`` says when each comes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int


@dataclass(frozen=True)
class SegmentCommitted:
    """``max_utterance_ms`` of an utterance that goes on: not the end of the turn."""

    pcm: np.ndarray  # float32, 16 kHz mono: exactly the input samples [audio_start_ms, audio_end_ms)
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True)
class UtteranceCommitted:
    """The end of the turn: its last (or only) segment."""

    pcm: np.ndarray  # float32, 16 kHz mono: exactly the input samples [audio_start_ms, audio_end_ms)
    audio_start_ms: int
    audio_end_ms: int
    forced: bool  # True when max_turn_ms ended the turn, not silence
    # The silence waited before committing: server VAD's silence_duration_ms; with an end-of-turn
    # policy, the trailing silence when the model (or max_wait_ms) decided; 0 when forced.
    silence_wait_ms: int = 0


@dataclass(frozen=True)
class SilenceStarted:
    """The first quiet window after speech: a candidate end of turn."""

    pcm: np.ndarray  # float32, 16 kHz mono: the utterance since the last segment, up to this window's end
    audio_end_ms: int


@dataclass(frozen=True)
class SpeechResumed:
    """Speech came back before the silence ended the turn: the silence's candidate is void."""

    audio_ms: int  # where the window that resumed it starts


@dataclass(frozen=True)
class EndOfTurnCheck:
    """Ask about ``pcm`` (the utterance so far): the end-of-turn model (``sound``: answer with
    ``decide``) or the text judge (``words``: answer with ``decide_words``)."""

    check_id: int
    pcm: np.ndarray  # since the last segment: the model looks at the last 8 s only
    silence_ms: int  # trailing silence included in pcm
    sound: bool = True
    words: bool = False


DetectorEvent = (
    SpeechStarted | SegmentCommitted | SpeechStopped | UtteranceCommitted | EndOfTurnCheck | SilenceStarted
    | SpeechResumed
)
