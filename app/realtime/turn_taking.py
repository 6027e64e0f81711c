"""Server-VAD turn taking: what the voice activity detector's events mean for the conversation.

While ``turn_detection`` is on, the session hands its 16 kHz input to :class:`TurnTaking`,
which runs the detector (``media.commit_buffer``) and acts through the session
(:class:`TurnActions`):

- speech starts: ``input_audio_buffer.speech_started`` (with the id of the user item to come)
  and, with ``interrupt_response: true``, barge-in while the assistant is busy;
- a *segment* (speech going on past ``max_utterance_ms``, 30 s): the audio so far is committed
  as a user item (``input_audio_buffer.committed`` and the item events) and listening goes on
  with a new item id; nothing is answered;
- the *end of the turn* (the silence wait): ``speech_stopped``, the last segment committed and,
  with ``create_response``, a response whose prompt holds every segment in order. A turn that
  reaches :func:`max_turn_ms` of audio (120 s) is ended there: an ``error``
  (``turn_audio_limit_reached``) names the limit, and what was said is answered;
- semantic VAD: the detector asks for end-of-turn checks (``EndOfTurnCheck``), which the
  session scores off the event loop (``app.realtime.semantic_vad``) and answers with ``decide``;
- a candidate end of turn (the silence's first quiet window, ``SilenceStarted``) and its end by
  resumed speech (``SpeechResumed``) go to the session's speculation (``app.realtime.speculation``),
  as long as the speech is acted on;
- half-duplex (``interrupt_response: false``): from a response's start until its audio has
  played out, plus ``ECHO_TAIL_MS``, speech is heard but not acted on. Each such utterance is
  reported (``on_ignored_speech``, for metrics) and logged at debug with the session id. The
  tail suppresses echo, not the user: speech whose onset the VAD puts inside the tail (at or
  after the answer's last frame, give or take one 32 ms window) and that is still going on when
  the tail ends is a quick reply, and a user turn; its audio starts where the speech started
  (less the prefix padding, never before the answer's last frame). A short blip confined to
  the tail has gone quiet by then and is dropped when it ends;
- ``idle_timeout_ms``: no speech for that long after the assistant's audio ended prompts a response.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.realtime.protocol import (
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    InputAudioBufferTimeoutTriggeredEvent,
    ProtocolError,
    ServerEvent,
    new_id,
)
from app.realtime.semantic_vad import END_OF_TURN_BY_EAGERNESS
from app.realtime.session_config import TurnDetection
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
from media.detector_params import TurnDetectionParams
from media.rates import SPEECH_RATE
from media.vad import WINDOW_SAMPLES, SpeechModel
from media.voice_activity_detector import VoiceActivityDetector
from pipeline.conversation import HistoryLimits

logger = logging.getLogger(__name__)

# After the assistant's audio has been sent, its tail is still in the browser's jitter buffer
# and speaker, and its echo reaches the microphone ~100-300 ms later; half-duplex keeps not
# listening for this long so that tail is not heard as the user.
ECHO_TAIL_MS = 400
# What an idle user "said" when idle_timeout_ms triggers a response: a second of silence.
IDLE_CLIP_MS = 1_000
TURN_LIMIT_CODE = "turn_audio_limit_reached"


def max_turn_ms(history: HistoryLimits) -> int:
    """The most audio one user turn may hold: the history's audio budget (120 s by default,
    four 30 s segments), so that the turn, once answered, still fits the next prompt whole."""
    return int(history.max_audio_seconds * 1000)


def detector_params(
    turn_detection: TurnDetection, history: HistoryLimits, *, judge_words: bool = False
) -> TurnDetectionParams:
    """The detector's settings, built here only: the session's turn detection (semantic VAD's
    policy by its eagerness, ``app.realtime.semantic_vad``), with the turn bounded by the history (a
    smaller history budget shortens the segments too); ``judge_words``: a text judge answers
    semantic VAD's checks too; candidates for speculative answers when the session speculates."""
    end_of_turn = END_OF_TURN_BY_EAGERNESS[turn_detection.eagerness] if turn_detection.type == "semantic_vad" else None
    limit = max_turn_ms(history)
    return TurnDetectionParams(
        threshold=turn_detection.threshold,
        prefix_padding_ms=turn_detection.prefix_padding_ms,
        silence_duration_ms=turn_detection.silence_duration_ms,
        end_of_turn=end_of_turn,
        max_turn_ms=limit,
        max_utterance_ms=min(TurnDetectionParams.max_utterance_ms, limit),
        judge_words=judge_words and end_of_turn is not None,
        candidates=turn_detection.speculative_response,
    )


