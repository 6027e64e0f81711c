"""Turn taking: what the voice activity detector's events mean for the conversation.

:class:`TurnTaking` runs the detector (``media.commit_buffer``) over the session's 16 kHz input
and returns :data:`TurnCommand` s for the session to carry out: ``speech_started`` /
``speech_stopped`` events, user items to commit (a 30 s segment of a long utterance, or the
turn; a turn is ended at 120 s with ``turn_audio_limit_reached``), the answer to start,
barge-in (``interrupt_response: true``), end-of-turn checks for semantic VAD, candidate ends of
turn for speculative answers. Half-duplex (``interrupt_response: false``) is the explicit state
:class:`HalfDuplex`: from a response's start until its audio has played out plus
``ECHO_TAIL_MS``, speech is heard and not acted on; a reply begun inside the tail and going on
past it is a turn. ``idle_timeout_ms`` counts input audio, not a timer.

:class:`SemanticVad` scores semantic VAD's checks off the event loop (the end-of-turn model in a
worker thread, one words check in flight; :class:`EngineTextJudge` asks Qwen3-Omni itself
whether the words so far are a complete turn). docs/SESSION.md "Turn detection" and
"semantic_vad".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from app.realtime.interruption import (
    Backchannel,
    Confirmed,
    InterruptionJudge,
    InterruptionRules,
    JudgedSpeech,
    Paused,
    Resumed,
)
from app.realtime.protocol import (
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    InputAudioBufferTimeoutTriggeredEvent,
    ProtocolError,
    ServerEvent,
    new_id,
)
from app.realtime.session_config import Eagerness, SessionConfig, TurnDetection
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
from media.end_of_turn_model import EndOfTurnModel
from media.rates import SPEECH_RATE
from media.speech_level import LevelRules
from media.vad import WINDOW_SAMPLES, SpeechModel
from media.voice_activity_detector import VoiceActivityDetector
from pipeline.contract import Engine, EngineError, GenerationDone, GenerationRequest, TranscriptionHint
from pipeline.conversation import HistoryLimits, UserAudio

# ---- semantic_vad ----

logger = logging.getLogger(__name__)

# semantic_vad: the end-of-turn model (media/end_of_turn_model.py) is asked at a short silence and
# commits when it says "finished"; how long an unfinished turn is held open follows how sure it
# is (and, with a text judge, the words). OpenAI: "low" lets the user take their time, "high"
# answers quickly, "auto" = "medium". Chosen from tests/bench/turn_taking.py over
# tests/fixtures/turns (docs/SESSION.md has the table, the rule and the figures).
END_OF_TURN_BY_EAGERNESS: dict[Eagerness, EndOfTurnPolicy] = {
    "low": EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=0.8, max_wait_ms=2000,
                           confident_below=0.1, confident_wait_ms=4000),
    "medium": EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=0.75, max_wait_ms=1200,
                              confident_below=0.1, confident_wait_ms=3000, words_threshold=0.6),
    "high": EndOfTurnPolicy(candidate_ms=96, rescore_ms=320, threshold=0.5, max_wait_ms=800,
                            confident_below=0.05, confident_wait_ms=2000, words_complete_at=0.8),
    "auto": EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=0.75, max_wait_ms=1200,
                            confident_below=0.1, confident_wait_ms=3000, words_threshold=0.6),
}

# The end of the utterance the words are judged on: whether a turn is complete is in its last
# words, and an ASR turn's cost grows with its audio (13 tokens a second).
JUDGED_SECONDS = 8


class SemanticVad:
    """One session's semantic VAD: whether it is available, and its checks scored in worker threads.

    Owns the scoring tasks (``close``). Without a model (not installed, see the server's log)
    a config asking for semantic_vad is run as server VAD and the client gets an error.
    """

    def __init__(
        self,
        model: EndOfTurnModel | None,
        on_answer: Callable[[int, float], None],
        *,
        name: str,
        text_judge: TextJudge | None = None,
        on_words: Callable[[int, float | None], None] | None = None,
    ) -> None:
        if (text_judge is None) != (on_words is None):
            raise ValueError("a text judge needs on_words, and on_words a text judge")
        self._model = model
        self._on_answer = on_answer
        self._name = name
        self._text_judge = text_judge
        self._on_words = on_words
        self._tasks: set[asyncio.Task[None]] = set()
        self._words: asyncio.Task[None] | None = None  # the words check in flight

    @property
    def judges_words(self) -> bool:
        return self._text_judge is not None

    def runnable(self, config: SessionConfig) -> tuple[SessionConfig, ProtocolError | None]:
        """``config`` as it can run here, and the error to send when it had to change."""
        turn_detection = config.turn_detection
        if self._model is not None or turn_detection is None or turn_detection.type != "semantic_vad":
            return config, None
        error = ProtocolError(
            "semantic_vad_unavailable",
            "semantic_vad needs the end-of-turn model, which this server has not loaded (see its log); "
            "turn detection stays server_vad.",
            param="session.audio.input.turn_detection.type",
        )
        return dataclasses.replace(config, turn_detection=turn_detection.as_server_vad()), error

    def submit(self, check: EndOfTurnCheck) -> None:
        if self._model is None:  # runnable() keeps semantic_vad off: no checks come
            raise RuntimeError("an end-of-turn check without an end-of-turn model")
        if check.sound:
            self._start(self._score(check), f"{self._name} end-of-turn check {check.check_id}")
        if check.words and self._text_judge is not None:
            if self._words is not None:
                self._words.cancel()  # superseded: its engine turn is cancelled, its answer never comes
            self._words = self._start(self._judge_words(check), f"{self._name} end-of-turn check {check.check_id}: words")

    def _start(self, work: Coroutine[None, None, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _score(self, check: EndOfTurnCheck) -> None:
        assert self._model is not None  # submit() checked
        try:
            probability = await asyncio.to_thread(self._model.probability, check.pcm)
        except Exception:
            # The utterance still ends: max_wait_ms commits it. The cause must be visible.
            logger.exception("%s: end-of-turn check %d failed", self._name, check.check_id)
            return
        self._on_answer(check.check_id, probability)

    async def _judge_words(self, check: EndOfTurnCheck) -> None:
        assert self._text_judge is not None and self._on_words is not None  # submit() checked
        try:
            verdict = await self._text_judge.judge(check.pcm[-JUDGED_SECONDS * SPEECH_RATE :])
        except Exception:
            # The sound decides alone; the failure must be visible.
            logger.exception("%s: judging the words of end-of-turn check %d failed", self._name, check.check_id)
            self._on_words(check.check_id, None)
            return
        logger.debug("%s: end-of-turn check %d: words %r, P(complete) %s", self._name, check.check_id,
                     verdict.transcript, verdict.complete)
        self._on_words(check.check_id, verdict.complete)

    async def close(self) -> None:
        """Cancel checks in flight (a thread already running finishes, unheard); safe twice."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


@dataclass(frozen=True)
class WordsVerdict:
    transcript: str
    complete: float | None  # P(a complete turn); None: no words to judge (nothing was transcribed)


class TextJudge(Protocol):
    """Judges an utterance by its words; the session runs it beside the end-of-turn model."""

    async def judge(self, pcm: np.ndarray) -> WordsVerdict:
        """``pcm``: the utterance so far, 16 kHz mono float32, trailing silence included."""
        ...


class EngineTextJudge:
    """Qwen3-Omni's ASR, then the Thinker's P(``<|im_end|>``) after the transcript (two engine turns)."""

    def __init__(self, engine: Engine, hint: TranscriptionHint | None = None) -> None:
        self._engine = engine
        self._hint = hint

    async def judge(self, pcm: np.ndarray) -> WordsVerdict:
        transcript = (await self._run(GenerationRequest.transcription(UserAudio(pcm), self._hint))).text.strip()
        if not transcript:
            return WordsVerdict("", None)
        done = await self._run(GenerationRequest.end_of_turn(transcript))
        if done.end_of_turn_probability is None:
            raise EngineError("The engine scored no end of turn.", code="engine_protocol_error")
        return WordsVerdict(transcript, done.end_of_turn_probability)

    async def _run(self, request: GenerationRequest) -> GenerationDone:
        async with contextlib.aclosing(self._engine.run_generation(request)) as turn:
            async for event in turn:
                if isinstance(event, GenerationDone):
                    return event
        raise EngineError("The engine ended a turn without GenerationDone.", code="engine_protocol_error")


# ---- turn_taking ----

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
    policy by its eagerness, ``app.realtime.turn_taking``), with the turn bounded by the history (a
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
        levels=LevelRules(turn_detection.speech_floor_dbfs, turn_detection.speech_over_background_db,
                          turn_detection.speech_under_user_db),
    )


