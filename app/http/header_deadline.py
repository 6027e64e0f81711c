"""Slow clients at the edge: a connection has ``header_timeout_s`` (Settings) to send each request's headers.

uvicorn's HTTP/1.1 protocol waits for a request's headers without a bound: 300 connections that
each sent half a request line were all kept (open files 25 → 325; a systemd unit's default limit
is 1,024). :class:`HeaderDeadlineProtocol` is uvicorn's h11 protocol with one timer: armed when the
connection opens and again when a response completes (a keep-alive connection waiting for its
next request), it closes the connection if the request's headers are not all in when it fires.
A request whose headers arrived (its body, a WebSocket, a long response) is never timed by it.
Open connections as a whole are bounded by uvicorn's ``limit_concurrency`` (``--max-connections``:
past it, new requests get 503).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)


def header_deadline_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's ``http`` protocol class for ``uvicorn.run(http=...)``, with this deadline."""

    class Configured(HeaderDeadlineProtocol):
        pass

    Configured.header_timeout_s = header_timeout_s
    return Configured


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol; a request's headers must be in within ``header_timeout_s``."""

    header_timeout_s: float
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_overdue)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_overdue(self) -> None:
        self._header_deadline = None
        # Waiting for a request's headers: h11 is idle on their side (a request in progress, a
        # WebSocket upgrade or a closed connection has moved on).
        if self.transport.is_closing() or self.transport.get_protocol() is not self or self.conn.their_state is not h11.IDLE:
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        logger.info("closing %s's connection: no complete request headers within %.0f s", client, self.header_timeout_s)
        self.transport.close()
