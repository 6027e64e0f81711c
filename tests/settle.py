"""``settle()``: let the event loop run until everything it can do without waiting is done.

A test that checks what did *not* happen (no engine turn, no event) must first let happen what
would: a response started by mistake runs only when the loop gets to its task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sized

MAX_STEPS = 1_000


async def settle(*, seconds: float = 0.0, max_steps: int = MAX_STEPS) -> int:
    """Run the loop until no callback but the caller's is ready, or ``max_steps`` turns of it.

    Ready: a task that can go on, a done-callback, an answer a worker thread has handed back. What
    still waits after it waits on a future, a timer, a worker thread or I/O: a held engine turn
    stays held, an ``asyncio.sleep(0.02)`` is not waited for. ``seconds``: wall time to let pass
    first (in 10 ms sleeps), for worker threads that answer in real time. Returns the turns taken
    (``max_steps``: the loop was still busy, e.g. a task that polls). On a loop that does not show
    its ready queue (not CPython's asyncio), it takes ``max_steps`` turns.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    ready: Sized | None = getattr(asyncio.get_running_loop(), "_ready", None)
    for step in range(1, max_steps + 1):
        await asyncio.sleep(0)
        if ready is not None and not ready:  # while the caller runs, its own wake-up is not queued
            return step
    return max_steps
