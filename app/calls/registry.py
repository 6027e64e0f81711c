"""The open sessions of one server, whatever carries them: WebRTC calls (in this process or a
media worker's) and WebSockets, counted together against ``--max-sessions``.

The registry knows a session only as :class:`OpenSession` (an id, its transport's name, ``close``),
so it imports nothing of aiortc or the web framework; each transport's call (``app.transports.webrtc.peer_call.Call``,
``app.transports.websocket.socket_call.SocketCall``, ``app.serving.media_workers.RemoteCall``) is one. Admission
raises :class:`CapacityError`, :class:`ClientLimitError` or :class:`ConnectingLimitError`; the routes answer them
(``app.http.call_refusals``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

logger = logging.getLogger(__name__)


class CapacityError(Exception):
    """Every session slot is taken."""


class ConnectingLimitError(Exception):
    """The client already has its most calls still connecting."""


class ClientLimitError(Exception):
    """The client already has its most sessions open."""


@dataclass(frozen=True)
class Admission:
    """Who asks for a session slot. ``client``: its address (as the trusted proxies name it);
    ``bounded``: held to the per-client bound (not a client of this machine, not the API key's
    holder); ``connects``: a WebRTC call, counted as connecting until its peer connects."""

    client: str
    bounded: bool
    connects: bool

    @property
    def client_key(self) -> str | None:
        """The client whose share of the engine its sessions draw on, besides their own: a bounded
        client's address; None (each session's own share only) for this machine's clients and the
        API key's holder, which may serve many people from one address."""
        return self.client if self.bounded else None


class OpenSession(Protocol):
    """What the registry needs of an open session, over any transport."""

    @property
    def id(self) -> str: ...
    @property
    def transport(self) -> str: ...
    async def close(self, reason: str = ...) -> None: ...


SessionT = TypeVar("SessionT", bound=OpenSession)
# What a session calls once it is released: the registry forgets it then.
OnClosed = Callable[[OpenSession, str], None]


class CallRegistry:
    """The open sessions of one server, WebRTC calls and WebSockets together, at most ``max_calls``."""

    def __init__(
        self,
        max_calls: int,
        *,
        max_connecting_per_client: int | None = None,
        max_sessions_per_client: int | None = None,
        on_count: Callable[[dict[str, int]], None] | None = None,
        on_closed: OnClosed | None = None,
    ) -> None:
        self._max_calls = max_calls
        self._max_connecting = max_connecting_per_client
        self._max_per_client = max_sessions_per_client
        self._calls: dict[str, OpenSession] = {}
        self._connecting: dict[str, str] = {}  # call id -> client address, until the peer connects
        self._bounded: dict[str, str] = {}  # call id -> client address, for sessions held to the per-client bound
        self._on_count = on_count
        self._on_closed = on_closed

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, call_id: str) -> OpenSession | None:
        """The open session ``call_id``, of any transport."""
        return self._calls.get(call_id)

    def admit(self, create: Callable[[OnClosed], SessionT], *, admission: Admission | None = None) -> SessionT:
        """Registers ``create(on_closed)``, or raises :class:`CapacityError` when full,
        :class:`ClientLimitError` when a bounded client has its most sessions open, or
        :class:`ConnectingLimitError` when a connecting client has its most calls still connecting.

        Synchronous, so admission and registration cannot interleave with another offer.
        The session must invoke ``on_closed`` once it is released; the registry forgets it then.
        """
        if len(self._calls) >= self._max_calls:
            raise CapacityError(f"all {self._max_calls} sessions are in use")
        client = admission.client if admission is not None else None
        if admission is not None and admission.bounded and self._max_per_client is not None:
            open_sessions = sum(1 for address in self._bounded.values() if address == client)
            if open_sessions >= self._max_per_client:
                raise ClientLimitError(f"{client} has {open_sessions} sessions open")
        if admission is not None and admission.connects and self._max_connecting is not None:
            connecting = sum(1 for address in self._connecting.values() if address == client)
            if connecting >= self._max_connecting:
                raise ConnectingLimitError(f"{client} has {connecting} calls still connecting")
        call = create(self._forget)
        self._calls[call.id] = call
        if admission is not None and admission.connects:
            self._connecting[call.id] = admission.client
        if admission is not None and admission.bounded:
            self._bounded[call.id] = admission.client
        self._count_changed()
        return call

    def connected(self, call_id: str) -> None:
        """The call's peer connected: it no longer counts against its client's connecting calls."""
        self._connecting.pop(call_id, None)

    def counts(self) -> dict[str, int]:
        """Open sessions by transport."""
        counts: dict[str, int] = {}
        for call in self._calls.values():
            counts[call.transport] = counts.get(call.transport, 0) + 1
        return counts

    async def close_all(self, reason: str = "server_shutdown") -> None:
        await _gather_all(call.close(reason) for call in list(self._calls.values()))

    def _forget(self, call: OpenSession, reason: str) -> None:
        self._connecting.pop(call.id, None)
        self._bounded.pop(call.id, None)
        if self._calls.pop(call.id, None) is None:
            return
        self._count_changed()
        if self._on_closed is not None:
            self._on_closed(call, reason)

    def _count_changed(self) -> None:
        if self._on_count is not None:
            self._on_count(self.counts())


async def _gather_all(closes: Iterable[Any]) -> None:
    results = await asyncio.gather(*closes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            logger.error("closing a call failed", exc_info=result)