@dataclass(frozen=True)
class SpeechSoFar:
    """The user item being spoken (announced by ``speech_started``): what its partial transcripts
    follow (``app.realtime.partial_transcripts``)."""

    item_id: str
    samples: int  # 16 kHz samples a commit now would hold
    hearing: bool  # speech goes on (False: in a trailing silence)
    audio: Callable[[], np.ndarray]  # those samples (a copy, made when called)


@dataclass(frozen=True)
class TurnActions:
    """What turn taking asks of the session."""

    emit: Callable[[ServerEvent], None]
    commit: Callable[[str, np.ndarray], None]  # a user item holding this audio
    busy: Callable[[], bool]  # answering, or its audio has not finished playing
    interrupt: Callable[[], None]  # barge-in: cancel, clear the output, truncate
    respond: Callable[[str, float, float], None]  # (item id, committed at, silence wait ms)
    check_end_of_turn: Callable[[EndOfTurnCheck], None] | None = None  # semantic VAD: score, then decide()
    # True once the user's speech is acted on (speech_started sent), False once it is committed
    # or dropped: the camera samples faster meanwhile and keeps the frames for the turn.
    speaking: Callable[[bool], None] | None = None
    candidate: Callable[[np.ndarray], None] | None = None  # a candidate end of turn: the utterance so far
    resumed: Callable[[], None] | None = None  # speech came back: the candidate is void