@dataclass(frozen=True)
class SpeechSoFar:
    """The user item being spoken (announced by ``speech_started``): what its partial transcripts
    follow (``app.realtime.transcription``)."""

    item_id: str
    samples: int  # 16 kHz samples a commit now would hold
    hearing: bool  # speech goes on (False: in a trailing silence)
    audio: Callable[[], np.ndarray]  # those samples (a copy, made when called)


@dataclass(frozen=True)
class CommitAudio:
    """Commit a user item holding ``pcm`` (a segment of a long utterance, or the whole turn)."""

    item_id: str
    pcm: np.ndarray


@dataclass(frozen=True)
class Respond:
    """Answer the turn that ended with ``item_id`` (committed at ``committed_at``, monotonic)."""

    item_id: str
    committed_at: float
    silence_wait_ms: float


@dataclass(frozen=True)
class Interrupt:
    """Barge-in: the user started speaking over the assistant: cancel, clear the output, truncate."""


@dataclass(frozen=True)
class UserSpeaking:
    """The user's speech is acted on (``speaking``, from ``speech_started``), or was committed or
    dropped: the camera samples faster meanwhile and keeps the frames for the turn."""

    speaking: bool


@dataclass(frozen=True)
class CandidateEnd:
    """A candidate end of turn (the silence's first quiet window): the utterance so far."""

    pcm: np.ndarray


