"""Server VAD turn detection: speech probabilities in, committed utterances out.

``TurnCommitBuffer`` is a synchronous state machine over (audio window, speech
probability) pairs; ``VoiceActivityDetector`` feeds it from any-size 16 kHz chunks
through a ``VadStream``. Every millisecond value counts from the first sample of the
session's input stream (OpenAI Realtime semantics), and is exact: windows are whole
samples, 16 per millisecond.

The rules, with the defaults of OpenAI's ``server_vad``:
- speech *onset* is the first window with probability >= ``threshold``;
- speech is *confirmed* once ``min_speech_ms`` of its windows have stayed at or above the
  hysteresis threshold ``threshold - 0.15``, dips shorter than ``ONSET_GAP_MS`` between
  them allowed (a stop consonant's closure: "Oak | Street" is two bursts); bursts that add
  up to less before such a gap (clicks, coughs) are dropped and never become turns.
  ``SpeechStarted`` is emitted at confirmation, with the onset's position, not the
  confirmation's;
- the utterance starts ``prefix_padding_ms`` before the onset (never before audio that
  was already committed or reset away), so ``SpeechStarted.audio_start_ms`` is the first
  sample the model gets, as in OpenAI's ``speech_started``;
- after confirmation, speech *ends* at the end of the last window at or above ``threshold``
  (the VAD's own best estimate of where it ended: windows between the two thresholds are
  unsure, and the first one below the hysteresis threshold comes 0-32 ms later), and the
  *silence* begins at the first window below ``threshold - 0.15``: that confirms the end (a
  window back at ``threshold`` or above cancels the wait). Server VAD commits the utterance
  ``silence_duration_ms`` after the end of speech, on the exact sample, once the silence is
  confirmed: the silence wait is OpenAI's "duration of silence after speech". The samples that
  complete it need not fill a 32 ms window: ``VoiceActivityDetector`` offers the samples past
  its last whole window (``TurnCommitBuffer.push_unscored``), which commit when they complete
  the wait in a silence already confirmed, and are then skipped when their window is scored
  (the 20 ms WebRTC packet that holds the wait's last sample commits, not the 32 ms window
  after it; before, the wait was counted in whole windows from the silence's first, 512 ms for
  500, plus the windows between the thresholds). The utterance is committed up to that
  sample, trailing silence included (after a run of unsure windows longer than the wait, up to
  the first window below the hysteresis threshold), the samples after it go to the next
  utterance, and ``SpeechStopped.audio_end_ms`` is that commit point;
- with an end-of-turn policy (``semantic_vad``), the silence does not end the utterance by
  itself (its checks and waits count from the silence's first window, as they were calibrated
  in tests/bench/turn_taking.py, and commit at whole windows or answers): when it reaches
  ``candidate_ms`` (and every ``rescore_ms`` after that) the buffer emits an ``EndOfTurnCheck``
  with the utterance so far; whoever runs the end-of-turn model answers with ``decide(check_id, probability)``. With ``judge_words``, a check of the words
  (``words``, not ``sound``) is emitted as the silence starts, its first quiet window (an ASR
  turn takes longer than the sound model, and is given that head start), answered with
  ``decide_words(check_id, probability)``: P(the transcript is a complete turn), or None when
  the judge failed. The rule, ``EndOfTurnPolicy``: the sound at or above
  ``threshold`` (``words_threshold`` when the words are judged) commits at once, up to the audio pushed by then, unless the words say "not
  finished" (below ``words_incomplete_below``; a sound-finished answer waits for the words when
  they were asked); the sound below ``confident_below``, or the words saying "not finished",
  hold the turn open for ``confident_wait_ms`` of silence; anything else waits ``max_wait_ms``
  (also the wait before any answer has come). Speech resuming makes a check stale (its answers
  are ignored); one sound check is in flight at a time; the wait reached commits whatever was said;
- speech going on past ``max_utterance_ms`` is cut into *segments*, not turns: each stretch of
  ``max_utterance_ms`` is handed on as a ``SegmentCommitted`` while the person is speaking
  (during a trailing silence the cut waits for the silence to end the turn or speech to
  resume, so a segment never ends in a pause) and the utterance goes on, contiguous: not one
  sample is lost or committed twice. ``UtteranceCommitted`` is the *end of the turn*;
- a turn reaching ``max_turn_ms`` of audio in all is ended anyway, with ``forced=True``; if the
  person is still speaking, a new utterance starts at the very next sample (no prefix:
  nothing is committed twice), announced by a new ``SpeechStarted``.
Each ``UtteranceCommitted`` is therefore preceded by one ``SpeechStarted``, any number of
``SegmentCommitted`` and one ``SpeechStopped`` of its own.

Candidates for a speculative answer (``app.realtime.speculation``), with ``candidates`` set: each
trailing silence of a confirmed utterance starts with a ``SilenceStarted`` (its first window below
the hysteresis threshold) carrying the utterance so far, as a commit then would hold it; a window
back at ``threshold`` before the silence ended the turn emits ``SpeechResumed`` (that candidate is void).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from media.rates import SPEECH_RATE
from media.vad import WINDOW_SAMPLES, SpeechModel

HYSTERESIS = 0.15  # speech ends below threshold - 0.15, as in silero's VADIterator
# Before speech is confirmed, a dip below the hysteresis threshold this long ends the onset:
# silero's own get_speech_timestamps ends a segment after 100 ms (min_silence_duration_ms) and
# only then weighs it against min_speech_duration_ms (250). A dip of one 32 ms window ended it
# here before, and a short phrase said as separate bursts ("Oak Street" after a pause, each
# burst 100-220 ms) was dropped whole: its words never reached a turn.
ONSET_GAP_MS = 100
_SAMPLES_PER_MS = SPEECH_RATE // 1000


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


TurnEvent = (
    SpeechStarted | SegmentCommitted | SpeechStopped | UtteranceCommitted | EndOfTurnCheck | SilenceStarted
    | SpeechResumed
)


class _State(enum.Enum):
    IDLE = "idle"  # no speech; only the last prefix_padding_ms of audio is kept
    PENDING = "pending"  # onset seen, min_speech_ms of speech not yet reached
    SPEECH = "speech"  # confirmed speech (SpeechStarted emitted), waiting for silence


def _ms(samples: int) -> int:
    return samples // _SAMPLES_PER_MS


class TurnCommitBuffer:
    """Turns (window, probability) pairs into speech events and committed utterances.

    Windows may have any non-zero length (the VAD uses 512 samples); positions are
    counted in samples, so no sample is lost or duplicated at any boundary.
    """

    def __init__(self, params: TurnDetectionParams) -> None:
        self.params = params  # may be replaced between pushes (session.update)
        self._state = _State.IDLE
        self._position = 0  # samples pushed so far, since the stream started
        self._chunks: list[np.ndarray] = []  # retained audio, contiguous, ends at _position
        self._buffer_start = 0  # stream position of the first retained sample
        self._onset = 0  # stream position where the current speech began
        self._onset_speech = 0  # samples of speech heard since the onset (PENDING)
        self._onset_gap = 0  # samples of the dip below the hysteresis threshold going on (PENDING)
        self._turn_start = 0  # stream position of the first sample of the turn's first segment
        self._silence_start: int | None = None  # where the current trailing silence began
        self._speech_end = 0  # stream position of the end of the last window at or above threshold
        # Samples committed before their window was scored (push_unscored): skipped when it comes.
        self._ahead = 0
        self._checks = 0  # end-of-turn checks emitted since the trailing silence began
        self._last_check_id = 0
        self._pending_check: int | None = None  # the check whose sound answer may still commit
        # What this silence's answers said (reset when speech resumes or the utterance ends).
        self._sound: float | None = None  # the latest sound answer
        self._words_check: int | None = None  # the check that asked for the words
        self._words_pending = False  # their answer has not come yet
        self._words: float | None = None  # P(complete turn) by the words; None: not asked, or failed
        self._hold_confident = False  # an answer said "not finished" with confidence: confident_wait_ms
        self._silence_events: list[TurnEvent] = []  # this window's SilenceStarted or SpeechResumed

    @property
    def in_speech(self) -> bool:
        """True between SpeechStarted and the commit (or reset) that ends the utterance."""
        return self._state is _State.SPEECH

    @property
    def hearing_speech(self) -> bool:
        """In an utterance and not in its trailing silence."""
        return self._state is _State.SPEECH and self._silence_start is None

    @property
    def speech_onset(self) -> int | None:
        """Stream position where the current speech began (pending or confirmed); None when idle."""
        return None if self._state is _State.IDLE else self._onset

    @property
    def audio_start(self) -> int:
        """Stream position of the first sample the current utterance would commit."""
        return self._buffer_start

    @property
    def utterance_samples(self) -> int:
        """Samples a commit now would hold (since the last segment), while in confirmed speech; else 0."""
        return self._position - self._buffer_start if self._state is _State.SPEECH else 0

    def utterance_audio(self) -> np.ndarray:
        """What a commit now would hold, as ``utterance_samples`` counts it (a copy)."""
        if self._state is not _State.SPEECH or not self._chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self._chunks)

    def forget_before(self, position: int) -> None:
        """Drop audio before ``position``; speech that began before it is dropped whole."""
        if self._state is not _State.IDLE and self._onset < position:
            self.reset()
        else:
            self._trim_before(position)
            self._turn_start = max(self._turn_start, self._buffer_start)

    def reset(self) -> None:
        """Drop buffered audio and speech state; positions keep counting from the stream start."""
        self._state = _State.IDLE
        self._chunks = []
        self._buffer_start = self._position
        self._silence_start = None
        self._forget_answers()

    def decide(self, check_id: int, probability: float) -> list[TurnEvent]:
        """The end-of-turn model's answer to an ``EndOfTurnCheck``: P(finished) by the sound.

        A stale answer (speech resumed, the utterance was committed or reset, or the policy was
        switched off since the check) changes nothing.
        """
        policy = self.params.end_of_turn
        if check_id != self._pending_check or policy is None:
            return []
        self._pending_check = None
        self._sound = probability
        return self._apply(policy)

    def decide_words(self, check_id: int, probability: float | None) -> list[TurnEvent]:
        """The text judge's answer to a check that asked for the words: P(the transcript is a
        complete turn), or None when the judge failed (the sound alone decides then)."""
        policy = self.params.end_of_turn
        if check_id != self._words_check or not self._words_pending or policy is None:
            return []
        self._words_pending = False
        self._words = probability
        return self._apply(policy)

    def _apply(self, policy: EndOfTurnPolicy) -> list[TurnEvent]:
        """The rule of ``EndOfTurnPolicy`` over what this silence's answers said so far."""
        sound, words = self._sound, self._words
        if (words is not None and words < policy.words_incomplete_below) or (
            sound is not None and sound < policy.confident_below
        ):
            self._hold_confident = True
            return []
        if sound is None or self._words_pending:
            return []
        if sound >= policy.threshold_for(judge_words=self.params.judge_words) or (
            policy.words_complete_at is not None and words is not None and words >= policy.words_complete_at
        ):
            return self._commit(forced=False)
        return []

    def _forget_answers(self) -> None:
        self._pending_check = None
        self._sound = None
        self._words_check = None
        self._words_pending = False
        self._words = None
        self._hold_confident = False

    def push_unscored(self, samples: np.ndarray) -> list[TurnEvent]:
        """Samples past the last whole window, not yet scored (they come again, first in the next
        window ``push`` gets). Server VAD commits with them when they complete its wait in a silence
        already confirmed: on the exact sample ``silence_duration_ms`` after the end of speech, not
        at the end of the 32 ms window holding it. Otherwise nothing changes and nothing is kept."""
        if (samples.ndim != 1 or self._state is not _State.SPEECH or self._silence_start is None
                or self.params.end_of_turn is not None):
            return []
        due = self._wait_due()
        if due > self._position + samples.size:
            return []
        taken = max(due - self._position, 0)
        if taken:
            self._chunks.append(np.array(samples[:taken], dtype=np.float32))
            self._position += taken
            self._ahead = taken
        return self._commit(forced=False)

    def push(self, window: np.ndarray, probability: float) -> list[TurnEvent]:
        events = self._push(window, probability)
        if self._silence_events:  # they come first: the window began (or ended) the silence first
            events, self._silence_events = self._silence_events + events, []
        return events

    def _push(self, window: np.ndarray, probability: float) -> list[TurnEvent]:
        if window.ndim != 1 or window.size == 0:
            raise ValueError(f"a window is a non-empty 1-D array, got shape {window.shape}")
        if self._ahead:
            skipped = min(self._ahead, window.size)  # committed already (push_unscored)
            self._ahead -= skipped
            window = window[skipped:]
            if window.size == 0:
                return []
        params = self.params
        window_start = self._position
        self._position += window.size
        self._chunks.append(np.array(window, dtype=np.float32))  # a copy: callers may reuse their buffer

        if self._state is _State.IDLE:
            if probability >= params.threshold:
                # The buffer already holds just the prefix: the audio before this window was
                # trimmed to prefix_padding_ms (or to the last commit/reset) as it came in.
                self._state = _State.PENDING
                self._onset = window_start
                self._onset_speech = self._onset_gap = 0
                self._speech_end = self._position
            else:
                self._trim_before(self._position - params.prefix_padding_ms * _SAMPLES_PER_MS)
                return []

        if self._state is _State.PENDING:
            if probability < params.negative_threshold:
                self._onset_gap += window.size
                if self._onset_gap >= ONSET_GAP_MS * _SAMPLES_PER_MS:
                    self._state = _State.IDLE  # too little speech before a gap: a click or a cough
                    self._trim_before(self._position - params.prefix_padding_ms * _SAMPLES_PER_MS)
                return []
            self._onset_gap = 0
            self._onset_speech += window.size
            if probability >= params.threshold:
                self._speech_end = self._position
            if self._onset_speech < params.min_speech_ms * _SAMPLES_PER_MS:
                return []
            self._state = _State.SPEECH
            self._silence_start = None
            self._turn_start = self._buffer_start
            return [SpeechStarted(audio_start_ms=_ms(self._buffer_start))]

        # _State.SPEECH
        if probability >= params.threshold:
            self._speech_end = self._position
            if self._silence_start is not None and params.candidates:
                self._silence_events.append(SpeechResumed(audio_ms=_ms(window_start)))
            self._silence_start = None
            self._forget_answers()  # the speaker went on: that silence's answers no longer apply
        elif probability < params.negative_threshold and self._silence_start is None:
            self._silence_start = window_start
            self._checks = 0
            self._forget_answers()
            if params.candidates:
                self._silence_events.append(SilenceStarted(np.concatenate(self._chunks), _ms(self._position)))
        if self._silence_start is not None:
            silence_ms = _ms(self._position - self._silence_start)
            policy = params.end_of_turn
            if policy is None and self._position >= self._wait_due():
                # On the wait's exact sample when it falls in this window, else (the unsure windows
                # before the silence outlasted the wait) up to the end of this one.
                due = self._wait_due()
                return self._commit(forced=False, end=due if due > window_start else self._position)
            if policy is not None and silence_ms >= self._wait_ms(policy):
                return self._commit(forced=False)
            checks: list[TurnEvent] = []
            if policy is not None and params.judge_words and self._words_check is None:
                checks.append(self._check(silence_ms, sound=False))
                self._words_check, self._words_pending = self._last_check_id, True
            if policy is not None and self._pending_check is None and self._check_due(policy, silence_ms):
                self._checks += 1
                checks.append(self._check(silence_ms, sound=True))
                self._pending_check = self._last_check_id
            if checks:
                return checks
        if self._position - self._turn_start >= params.max_turn_ms * _SAMPLES_PER_MS:
            return self._commit(forced=True)
        if (
            self._silence_start is None
            and self._position - self._buffer_start >= params.max_utterance_ms * _SAMPLES_PER_MS
        ):
            return [self._take_segment()]
        return []

    def _take_segment(self) -> SegmentCommitted:
        start, end = self._buffer_start, self._position
        segment = SegmentCommitted(pcm=np.concatenate(self._chunks), audio_start_ms=_ms(start), audio_end_ms=_ms(end))
        self._chunks = []
        self._buffer_start = end
        return segment

    def _check(self, silence_ms: int, *, sound: bool) -> EndOfTurnCheck:
        self._last_check_id += 1
        return EndOfTurnCheck(self._last_check_id, np.concatenate(self._chunks), silence_ms, sound=sound,
                              words=not sound)

    def _wait_due(self) -> int:
        """Server VAD: the stream position that completes the silence wait."""
        return self._speech_end + self.params.silence_duration_ms * _SAMPLES_PER_MS

    def _wait_ms(self, policy: EndOfTurnPolicy) -> int:
        """The silence that commits now: longer once an answer said "not finished" with confidence."""
        return policy.longest_wait_ms if self._hold_confident else policy.max_wait_ms

    def _check_due(self, policy: EndOfTurnPolicy, silence_ms: int) -> bool:
        if self._checks == 0:
            return silence_ms >= policy.candidate_ms
        return policy.rescore_ms > 0 and silence_ms >= policy.candidate_ms + self._checks * policy.rescore_ms

    def _silence_wait_ms(self) -> int:
        if self._silence_start is None:
            return 0
        if self.params.end_of_turn is None:
            return self.params.silence_duration_ms
        return _ms(self._position - self._silence_start)

    def _commit(self, *, forced: bool, end: int | None = None) -> list[TurnEvent]:
        """Commit the retained audio up to ``end`` (default: all of it); what follows is kept."""
        start = self._buffer_start
        end = self._position if end is None else end
        retained = np.concatenate(self._chunks)
        pcm, rest = retained[: end - start], retained[end - start :]
        events: list[TurnEvent] = [
            SpeechStopped(audio_end_ms=_ms(end)),
            UtteranceCommitted(pcm=pcm, audio_start_ms=_ms(start), audio_end_ms=_ms(end), forced=forced,
                               silence_wait_ms=0 if forced else self._silence_wait_ms()),
        ]
        self._forget_answers()
        self._chunks = [rest] if rest.size else []
        self._buffer_start = end
        if forced and self._silence_start is None:
            # Still talking: the next utterance begins at the next sample, already confirmed.
            self._turn_start = end
            self._speech_end = end
            events.append(SpeechStarted(audio_start_ms=_ms(end)))
        else:
            self._state = _State.IDLE
            self._silence_start = None
        return events

    def _trim_before(self, position: int) -> None:
        """Drop retained audio before ``position`` (never before what is already dropped)."""
        drop = position - self._buffer_start
        if drop <= 0:
            return
        self._buffer_start = position
        while drop > 0:
            head = self._chunks[0]
            if head.size <= drop:
                self._chunks.pop(0)
                drop -= head.size
            else:
                self._chunks[0] = head[drop:]
                drop = 0


