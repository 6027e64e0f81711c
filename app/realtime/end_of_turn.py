"""semantic_vad for one session: end-of-turn checks scored off the event loop, and its availability.

The end-of-turn model costs tens of milliseconds per decision on a CPU core
(tests/bench/turn_taking.py), longer than one 20 ms audio frame, so it runs in a worker thread
(``asyncio.to_thread``; onnxruntime and numpy's FFT release the GIL). Audio keeps flowing into
the detector meanwhile; the answer is handed back on the loop and applied to the detector's
state *then*: if the user spoke again in between, the check has gone stale and its answer is
ignored (``TurnCommitBuffer.decide``), and a commit includes the silence that arrived meanwhile.

With a text judge (``app.realtime.text_judge``, the ``turn_text_judge`` setting), the detector also
asks for the words, once per silence, as it starts; they are judged concurrently with the sound
(an ASR engine turn, off the loop by nature). The answers reach the detector separately
(``decide``, ``decide_words``), and its policy combines them
(``media.detector_params.EndOfTurnPolicy``). A judge that fails answers None: the sound decides.

A words check costs the shared engine an ASR turn, so (issue 34) one is in flight per session at
most: a newer check cancels the older one (its answer would be stale anyway: speech resumed in
between), and the words judged are the utterance's last ``JUDGED_SECONDS``, as the end-of-turn
model hears its last 8 s. Before, each silence of someone speaking in bursts queued another ASR
turn over the whole utterance so far, none ever cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine

from app.realtime.protocol import ProtocolError
from app.realtime.session_config import SessionConfig
from app.realtime.text_judge import TextJudge
from media.detector_events import EndOfTurnCheck
from media.end_of_turn_model import EndOfTurnModel
from media.rates import SPEECH_RATE

logger = logging.getLogger(__name__)

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