@dataclass(frozen=True)
class CandidateVoid:
    """Speech came back after a candidate end of turn: the candidate is void."""


@dataclass(frozen=True)
class SpeechIgnored:
    """Half-duplex heard an utterance and does not act on it (counted once per utterance)."""


# What turn taking asks of its session, in order: events to send and things to do.
# ``EndOfTurnCheck``: semantic VAD asks for the end-of-turn model's (and the words') verdict,
# answered with ``decide`` / ``decide_words``. ``Paused`` / ``Resumed``: the answer's audio pauses
# while speech over it is judged, and plays on when it was not an interruption; ``Backchannel``:
# an utterance over the answer that was not one (app.realtime.interruption).
TurnCommand = (
    ServerEvent | CommitAudio | Respond | Interrupt | UserSpeaking | EndOfTurnCheck | CandidateEnd | CandidateVoid
    | SpeechIgnored | Paused | Resumed | Backchannel
)


class HalfDuplex(Enum):
    """Whether speech is acted on. Barge-in (``interrupt_response: true``) always listens."""

    LISTENING = "listening"  # speech is acted on
    DEAF = "deaf"  # half-duplex while the assistant answers: speech is heard, not acted on
    ECHO_TAIL = "echo_tail"  # the answer has played out; its echo may still arrive (ECHO_TAIL_MS)