class TurnTaking:
    """One session's server-VAD state: the detector, the user item being spoken, half-duplex."""

    def __init__(
        self,
        vad: SpeechModel,
        params: TurnDetectionParams,
        actions: TurnActions,
        *,
        session_id: str,
        on_ignored_speech: Callable[[], None] | None = None,
        judge_words: bool = False,
    ) -> None:
        self._judge_words = judge_words  # a text judge answers semantic VAD's checks too (decide_words)
        self._detector = VoiceActivityDetector(vad, params)
        self._act = actions
        self._session_id = session_id
        self._on_ignored_speech = on_ignored_speech
        self.input_samples = 0  # 16 kHz samples pushed since the session started
        self._speech_item_id: str | None = None  # the user item announced by speech_started
        self._user_speaking = False  # between SpeechStarted and its commit
        # Half-duplex: input is not acted on while this is set (see ECHO_TAIL_MS).
        self._deaf = False
        self._deaf_until_sample: int | None = None  # when listening may resume, once idle
        self._ignored_reported = False  # the utterance half-duplex is dropping was counted
        self._idle_since_sample: int | None = None  # the assistant's audio ended here (idle_timeout_ms)

    def push(self, pcm: np.ndarray, turn_detection: TurnDetection) -> None:
        self.input_samples += pcm.size
        self._handle(self._detector.push(pcm), turn_detection)
        self._maybe_listen_again()
        self._maybe_time_out(turn_detection)

    def decide(self, check_id: int, probability: float, turn_detection: TurnDetection) -> None:
        """The end-of-turn model's answer to a check (semantic VAD); a stale one changes nothing."""
        self._handle(self._detector.decide(check_id, probability), turn_detection)

    def decide_words(self, check_id: int, probability: float | None, turn_detection: TurnDetection) -> None:
        """The text judge's answer to a check (semantic VAD); a stale one changes nothing."""
        self._handle(self._detector.decide_words(check_id, probability), turn_detection)

    def _handle(self, events: list[DetectorEvent], turn_detection: TurnDetection) -> None:
        for event in events:
            if isinstance(event, SpeechStarted):
                self._on_speech_started(event, turn_detection)
            elif isinstance(event, SegmentCommitted):
                self._on_segment(event)
            elif isinstance(event, SpeechStopped):
                self._on_speech_stopped(event)
            elif isinstance(event, UtteranceCommitted):
                self._on_utterance_committed(event, turn_detection)
            elif isinstance(event, EndOfTurnCheck) and event.words and self._deaf:
                # Speech heard while the assistant answers is mostly its echo: its words are not
                # worth an engine turn. No judgement: the sound decides (a quick reply included).
                self._handle(self._detector.decide_words(event.check_id, None), turn_detection)
            elif isinstance(event, EndOfTurnCheck) and self._act.check_end_of_turn is not None:
                self._act.check_end_of_turn(event)
            elif isinstance(event, SilenceStarted) and not self._deaf and self._act.candidate is not None:
                self._act.candidate(event.pcm)
            elif isinstance(event, SpeechResumed) and not self._deaf and self._act.resumed is not None:
                self._act.resumed()

    def speech_so_far(self) -> SpeechSoFar | None:
        """The user item being spoken and acted on, as a commit now would hold it; None between
        utterances, and while half-duplex is not acting on speech."""
        item_id = self._speech_item_id
        detector = self._detector
        if self._deaf or item_id is None or not detector.in_speech:
            return None
        return SpeechSoFar(item_id, detector.utterance_samples, detector.hearing_speech, detector.utterance_audio)

    def skip(self, samples: int) -> None:
        """Input that server VAD does not see (manual mode): the input clock goes on."""
        self.input_samples += samples

    def configure(self, new: TurnDetection | None, history: HistoryLimits) -> None:
        """``turn_detection`` changed (``session.update``)."""
        if new is None:
            self.clear()
        else:
            self._detector.update(detector_params(new, history, judge_words=self._judge_words))
        if new is None or new.interrupt_response:
            self._deaf = False
            self._deaf_until_sample = None

    def clear(self) -> None:
        """Drop what the detector holds (``input_audio_buffer.clear``, manual mode)."""
        self._detector.reset()
        self._speech_item_id = None
        self._user_speaking = False
        self._ignored_reported = False
        self._tell_speaking(False)

    def _tell_speaking(self, speaking: bool) -> None:
        if self._act.speaking is not None:
            self._act.speaking(speaking)

    def response_started(self, turn_detection: TurnDetection | None) -> None:
        self._idle_since_sample = None
        if turn_detection is not None and not turn_detection.interrupt_response:
            self._deaf = True
            self._deaf_until_sample = None

    def idle(self) -> None:
        """The assistant has finished speaking (or answering without audio)."""
        self._idle_since_sample = self.input_samples
        if self._deaf:
            self._deaf_until_sample = self.input_samples + ECHO_TAIL_MS * SPEECH_RATE // 1000

    # -- detector events -------------------------------------------------------------------

    def _on_speech_started(self, event: SpeechStarted, turn_detection: TurnDetection) -> None:
        self._user_speaking = True
        self._idle_since_sample = None
        if self._deaf:
            if self._deaf_until_sample is None:  # in the echo tail it may be a quick reply: judged later
                self._ignore(event.audio_start_ms)
            return
        self._speech_item_id = new_id("item")
        self._act.emit(
            InputAudioBufferSpeechStartedEvent(audio_start_ms=event.audio_start_ms, item_id=self._speech_item_id)
        )
        self._tell_speaking(True)
        if turn_detection.interrupt_response and self._act.busy():
            self._act.interrupt()

    def _on_segment(self, event: SegmentCommitted) -> None:
        if self._deaf:
            return
        self._act.commit(self._speech_item_id or new_id("item"), event.pcm)
        self._speech_item_id = new_id("item")  # the rest of the utterance is the next item

    def _on_speech_stopped(self, event: SpeechStopped) -> None:
        if self._deaf:
            return
        if self._speech_item_id is None:
            self._speech_item_id = new_id("item")
        self._act.emit(InputAudioBufferSpeechStoppedEvent(audio_end_ms=event.audio_end_ms, item_id=self._speech_item_id))

    def _on_utterance_committed(self, event: UtteranceCommitted, turn_detection: TurnDetection) -> None:
        self._user_speaking = False
        if self._deaf:
            if not self._ignored_reported:
                self._ignore(event.audio_start_ms)
            self._ignored_reported = False
            self._tell_speaking(False)
            return
        committed_at = time.monotonic()
        item_id = self._speech_item_id or new_id("item")
        self._speech_item_id = None
        if event.forced:
            limit_s = self._detector.params.max_turn_ms / 1000
            self._act.emit(ProtocolError(
                TURN_LIMIT_CODE,
                f"The user turn reached the maximum of {limit_s:g} s of audio; what was said up to "
                f"{event.audio_end_ms} ms is answered now; speech after that point is not part of this turn.",
            ).to_event())
        self._act.commit(item_id, event.pcm)
        self._tell_speaking(False)
        if not turn_detection.create_response:
            return
        # The VAD committed when the silence wait ended: the input stream is there now (give or
        # take the rest of this chunk, <= 20 ms from WebRTC).
        self._act.respond(item_id, committed_at, float(event.silence_wait_ms))

    # -- half-duplex and idle ----------------------------------------------------------------

    def _ignore(self, audio_start_ms: int) -> None:
        """Half-duplex does not act on this utterance: log and count it, once."""
        logger.debug("session %s: speech at %d ms not acted on: the assistant is answering (half-duplex)",
                     self._session_id, audio_start_ms)
        self._ignored_reported = True
        if self._on_ignored_speech is not None:
            self._on_ignored_speech()

    def _maybe_listen_again(self) -> None:
        until = self._deaf_until_sample
        if not self._deaf or until is None or self.input_samples < until:
            return
        tail_start = until - ECHO_TAIL_MS * SPEECH_RATE // 1000
        onset = self._detector.speech_onset_sample
        # The VAD places an onset at the start of its 32 ms window: the window holding the
        # tail's first sample counts as inside the tail.
        if onset is None or onset + WINDOW_SAMPLES <= tail_start:
            if self._user_speaking:
                return  # began while the assistant spoke (or is its echo): dropped when it ends
            self._detector.reset()  # whatever the VAD holds began while the assistant spoke
        elif self._user_speaking and not self._detector.hearing_speech:
            return  # a blip in the tail, quiet now: a turn only if it resumes before it ends
        else:
            self._detector.forget_before(min(onset, tail_start))  # the answer's time is not the user's
        self._speech_item_id = None
        self._deaf = False
        self._deaf_until_sample = None
        self._ignored_reported = False
        if self._user_speaking:  # a quick reply: speech begun in the echo tail goes on
            self._speech_item_id = new_id("item")
            self._act.emit(InputAudioBufferSpeechStartedEvent(audio_start_ms=self._detector.audio_start_ms,
                                                              item_id=self._speech_item_id))
            self._tell_speaking(True)

    def _maybe_time_out(self, turn_detection: TurnDetection) -> None:
        """idle_timeout_ms: no speech for that long after the assistant's audio ended prompts a response.

        Time is counted in input audio (WebRTC delivers 20 ms frames even from a muted mic), so
        it needs no timer task and is exact in tests.
        """
        timeout_ms = turn_detection.idle_timeout_ms
        idle_since = self._idle_since_sample
        if timeout_ms is None or idle_since is None or self._act.busy() or self._user_speaking:
            return
        if self.input_samples - idle_since < timeout_ms * SPEECH_RATE // 1000:
            return
        self._idle_since_sample = None
        item_id = new_id("item")
        self._act.emit(
            InputAudioBufferTimeoutTriggeredEvent(
                audio_start_ms=idle_since * 1000 // SPEECH_RATE,
                audio_end_ms=self.input_samples * 1000 // SPEECH_RATE,
                item_id=item_id,
            )
        )
        self._act.commit(item_id, np.zeros(IDLE_CLIP_MS * SPEECH_RATE // 1000, dtype=np.float32))
        if turn_detection.create_response:
            self._act.respond(item_id, time.monotonic(), 0.0)