class VoiceActivityDetector:
    """Any-size 16 kHz float32 chunks → 512-sample windows → silero VAD → TurnCommitBuffer.

    One per session. Samples that do not fill a window wait for the next chunk.
    """

    def __init__(self, vad: SpeechModel, params: TurnDetectionParams) -> None:
        self._stream = vad.new_stream()
        self._buffer = TurnCommitBuffer(params)
        self._pending = np.zeros(0, dtype=np.float32)

    @property
    def params(self) -> TurnDetectionParams:
        return self._buffer.params

    @property
    def in_speech(self) -> bool:
        return self._buffer.in_speech

    @property
    def hearing_speech(self) -> bool:
        return self._buffer.hearing_speech

    @property
    def speech_onset_sample(self) -> int | None:
        return self._buffer.speech_onset

    @property
    def audio_start_ms(self) -> int:
        return _ms(self._buffer.audio_start)

    @property
    def utterance_samples(self) -> int:
        """Samples of the utterance so far (since the last segment) while in confirmed speech; else 0."""
        return self._buffer.utterance_samples

    def utterance_audio(self) -> np.ndarray:
        """The utterance so far, as a commit now would hold it (partial transcripts)."""
        return self._buffer.utterance_audio()

    def forget_before(self, position: int) -> None:
        """Drop buffered audio before input sample ``position``; speech begun before it is dropped."""
        self._buffer.forget_before(position)

    def update(self, params: TurnDetectionParams) -> None:
        """New parameters apply from the next window; an utterance in progress carries on."""
        self._buffer.params = params

    def decide(self, check_id: int, probability: float) -> list[TurnEvent]:
        """The end-of-turn model's answer to an ``EndOfTurnCheck`` (see ``TurnCommitBuffer.decide``)."""
        return self._buffer.decide(check_id, probability)

    def decide_words(self, check_id: int, probability: float | None) -> list[TurnEvent]:
        """The text judge's answer to a check that asked for the words (``TurnCommitBuffer.decide_words``)."""
        return self._buffer.decide_words(check_id, probability)

    def push(self, pcm: np.ndarray) -> list[TurnEvent]:
        if pcm.ndim != 1 or not np.issubdtype(pcm.dtype, np.floating):
            raise ValueError(f"expected 1-D float 16 kHz mono PCM, got {pcm.dtype} array of shape {pcm.shape}")
        samples = np.concatenate([self._pending, pcm.astype(np.float32, copy=False)])
        whole = samples.size - samples.size % WINDOW_SAMPLES
        events: list[TurnEvent] = []
        for start in range(0, whole, WINDOW_SAMPLES):
            window = samples[start : start + WINDOW_SAMPLES]
            events.extend(self._buffer.push(window, self._stream.probability(window)))
        self._pending = samples[whole:]
        if self._pending.size:
            # They may complete server VAD's wait now, not when their window is complete.
            events.extend(self._buffer.push_unscored(self._pending))
        return events

    def reset(self) -> None:
        """Drop buffered audio and speech state (input_audio_buffer.clear, half-duplex discard).

        The VAD's recurrent state and the partial window are kept: they describe the
        continuous input stream, and zeroing the model mid-stream makes its next
        ~100 ms of probabilities unreliable.
        """
        self._buffer.reset()
