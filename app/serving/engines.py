"""Wrappers around the shared engine, as the sessions are given it.

Every wrapper keeps one forwarding contract (:class:`EngineWrapper`): it changes only
``run_generation`` (and ``promote``, where it must know which preemptible turns were made ordinary);
``name``, ``capabilities`` (no wrapper adds to or takes from what the engine can do) and
``health()`` are the wrapped engine's, and ``start``/``close`` belong to whoever owns the wrapped
engine, so a wrapper never starts or closes it. The server stacks them as
``MeteredEngine(StallTimeoutEngine(engine))``; with ``--dev-replies`` each session gets
``DevReplies`` around that.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator

from app.metrics import Metrics
from pipeline.contract import (
    PREEMPTIBLE_ENDS,
    Engine,
    EngineError,
    EngineHealth,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
)


class EngineWrapper:
    """An :class:`~pipeline.contract.Engine` that reads through to the engine it wraps."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.name = engine.name
        self.capabilities = engine.capabilities

    async def start(self) -> None:
        """The wrapped engine is started by its owner."""

    async def close(self) -> None:
        """The wrapped engine is closed by its owner."""

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._engine.run_generation(request)

    async def promote(self, preemptible_id: str) -> bool:
        return await self._engine.promote(preemptible_id)

    def health(self) -> EngineHealth:
        return self._engine.health()


class StallTimeoutEngine(EngineWrapper):
    """Turns fail instead of hanging.

    A turn that yields nothing for ``stall_timeout_s`` (queue wait included) is cancelled in
    the wrapped engine and raises :class:`EngineError` with code ``engine_timeout``; the
    session ends that response ``failed`` and serves the next turn.
    """

    def __init__(self, engine: Engine, *, stall_timeout_s: float) -> None:
        super().__init__(engine)
        self._stall_timeout_s = stall_timeout_s

    async def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        async with contextlib.aclosing(self._engine.run_generation(request)) as turn:
            while True:
                try:
                    async with asyncio.timeout(self._stall_timeout_s):
                        event = await anext(turn)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise EngineError(
                        f"The engine produced nothing for {self._stall_timeout_s:g} s; the response was cancelled.",
                        code="engine_timeout",
                    ) from None
                yield event


class MeteredEngine(EngineWrapper):
    """Records each finished turn's engine timings, and engine errors, in :class:`Metrics`.

    Closing a turn's iterator closes the wrapped one (the turn is cancelled).
    """

    def __init__(self, engine: Engine, metrics: Metrics) -> None:
        super().__init__(engine)
        self._metrics = metrics

    async def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        submitted = time.monotonic()
        done: GenerationDone | None = None
        try:
            async with contextlib.aclosing(self._engine.run_generation(request)) as events:
                async for event in events:
                    if isinstance(event, GenerationDone):
                        done = event
                        self._observe(request, event)
                    yield event
        except EngineError as exc:
            # Preemptible turns end this way by design: counted as speculation outcomes
            # (omni_rtc_speculative_responses_total), not as engine errors.
            if exc.code not in PREEMPTIBLE_ENDS:
                self._metrics.errors.labels(type="engine_error", code=exc.code).inc()
            raise
        finally:
            # Every turn's engine time, also one closed early (cancelled) or failed: the share of it
            # thrown away is what the latency bench weighs speculation by (tests/bench/e2e_latency.py).
            seconds = done.timings.total if done is not None and done.timings.total else time.monotonic() - submitted
            self._metrics.engine_turn.labels(task=request.task).observe(seconds)

    def _observe(self, request: GenerationRequest, done: GenerationDone) -> None:
        # Labelled by task: transcriptions are short, greedy and scheduled after answers; mixed
        # into the answers' figures they would hide how long visitors wait for an answer.
        timings = done.timings
        self._metrics.engine_queue_wait.labels(task=request.task).observe(timings.queue_wait)
        if timings.first_text is not None:
            self._metrics.thinker_first_token.labels(task=request.task).observe(timings.first_text)
        if timings.first_audio is not None:
            self._metrics.engine_first_audio.labels(task=request.task).observe(timings.first_audio)


class DevReplies(EngineWrapper):
    """The dev model says what it is told (``omni-rtc serve --dev-replies FILE``): one session's
    responses take the replies in order, then the model's own. Each session has its own copy
    (*decided*: a demo or a test sees the same script in every session, and sessions running
    side by side do not take each other's replies). The reply is forced through the real
    tokenizer, Talker and Code2Wav (``GenerationRequest.forced_reply``); transcription turns are the
    model's own.

    A speculative answer (a preemptible turn) says the next reply without taking it: the reply is
    taken once the session uses that answer (``promote``), or once the answer ends by itself if
    it was promoted while its end was on its way; a discarded one leaves it for the next answer.
    """

    def __init__(self, engine: Engine, replies: tuple[str, ...]) -> None:
        super().__init__(engine)
        self._replies = collections.deque(replies)
        # Preemptible answers saying the next reply: whether each ended by itself (GenerationDone), and
        # those promoted before that (the reply is taken when they do). Superseded by the next answer.
        self._speaking: dict[str, bool] = {}
        self._take_when_done: set[str] = set()

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        if request.task != "respond" or not self._replies:
            return self._engine.run_generation(request)
        self._speaking.clear()  # a new answer: the earlier speculative ones are over, used or not
        self._take_when_done.clear()
        request = dataclasses.replace(request, forced_reply=self._replies[0])
        if request.preemptible_id is None:
            self._replies.popleft()
            return self._engine.run_generation(request)
        self._speaking[request.preemptible_id] = False
        return self._speculative(request, request.preemptible_id)

    async def _speculative(self, request: GenerationRequest, preemptible_id: str) -> AsyncGenerator[GenerationEvent, None]:
        async with contextlib.aclosing(self._engine.run_generation(request)) as events:
            async for event in events:
                if isinstance(event, GenerationDone) and preemptible_id in self._speaking:
                    self._speaking[preemptible_id] = True
                    if preemptible_id in self._take_when_done:
                        self._take(preemptible_id)
                yield event

    async def promote(self, preemptible_id: str) -> bool:
        promoted = await self._engine.promote(preemptible_id)
        if preemptible_id in self._speaking:
            if promoted or self._speaking[preemptible_id]:
                self._take(preemptible_id)
            else:  # preempted (its error is on its way), or ending by itself: its GenerationDone decides
                self._take_when_done.add(preemptible_id)
        return promoted

    def _take(self, preemptible_id: str) -> None:
        del self._speaking[preemptible_id]
        self._take_when_done.discard(preemptible_id)
        if self._replies:
            self._replies.popleft()


def for_session(engine: Engine, replies: tuple[str, ...]) -> Engine:
    """The engine one session gets: scripted when there are dev replies."""
    return DevReplies(engine, replies) if replies else engine
