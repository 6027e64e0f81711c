"""What both headless clients (WebRTC and WebSocket) share: ``async with`` connecting and
closing, the server events received in order, and waiting for the next one that matches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Self

EventMatch = str | Callable[[dict[str, Any]], bool]  # an event type, or a test of the event


class ClientError(Exception):
    """The server refused the call, or a turn could not complete."""


class RealtimeClientBase:
    """A client's ``events`` in arrival order; ``wait_for`` returns the first match from an index
    on. A subclass connects (``connect``) and releases everything (``close``, safe twice)."""

    def __init__(self, timeout_s: float) -> None:
        self.events: list[dict[str, Any]] = []
        self._timeout_s = timeout_s
        self._changed: asyncio.Future[None] | None = None

    async def connect(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def wait_for(self, match: EventMatch, *, start: int = 0, timeout_s: float | None = None) -> dict[str, Any]:
        """The first event from index ``start`` on of this type (or passing this test).

        ``timeout_s`` defaults to the client's timeout; past it, ``TimeoutError``.
        """
        async with asyncio.timeout(self._timeout_s if timeout_s is None else timeout_s):
            return await self._next_event(match, start)

    async def _next_event(self, match: EventMatch, start: int) -> dict[str, Any]:
        matches = (lambda event: event.get("type") == match) if isinstance(match, str) else match
        seen = start
        while True:
            for event in self.events[seen:]:
                if matches(event):
                    return event
            seen = max(seen, len(self.events))
            await self._changes()

    def _notify(self) -> None:
        """Something arrived (an event, or audio): wake whoever waits in ``_changes``."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    async def _changes(self) -> None:
        """Waits for the next arrival; ``ClientError`` once the server has gone."""
        gone = self._server_gone()
        if gone:
            raise ClientError(gone)
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._changed)

    def _server_gone(self) -> str | None:
        """Why the session is over (the server closed it, or went silent), or None while it runs."""
        return None
