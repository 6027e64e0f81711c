"""What a turn detector is told: server VAD's parameters (``TurnDetectionParams``) and semantic
VAD's end-of-turn policy (``EndOfTurnPolicy``). ``media.commit_buffer`` has the rules they drive."""

from __future__ import annotations

from dataclasses import dataclass, field

from media.speech_level import LevelRules

HYSTERESIS = 0.15  # speech ends below threshold - 0.15, as in silero's VADIterator


@dataclass(frozen=True)
class EndOfTurnPolicy:
    """When to ask the end-of-turn model, how sure it must be, and how long to wait at most.

    The wait follows the answer's confidence (docs/SESSION.md has the table per eagerness): a
    confident "not finished" is held for ``confident_wait_ms``, an unsure one for ``max_wait_ms``.
    """

    candidate_ms: int  # silence after speech before the first check
    rescore_ms: int  # further silence between checks while the model says "not finished"; 0: one check
    threshold: float  # P(finished) at or above which the utterance is committed
    max_wait_ms: int  # silence that commits when the model is unsure (or has not answered yet)
    confident_below: float = 0.0  # P(finished) below this is a confident "not finished"...
    confident_wait_ms: int = 0  # ...held open this long; also when the words say "not finished"
    words_incomplete_below: float = 0.1  # the words' P(complete turn) below this: "not finished"
    # The words' P(complete turn) at or above this commits a turn the sound is unsure of
    # (confident_below <= P(finished) < threshold); None: the words never commit by themselves.
    words_complete_at: float | None = None
    # The sound's threshold when the words are judged too (``judge_words``): their veto keeps a
    # lower one from cutting pauses, which the sound alone would (docs/SESSION.md); None: threshold.
    words_threshold: float | None = None

    def __post_init__(self) -> None:
        for name in ("threshold", "words_threshold"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not 0 < self.candidate_ms <= self.max_wait_ms or self.rescore_ms < 0:
            raise ValueError(f"need 0 < candidate_ms <= max_wait_ms and rescore_ms >= 0, got {self}")
        lowest = min(self.threshold, self.words_threshold if self.words_threshold is not None else 1.0)
        if not 0.0 <= self.confident_below <= lowest or not 0.0 <= self.words_incomplete_below <= 1.0:
            raise ValueError(
                f"need 0 <= confident_below <= threshold, words_threshold and words_incomplete_below in [0, 1], got {self}"
            )
        if self.confident_wait_ms and self.confident_wait_ms < self.max_wait_ms:
            raise ValueError(f"confident_wait_ms must be 0 or at least max_wait_ms, got {self}")

    @property
    def longest_wait_ms(self) -> int:
        """The most silence any answer holds a turn open: a forced commit comes by then."""
        return max(self.max_wait_ms, self.confident_wait_ms)

    def threshold_for(self, *, judge_words: bool) -> float:
        """P(finished) by the sound at or above which the utterance is committed."""
        return self.words_threshold if judge_words and self.words_threshold is not None else self.threshold


@dataclass(frozen=True)
class TurnDetectionParams:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500  # server VAD's wait; an end-of-turn policy replaces it
    min_speech_ms: int = 250
    max_utterance_ms: int = 30_000  # one segment of a longer utterance
    max_turn_ms: int = 120_000  # all segments of one turn; the session passes its history budget
    end_of_turn: EndOfTurnPolicy | None = None  # None: server VAD (silence alone ends a turn)
    # A text judge answers too (decide_words): each silence's first window asks for the words.
    judge_words: bool = False
    # Emit SilenceStarted and SpeechResumed: the candidates of speculative answers.
    candidates: bool = False
    # Which speech windows are the user's by their level (media.speech_level).
    levels: LevelRules = field(default_factory=LevelRules)

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        for name in ("prefix_padding_ms", "silence_duration_ms", "min_speech_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_utterance_ms <= self.min_speech_ms:
            raise ValueError(
                f"max_utterance_ms ({self.max_utterance_ms}) must exceed min_speech_ms ({self.min_speech_ms})"
            )
        if self.max_turn_ms < self.max_utterance_ms:
            raise ValueError(
                f"max_turn_ms ({self.max_turn_ms}) must be at least max_utterance_ms ({self.max_utterance_ms})"
            )

    @property
    def negative_threshold(self) -> float:
        return max(self.threshold - HYSTERESIS, 0.0)
