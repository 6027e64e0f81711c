"""An engine turn that runs before anyone may see it: its events are held until it is released.

A speculative answer and its input transcription (``app.realtime.speculation``) run as held
turns: preemptible engine turns (``pipeline.contract``) whose events are kept, in order, as they
come. Whoever holds one either closes it (cancelled in the engine, forgotten) or, once the turn
it stands for is committed, promotes it (an ordinary engine turn from then on) and takes its
``events()``: those held so far at once, then the rest as they come. A partial transcript
(``app.realtime.transcription``) is never promoted: it is read once it ended by itself
(``on_end``, then ``done``), or closed unseen. The held turn owns the task
that reads the engine's stream: ``close()`` cancels and awaits it, and is safe to call twice.
What it holds is bounded by one answer (``max_output_tokens``, the engine's audio bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable

from pipeline.contract import (
    PREEMPTIBLE_ENDS,
    AudioChunk,
    Engine,
    EngineError,
    EngineErrorCode,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
)

logger = logging.getLogger(__name__)


class HeldGeneration:
    """One preemptible engine turn, read into a buffer by a task of its own.

    ``on_output``: called once, at its first audio (or its end, ``GenerationDone``, for a turn with
    none). ``on_end``: called once when the engine's stream ends by itself (done or failed),
    never when it is closed.
    """

    def __init__(
        self,
        engine: Engine,
        request: GenerationRequest,
        *,
        name: str,
        on_output: Callable[[], None] | None = None,
        on_end: Callable[[HeldGeneration], None] | None = None,
    ) -> None:
        if request.preemptible_id is None:
            raise ValueError("a held turn is a preemptible one: its request needs a preemptible_id")
        self.request = request
        self.started_at = time.monotonic()
        self.ended_at: float | None = None
        self.error: BaseException | None = None  # what the engine's stream raised
        self._engine = engine
        self._events: list[GenerationEvent] = []
        self._changed = asyncio.Event()
        self._on_output = on_output
        self._on_end = on_end
        self._closed = False
        self._task = asyncio.create_task(self._read(), name=name)
        self._task.add_done_callback(self._on_task_done)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    @property
    def preemptible_id(self) -> str:
        assert self.request.preemptible_id is not None
        return self.request.preemptible_id

    @property
    def engine_code(self) -> EngineErrorCode | None:
        """The ``EngineError`` code it ended with (``preempted``, ``no_spare_capacity``...), if any."""
        return self.error.code if isinstance(self.error, EngineError) else None

    @property
    def done(self) -> GenerationDone | None:
        """Its ``GenerationDone``, once the engine's stream ended with one (None while it runs, or when it failed)."""
        last = self._events[-1] if self.ended and self.error is None and self._events else None
        return last if isinstance(last, GenerationDone) else None

    def engine_seconds(self) -> float:
        """How long the engine has worked on it: from its start to its end, or to now."""
        return (self.ended_at or time.monotonic()) - self.started_at

    @property
    def stopped(self) -> bool:
        """Its reader is gone: nothing of it runs any more."""
        return self._task.done()

    def cancel(self) -> None:
        """Cancels the turn in the engine without waiting (``close`` awaits it)."""
        self._closed = True
        if self.ended_at is None:
            self.ended_at = time.monotonic()  # the engine stops within a step of the cancel
            self._task.cancel()

    async def close(self) -> None:
        """Cancels the turn (if it still runs) and waits until its reader is gone; safe twice."""
        self.cancel()
        await asyncio.wait({self._task})

    async def promote(self) -> bool:
        """The turn it stands for was committed: ordinary in the engine from now on; False when
        the engine took it back (``preempted``) or never ran it (``no_spare_capacity``). A turn
        that failed otherwise is usable: its events end with its error. The engine is told even
        when the turn has ended (a wrapper may count it: ``app.serving.engines.DevReplies``)."""
        if not await self._engine.promote(self.preemptible_id):
            # No longer preemptible in the engine: its end (done, or preempted) is on its way.
            while not self.ended:
                self._changed.clear()
                await self._changed.wait()
        return self.engine_code not in PREEMPTIBLE_ENDS

    async def events(self) -> AsyncGenerator[GenerationEvent, None]:
        """Its events, those held at once, then the rest as they come; raises what the turn
        raised. Closing the generator closes the turn."""
        index = 0
        try:
            while True:
                while index < len(self._events):
                    yield self._events[index]
                    index += 1
                    # A released backlog is a whole answer at once (25 codec frames, its deltas):
                    # without a suspension between its events the outbound track's 20 ms slot for
                    # the first audio frame waits until all of it has been handled.
                    await asyncio.sleep(0)
                if self.ended:
                    break
                self._changed.clear()
                await self._changed.wait()
            if self.error is not None:
                raise self.error
        finally:
            await self.close()

    async def _read(self) -> None:
        told = False
        try:
            async with contextlib.aclosing(self._engine.run_generation(self.request)) as turn:
                async for event in turn:
                    self._events.append(event)
                    self._changed.set()
                    if not told and isinstance(event, AudioChunk | GenerationDone) and self._on_output is not None:
                        told = True
                        self._on_output()
        except Exception as exc:  # kept: whoever releases it raises it, or it is discarded unseen
            self.error = exc
        self.ended_at = time.monotonic()
        self._changed.set()
        if self._on_end is not None and not self._closed:
            self._on_end(self)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._changed.set()  # a promote or events() waiting on a cancelled reader goes on
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s crashed", task.get_name(), exc_info=task.exception())
