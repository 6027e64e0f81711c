"""A token bucket: the one rate bound every part of the server that limits something uses (a
session's events, its appends' audio, its image decoding, its speculative starts, refusal
replies, its and its client's share of the engine, a peer's SCTP FORWARD TSNs).

It holds at most ``burst`` tokens, starts full and refills at ``per_second`` on its clock.
``take`` spends a cost the bucket holds, or nothing; ``charge`` spends whatever it holds, down
below zero, for work that ran anyway, so that later ``take``\\ s wait until the debt has refilled.

*Decided*: our own dozen lines rather than a library. The rate-limit libraries on PyPI (``limits``,
``aiolimiter``, ``pyrate-limiter``) either keep their counters in a storage backend or make the
caller wait; these buckets answer at once, are charged below zero, and run on a clock a test
moves by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``burst`` tokens at most, refilled at ``per_second`` tokens a second on ``clock``."""

    def __init__(self, burst: float, per_second: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if burst <= 0 or per_second < 0:
            raise ValueError(f"a token bucket needs a positive burst and a rate >= 0, got {burst} and {per_second}")
        self.burst = burst
        self.per_second = per_second
        self._clock = clock
        self._tokens = float(burst)
        self._refilled_at = clock()

    @property
    def tokens(self) -> float:
        """What the bucket holds now (below zero while a charge is being paid off)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled_at) * self.per_second)
        self._refilled_at = now
        return self._tokens

    @property
    def full(self) -> bool:
        return self.tokens >= self.burst

    def holds(self, cost: float) -> bool:
        return self.tokens >= cost

    def take(self, cost: float) -> bool:
        """Spends ``cost`` if the bucket holds it; whether it did."""
        if not self.holds(cost):
            return False
        self._tokens -= cost
        return True

    def charge(self, cost: float) -> None:
        """Spends ``cost`` whatever the bucket holds (it may go below zero)."""
        self._tokens = self.tokens - cost
