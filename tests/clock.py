"""A stand-in for ``time.monotonic`` / ``time.time`` and ``asyncio.sleep`` in tests."""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when its ``sleep`` is awaited or a test sets ``now``.

    ``sleeps`` records every wait, so pacing can be asserted without wall-clock timing.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
