"""The WebSocket call on its own: a stand-in socket and session, no server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.transports.websocket.socket_call import SocketCall


class StandInSocket:
    """Records what the call does to its socket."""

    def __init__(self) -> None:
        self.accepted = False
        self.closes: list[tuple[int, str]] = []

    async def accept(self, subprotocol: str | None = None) -> None:
        self.accepted = True

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closes.append((code, reason or ""))


class StandInSession:
    def __init__(self, output: Any, send: Callable[[dict[str, Any]], None]) -> None:
        self.starts = 0
        self.closes = 0

    async def start(self) -> None:
        self.starts += 1

    async def close(self) -> None:
        self.closes += 1


async def test_a_socket_closed_before_it_is_served_is_never_accepted_and_its_session_closes_once():
    sessions: list[StandInSession] = []
    ends: list[str] = []

    def make_session(output: Any, send: Callable[[dict[str, Any]], None]) -> StandInSession:
        sessions.append(StandInSession(output, send))
        return sessions[-1]

    socket = StandInSocket()
    call = SocketCall(socket, make_session=make_session, on_closed=lambda _, reason: ends.append(reason))  # type: ignore[arg-type]
    await call.close("server_shutdown")
    await call.serve("realtime")  # the route serves it after the shutdown closed it
    assert not socket.accepted
    assert (sessions[0].starts, sessions[0].closes) == (0, 1)
    assert socket.closes == [(1001, "server_shutdown")]
    assert ends == ["server_shutdown"]