class TurnTaking:
    """One session's server-VAD state: the detector, the user item being spoken, half-duplex.

    Inputs are the session's audio and what it tells of the assistant (``response_started``,
    ``idle``); every method returns the :data:`TurnCommand` s for the session to carry out, in
    order. ``busy``: the assistant is answering or its audio has not finished playing."""

    def __init__(self, vad: SpeechModel, params: TurnDetectionParams, *, session_id: str,
                 judge_words: bool = False) -> None:
        self._judge_words = judge_words  # a text judge answers semantic VAD's checks too (decide_words)
        self._detector = VoiceActivityDetector(vad, params)
        self._session_id = session_id
        self.input_samples = 0  # 16 kHz samples pushed since the session started
        self._speech_item_id: str | None = None  # the user item announced by speech_started
        self._user_speaking = False  # between SpeechStarted and its commit
        self._half_duplex = HalfDuplex.LISTENING
        self._listen_at_sample = 0  # ECHO_TAIL: when listening may resume
        self._ignored_reported = False  # the utterance half-duplex is dropping was counted
        self._idle_since_sample: int | None = None  # the assistant's audio ended here (idle_timeout_ms)
        self._busy = False  # as the session said at the current call, or since a Respond in it
        self._judge = InterruptionJudge()  # speech over the playing answer (barge-in)
        self._held_start_ms: int | None = None  # speech_started of an utterance being judged, held
        self._playing = False  # the answer's audio is queued or playing, as the session said
        self._out: list[TurnCommand] = []

    @property
    def half_duplex(self) -> HalfDuplex:
        return self._half_duplex

    def push(self, pcm: np.ndarray, turn_detection: TurnDetection, *, busy: bool,
             playing: bool = False) -> list[TurnCommand]:
        """``busy``: answering, or its audio not yet played out; ``playing``: the answer's audio is
        queued or playing (speech over it is judged before it interrupts)."""
        self._busy = busy
        self.input_samples += pcm.size
        self._playing = playing
        # A window at a time: speech over the answer is judged as it is heard, so a long chunk (a
        # WebSocket append) decides as a stream of 20 ms frames would.
        for start in range(0, pcm.size, WINDOW_SAMPLES):
            self._handle(self._detector.push(pcm[start : start + WINDOW_SAMPLES]), turn_detection)
            self._judge_speech(turn_detection)
        self._maybe_listen_again()
        self._maybe_time_out(turn_detection)
        return self._take()

    def decide(self, check_id: int, probability: float, turn_detection: TurnDetection, *,
               busy: bool) -> list[TurnCommand]:
        """The end-of-turn model's answer to a check (semantic VAD); a stale one changes nothing."""
        self._busy = busy
        self._handle(self._detector.decide(check_id, probability), turn_detection)
        return self._take()

    def decide_words(self, check_id: int, probability: float | None, turn_detection: TurnDetection, *,
                     busy: bool) -> list[TurnCommand]:
        """The text judge's answer to a check (semantic VAD); a stale one changes nothing."""
        self._busy = busy
        self._handle(self._detector.decide_words(check_id, probability), turn_detection)
        return self._take()

    def _take(self) -> list[TurnCommand]:
        out, self._out = self._out, []
        return out

    def _handle(self, events: list[DetectorEvent], turn_detection: TurnDetection) -> None:
        deaf = self._half_duplex is not HalfDuplex.LISTENING
        for event in events:
            match event:
                case SpeechStarted():
                    self._on_speech_started(event, turn_detection)
                case SegmentCommitted():
                    self._on_segment(event)
                case SpeechStopped():
                    self._on_speech_stopped(event)
                case UtteranceCommitted():
                    self._on_utterance_committed(event, turn_detection)
                case EndOfTurnCheck(words=True) if deaf or self._judge.judging:
                    # Speech heard while the assistant answers is mostly its echo: its words are not
                    # worth an engine turn. No judgement: the sound decides (a quick reply included).
                    self._handle(self._detector.decide_words(event.check_id, None), turn_detection)
                case EndOfTurnCheck():
                    self._out.append(event)
                case SilenceStarted() if not deaf:
                    self._out.append(CandidateEnd(event.pcm))
                case SpeechResumed() if not deaf:
                    self._out.append(CandidateVoid())

    def speech_so_far(self) -> SpeechSoFar | None:
        """The user item being spoken and acted on, as a commit now would hold it; None between
        utterances, and while half-duplex is not acting on speech."""
        item_id = self._speech_item_id
        detector = self._detector
        if self._half_duplex is not HalfDuplex.LISTENING or item_id is None or not detector.in_speech:
            return None
        return SpeechSoFar(item_id, detector.utterance_samples, detector.hearing_speech, detector.utterance_audio)

    def skip(self, samples: int) -> None:
        """Input that server VAD does not see (manual mode): the input clock goes on."""
        self.input_samples += samples

    def configure(self, new: TurnDetection | None, history: HistoryLimits) -> list[TurnCommand]:
        """``turn_detection`` changed (``session.update``)."""
        commands = self.clear() if new is None else []
        if new is not None:
            self._detector.update(detector_params(new, history, judge_words=self._judge_words))
        if new is None or new.interrupt_response:
            self._half_duplex = HalfDuplex.LISTENING
        return commands

    def clear(self) -> list[TurnCommand]:
        """Drop what the detector holds (``input_audio_buffer.clear``, manual mode)."""
        self._detector.reset()
        self._held_start_ms = None
        resumed: list[TurnCommand] = [Resumed()] if self._judge.paused else []
        self._judge.reset()
        self._speech_item_id = None
        self._user_speaking = False
        self._ignored_reported = False
        return [*resumed, UserSpeaking(False)]

    def response_started(self, turn_detection: TurnDetection | None) -> None:
        self._idle_since_sample = None
        if turn_detection is not None and not turn_detection.interrupt_response:
            self._half_duplex = HalfDuplex.DEAF

    def idle(self) -> None:
        """The assistant has finished speaking (or answering without audio)."""
        self._idle_since_sample = self.input_samples
        if self._half_duplex is not HalfDuplex.LISTENING:
            self._half_duplex = HalfDuplex.ECHO_TAIL
            self._listen_at_sample = self.input_samples + ECHO_TAIL_MS * SPEECH_RATE // 1000

    # -- detector events -------------------------------------------------------------------

    def _on_speech_started(self, event: SpeechStarted, turn_detection: TurnDetection) -> None:
        self._user_speaking = True
        self._idle_since_sample = None
        if self._half_duplex is HalfDuplex.DEAF:
            self._ignore(event.audio_start_ms)
            return
        if self._half_duplex is HalfDuplex.ECHO_TAIL:
            return  # it may be a quick reply: judged when the tail ends (_maybe_listen_again)
        if self._judged(turn_detection) and self._judge.state is not JudgedSpeech.CONFIRMED:
            self._held_start_ms = event.audio_start_ms  # announced if it proves an interruption
            self._out.extend(self._judge.begin(self._detector.position))
            return
        self._announce(event.audio_start_ms, turn_detection)

    def _announce(self, audio_start_ms: int, turn_detection: TurnDetection) -> None:
        """``speech_started``: the user's speech is acted on from here; over an answer, it interrupts."""
        self._held_start_ms = None
        self._speech_item_id = new_id("item")
        self._out.append(InputAudioBufferSpeechStartedEvent(audio_start_ms=audio_start_ms, item_id=self._speech_item_id))
        self._out.append(UserSpeaking(True))
        if turn_detection.interrupt_response and self._busy:
            self._out.append(Interrupt())

    def _judged(self, turn_detection: TurnDetection) -> bool:
        """Speech now is judged before it interrupts: barge-in, and the answer's audio is playing."""
        return turn_detection.interrupt_response and self._half_duplex is HalfDuplex.LISTENING and self._playing

    def _judge_speech(self, turn_detection: TurnDetection) -> None:
        """Barge-in over the playing answer: pause it at the first speech, interrupt only when the
        speech proves to be one (app.realtime.interruption)."""
        if not self._judged(turn_detection):
            if self._judge.paused:  # barge-in turned off mid-judgement: the answer must not stay paused
                self._out.append(Resumed())
            if self._held_start_ms is not None:  # the answer ended first: the utterance is a turn
                self._announce(self._held_start_ms, turn_detection)
            self._judge.reset()
            return
        detector = self._detector
        rules = InterruptionRules.from_ms(turn_detection.interrupt_min_speech_ms,
                                          turn_detection.interrupt_resume_silence_ms)
        for event in self._judge.hear(speech_heard_until=detector.speech_heard_until, position=detector.position,
                                      in_speech=detector.in_speech, rules=rules):
            if isinstance(event, Confirmed):
                if self._held_start_ms is not None:  # confirmation needs the detector in speech
                    self._announce(self._held_start_ms, turn_detection)
            else:
                self._out.append(event)

    def _on_segment(self, event: SegmentCommitted) -> None:
        if self._half_duplex is not HalfDuplex.LISTENING or self._judge.judging:
            return
        self._out.append(CommitAudio(self._speech_item_id or new_id("item"), event.pcm))
        self._speech_item_id = new_id("item")  # the rest of the utterance is the next item

    def _on_speech_stopped(self, event: SpeechStopped) -> None:
        if self._half_duplex is not HalfDuplex.LISTENING or self._judge.judging:
            return
        if self._speech_item_id is None:
            self._speech_item_id = new_id("item")
        self._out.append(
            InputAudioBufferSpeechStoppedEvent(audio_end_ms=event.audio_end_ms, item_id=self._speech_item_id)
        )

    def _on_utterance_committed(self, event: UtteranceCommitted, turn_detection: TurnDetection) -> None:
        self._user_speaking = False
        if self._half_duplex is not HalfDuplex.LISTENING:
            if not self._ignored_reported:
                self._ignore(event.audio_start_ms)
            self._ignored_reported = False
            self._out.append(UserSpeaking(False))
            return
        if self._judge.judging:  # over the answer, and never an interruption: not a turn
            self._held_start_ms = None
            self._out.extend(self._judge.utterance_over())
            return
        committed_at = time.monotonic()
        item_id = self._speech_item_id or new_id("item")
        self._speech_item_id = None
        if event.forced:
            limit_s = self._detector.params.max_turn_ms / 1000
            self._out.append(ProtocolError(
                TURN_LIMIT_CODE,
                f"The user turn reached the maximum of {limit_s:g} s of audio; what was said up to "
                f"{event.audio_end_ms} ms is answered now; speech after that point is not part of this turn.",
            ).to_event())
        self._out.append(CommitAudio(item_id, event.pcm))
        self._out.append(UserSpeaking(False))
        if not turn_detection.create_response:
            return
        # The VAD committed when the silence wait ended: the input stream is there now (give or
        # take the rest of this chunk, <= 20 ms from WebRTC).
        self._respond(item_id, committed_at, float(event.silence_wait_ms), turn_detection)

    def _respond(self, item_id: str, committed_at: float, silence_wait_ms: float, turn_detection: TurnDetection) -> None:
        """Ask for the answer; the rest of this input is heard as the session will be then:
        answering (barge-in applies, half-duplex stops acting on speech)."""
        self._out.append(Respond(item_id, committed_at, silence_wait_ms))
        self._busy = True
        self.response_started(turn_detection)

    # -- half-duplex and idle ----------------------------------------------------------------

    def _ignore(self, audio_start_ms: int) -> None:
        """Half-duplex does not act on this utterance: log and count it, once."""
        logger.debug("session %s: speech at %d ms not acted on: the assistant is answering (half-duplex)",
                     self._session_id, audio_start_ms)
        self._ignored_reported = True
        self._out.append(SpeechIgnored())

    def _maybe_listen_again(self) -> None:
        until = self._listen_at_sample
        if self._half_duplex is not HalfDuplex.ECHO_TAIL or self.input_samples < until:
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
        self._half_duplex = HalfDuplex.LISTENING
        self._ignored_reported = False
        if self._user_speaking:  # a quick reply: speech begun in the echo tail goes on
            self._speech_item_id = new_id("item")
            self._out.append(InputAudioBufferSpeechStartedEvent(audio_start_ms=self._detector.audio_start_ms,
                                                                item_id=self._speech_item_id))
            self._out.append(UserSpeaking(True))

    def _maybe_time_out(self, turn_detection: TurnDetection) -> None:
        """idle_timeout_ms: no speech for that long after the assistant's audio ended prompts a response.

        Time is counted in input audio (WebRTC delivers 20 ms frames even from a muted mic), so
        it needs no timer task and is exact in tests.
        """
        timeout_ms = turn_detection.idle_timeout_ms
        idle_since = self._idle_since_sample
        if timeout_ms is None or idle_since is None or self._busy or self._user_speaking:
            return
        if self.input_samples - idle_since < timeout_ms * SPEECH_RATE // 1000:
            return
        self._idle_since_sample = None
        item_id = new_id("item")
        self._out.append(
            InputAudioBufferTimeoutTriggeredEvent(
                audio_start_ms=idle_since * 1000 // SPEECH_RATE,
                audio_end_ms=self.input_samples * 1000 // SPEECH_RATE,
                item_id=item_id,
            )
        )
        self._out.append(CommitAudio(item_id, np.zeros(IDLE_CLIP_MS * SPEECH_RATE // 1000, dtype=np.float32)))
        if turn_detection.create_response:
            self._respond(item_id, time.monotonic(), 0.0, turn_detection)
