"""Server VAD turn detection: speech probabilities in, committed utterances out.

``TurnCommitBuffer`` is a synchronous state machine over (audio window, speech probability)
pairs; ``VoiceActivityDetector`` (``media.voice_activity_detector``) feeds it from any-size 16 kHz
chunks through a ``VadStream``. Positions are exact samples from the start of the session's input
stream. Each ``UtteranceCommitted`` (the end of a turn) is preceded by one ``SpeechStarted``, any
number of ``SegmentCommitted`` and one ``SpeechStopped`` of its own; with ``candidates`` set, a
trailing silence starts with ``SilenceStarted`` and speech back before the commit emits
``SpeechResumed``. The rules (onset, end, segments, the turn's limit, semantic_vad's checks):
docs/SESSION.md, "Turn detection" and "Turn detection to the sample".
"""

from __future__ import annotations

import enum

import numpy as np

from media.detector_events import (
    DetectorEvent,
    EndOfTurnCheck,
    SegmentCommitted,
    SilenceStarted,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    UtteranceCommitted,
)
from media.detector_params import EndOfTurnPolicy, TurnDetectionParams
from media.rates import SPEECH_RATE

# Before speech is confirmed, a dip below the hysteresis threshold this long ends the onset:
# silero's own get_speech_timestamps ends a segment after 100 ms (min_silence_duration_ms) and
# only then weighs it against min_speech_duration_ms (250). A dip of one 32 ms window ended it
# here before, and a short phrase said as separate bursts ("Oak Street" after a pause, each
# burst 100-220 ms) was dropped whole: its words never reached a turn.
ONSET_GAP_MS = 100
_SAMPLES_PER_MS = SPEECH_RATE // 1000


class _State(enum.Enum):
    IDLE = "idle"  # no speech; only the last prefix_padding_ms of audio is kept
    PENDING = "pending"  # onset seen, min_speech_ms of speech not yet reached
    SPEECH = "speech"  # confirmed speech (SpeechStarted emitted), waiting for silence


def samples_to_ms(samples: int) -> int:
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
        self._silence_events: list[DetectorEvent] = []  # this window's SilenceStarted or SpeechResumed

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
    def position(self) -> int:
        """Samples pushed so far, since the stream started."""
        return self._position

    @property
    def speech_heard_until(self) -> int | None:
        """Stream position of the end of the current utterance's last window at or above the
        threshold (pending or confirmed speech); None when idle."""
        return None if self._state is _State.IDLE else self._speech_end

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

    def decide(self, check_id: int, probability: float) -> list[DetectorEvent]:
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

    def decide_words(self, check_id: int, probability: float | None) -> list[DetectorEvent]:
        """The text judge's answer to a check that asked for the words: P(the transcript is a
        complete turn), or None when the judge failed (the sound alone decides then)."""
        policy = self.params.end_of_turn
        if check_id != self._words_check or not self._words_pending or policy is None:
            return []
        self._words_pending = False
        self._words = probability
        return self._apply(policy)

    def _apply(self, policy: EndOfTurnPolicy) -> list[DetectorEvent]:
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

    def push_unscored(self, samples: np.ndarray) -> list[DetectorEvent]:
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

    def push(self, window: np.ndarray, probability: float) -> list[DetectorEvent]:
        events = self._push(window, probability)
        if self._silence_events:  # they come first: the window began (or ended) the silence first
            events, self._silence_events = self._silence_events + events, []
        return events

    def _push(self, window: np.ndarray, probability: float) -> list[DetectorEvent]:
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
            return [SpeechStarted(audio_start_ms=samples_to_ms(self._buffer_start))]

        # _State.SPEECH
        if probability >= params.threshold:
            self._speech_end = self._position
            if self._silence_start is not None and params.candidates:
                self._silence_events.append(SpeechResumed(audio_ms=samples_to_ms(window_start)))
            self._silence_start = None
            self._forget_answers()  # the speaker went on: that silence's answers no longer apply
        elif probability < params.negative_threshold and self._silence_start is None:
            self._silence_start = window_start
            self._checks = 0
            self._forget_answers()
            if params.candidates:
                self._silence_events.append(SilenceStarted(np.concatenate(self._chunks), samples_to_ms(self._position)))
        if self._silence_start is not None:
            silence_ms = samples_to_ms(self._position - self._silence_start)
            policy = params.end_of_turn
            if policy is None and self._position >= self._wait_due():
                # On the wait's exact sample when it falls in this window, else (the unsure windows
                # before the silence outlasted the wait) up to the end of this one.
                due = self._wait_due()
                return self._commit(forced=False, end=due if due > window_start else self._position)
            if policy is not None and silence_ms >= self._wait_ms(policy):
                return self._commit(forced=False)
            checks: list[DetectorEvent] = []
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
        segment = SegmentCommitted(pcm=np.concatenate(self._chunks), audio_start_ms=samples_to_ms(start), audio_end_ms=samples_to_ms(end))
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
        return samples_to_ms(self._position - self._silence_start)

    def _commit(self, *, forced: bool, end: int | None = None) -> list[DetectorEvent]:
        """Commit the retained audio up to ``end`` (default: all of it); what follows is kept."""
        start = self._buffer_start
        end = self._position if end is None else end
        retained = np.concatenate(self._chunks)
        pcm, rest = retained[: end - start], retained[end - start :]
        events: list[DetectorEvent] = [
            SpeechStopped(audio_end_ms=samples_to_ms(end)),
            UtteranceCommitted(pcm=pcm, audio_start_ms=samples_to_ms(start), audio_end_ms=samples_to_ms(end), forced=forced,
                               silence_wait_ms=0 if forced else self._silence_wait_ms()),
        ]
        self._forget_answers()
        self._chunks = [rest] if rest.size else []
        self._buffer_start = end
        if forced and self._silence_start is None:
            # Still talking: the next utterance begins at the next sample, already confirmed.
            self._turn_start = end
            self._speech_end = end
            events.append(SpeechStarted(audio_start_ms=samples_to_ms(end)))
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
