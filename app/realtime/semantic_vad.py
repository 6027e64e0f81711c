"""semantic_vad for one session: its policies by eagerness, end-of-turn checks scored off the event
loop, its availability, and the text judge that weighs the words.

The end-of-turn model costs tens of milliseconds per decision on a CPU core
(tests/bench/turn_taking.py), longer than one 20 ms audio frame, so it runs in a worker thread
(``asyncio.to_thread``; onnxruntime and numpy's FFT release the GIL). Audio keeps flowing into
the detector meanwhile; the answer is handed back on the loop and applied to the detector's
state *then*: if the user spoke again in between, the check has gone stale and its answer is
ignored (``TurnCommitBuffer.decide``), and a commit includes the silence that arrived meanwhile.

With a text judge (``TextJudge`` below, the ``turn_text_judge`` setting), the detector also
asks for the words, once per silence, as it starts; they are judged concurrently with the sound
(an ASR engine turn, off the loop by nature). The answers reach the detector separately
(``decide``, ``decide_words``), and its policy combines them
(``media.detector_params.EndOfTurnPolicy``). A judge that fails answers None: the sound decides.

A words check costs the shared engine an ASR turn, so (issue 34) one is in flight per session at
most: a newer check cancels the older one (its answer would be stale anyway: speech resumed in
between), and the words judged are the utterance's last ``JUDGED_SECONDS``, as the end-of-turn
model hears its last 8 s. Before, each silence of someone speaking in bursts queued another ASR
turn over the whole utterance so far, none ever cancelled.

The text judge: do the *words* said so far make a complete turn?

The end-of-turn model hears prosody only; after "Please put the" a voice whose pitch falls may
sound finished (it scored 0.92-0.99 on held-out synthetic voices), while no English sentence ends
on "the". A ``TextJudge`` answers from the words: P(the utterance so far is a complete turn).

``EngineTextJudge`` is the real one, Qwen3-Omni itself on the engine, no second model:
1. its own ASR writes down the utterance so far (``TurnRequest.transcription``: the ASR prompt of
   Qwen3-Omni's README, text only, greedy — the input transcription's path);
2. the Thinker reads that transcript as an open user message (``TurnRequest.end_of_turn``:
   ``<|im_start|>user\\n{transcript}``) and the engine returns its probability of
   ``<|im_end|>`` next, i.e. of the user's message ending there (the idea of LiveKit's text
   turn detector, with the conversation model itself as the language model).

On the dev model its words are noise; tests use a stand-in that reads a given transcript
(tests/words.py) behind the same interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.realtime.protocol import ProtocolError
from app.realtime.session_config import Eagerness, SessionConfig
from media.detector_events import EndOfTurnCheck
from media.detector_params import EndOfTurnPolicy
from media.end_of_turn_model import EndOfTurnModel
from media.rates import SPEECH_RATE
from pipeline.contract import Engine, EngineError, TranscriptionHint, TurnDone, TurnRequest
from pipeline.conversation import UserAudio

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
        transcript = (await self._run(TurnRequest.transcription(UserAudio(pcm), self._hint))).text.strip()
        if not transcript:
            return WordsVerdict("", None)
        done = await self._run(TurnRequest.end_of_turn(transcript))
        if done.end_of_turn_probability is None:
            raise EngineError("The engine scored no end of turn.", code="engine_protocol_error")
        return WordsVerdict(transcript, done.end_of_turn_probability)

    async def _run(self, request: TurnRequest) -> TurnDone:
        async with contextlib.aclosing(self._engine.run_turn(request)) as turn:
            async for event in turn:
                if isinstance(event, TurnDone):
                    return event
        raise EngineError("The engine ended a turn without TurnDone.", code="engine_protocol_error")
