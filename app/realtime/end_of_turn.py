"""semantic_vad for one session: end-of-turn checks scored off the event loop, and its availability.

The end-of-turn model costs tens of milliseconds per decision on a CPU core
(tests/bench/turn_taking.py), longer than one 20 ms audio frame, so it runs in a worker thread
(``asyncio.to_thread``; onnxruntime and numpy's FFT release the GIL). Audio keeps flowing into
the detector meanwhile; the answer is handed back on the loop and applied to the detector's
state *then*: if the user spoke again in between, the check has gone stale and its answer is
ignored (``TurnCommitBuffer.decide``), and a commit includes the silence that arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from app.realtime.protocol import ProtocolError
from app.realtime.session_config import SessionConfig
from media.end_of_turn import EndOfTurnModel
from media.turn_detection import EndOfTurnCheck

logger = logging.getLogger(__name__)


class SemanticVad:
    """One session's semantic VAD: whether it is available, and its checks scored in worker threads.

    Owns the scoring tasks (``close``). Without a model (not installed, see the server's log)
    a config asking for semantic_vad is run as server VAD and the client gets an error.
    """

    def __init__(self, model: EndOfTurnModel | None, on_answer: Callable[[int, float], None], *, name: str) -> None:
        self._model = model
        self._on_answer = on_answer
        self._name = name
        self._tasks: set[asyncio.Task[None]] = set()

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
        task = asyncio.create_task(self._score(check), name=f"{self._name} end-of-turn check {check.check_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _score(self, check: EndOfTurnCheck) -> None:
        assert self._model is not None  # submit() checked
        try:
            probability = await asyncio.to_thread(self._model.probability, check.pcm)
        except Exception:
            # The utterance still ends: max_wait_ms commits it. The cause must be visible.
            logger.exception("%s: end-of-turn check %d failed", self._name, check.check_id)
            return
        self._on_answer(check.check_id, probability)

    async def close(self) -> None:
        """Cancel checks in flight (a thread already running finishes, unheard); safe twice."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
