"""The event gate: admits client events by size and by rate, before they are parsed.

A refused event gets a :class:`Rejection`, which the session answers with an ``error`` event;
the session goes on. An event pays rate tokens by its size, one per ``max_bytes`` started (an
oversized one too, though it is refused): a client cannot make the server receive and measure
large events for free, only as fast as the rate lets as many events of the largest size in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rejection:
    """Why one client event was refused; the session answers with an ``error`` event."""

    code: str
    message: str


class EventGate:
    """Admits client events by size and by rate (a token bucket), before they are parsed."""

    def __init__(
        self,
        *,
        max_bytes: int,
        per_second: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_bytes = max_bytes
        self._per_second = per_second
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._refilled_at = clock()

    def admit(self, raw: str | bytes) -> Rejection | None:
        size = len(raw) if isinstance(raw, bytes) or raw.isascii() else len(raw.encode())
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled_at) * self._per_second)
        self._refilled_at = now
        cost = max(1, math.ceil(size / self._max_bytes))
        if self._tokens < cost:
            if cost > 1:  # an oversized event the bucket cannot pay for still takes what is left
                self._tokens = 0.0
            return Rejection(
                "rate_limit_exceeded",
                f"More than {self._per_second:g} events per second (bursts of {self._burst}); "
                "this event was dropped.",
            )
        self._tokens -= cost
        if size > self._max_bytes:
            return Rejection(
                "event_too_large", f"Event is {size} bytes; the limit is {self._max_bytes}."
            )
        return None
