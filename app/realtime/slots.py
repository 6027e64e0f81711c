"""``--max-sessions``: the one count of open sessions, whatever carries them.

Every transport takes a slot per session (a WebRTC call, a WebSocket session) and gives it back
when the session ends; with media worker processes, the front process holds the count for
every worker's calls. One counter, so that the limit holds across all of them.
"""

from __future__ import annotations

from collections.abc import Callable


class CapacityError(Exception):
    """Every session slot is taken."""


class SessionSlots:
    """At most ``limit`` sessions at a time; ``on_count`` hears every change of the count."""

    def __init__(self, limit: int, *, on_count: Callable[[int], None] | None = None) -> None:
        self.limit = limit
        self._taken = 0
        self._on_count = on_count

    def __len__(self) -> int:
        return self._taken

    def take(self) -> None:
        """One slot, or :class:`CapacityError` when all are taken. Synchronous: no two callers
        can both see the last free slot."""
        if self._taken >= self.limit:
            raise CapacityError(f"all {self.limit} sessions are in use")
        self._taken += 1
        self._changed()

    def give_back(self) -> None:
        if self._taken <= 0:
            raise RuntimeError("a session slot was given back that was never taken")
        self._taken -= 1
        self._changed()

    def _changed(self) -> None:
        if self._on_count is not None:
            self._on_count(self._taken)
