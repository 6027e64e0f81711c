"""The registry of open sessions: capacity, calls still connecting per client, forgetting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from app.calls.registry import Admission, CallRegistry, ClientLimitError, ConnectingLimitError


class Placed:
    transport = "webrtc"

    def __init__(self, call_id: str) -> None:
        self.id = call_id

    async def close(self, reason: str = "closed") -> None:
        pass


def test_calls_still_connecting_count_per_client_until_they_connect_or_end():
    registry = CallRegistry(16, max_connecting_per_client=2)
    ended: dict[str, Callable[[Any, str], None]] = {}

    def place(call_id: str, client: str) -> Placed:
        def create(on_closed: Callable[[Any, str], None]) -> Placed:
            ended[call_id] = on_closed
            return Placed(call_id)

        return registry.admit(create, admission=Admission(client, bounded=False, connects=True))

    first, second = place("a1", "10.0.0.1"), place("a2", "10.0.0.1")
    with pytest.raises(ConnectingLimitError):
        place("a3", "10.0.0.1")
    place("b1", "10.0.0.2")  # another client has its own count
    registry.connected("a1")
    place("a3", "10.0.0.1")  # a connected call no longer counts
    with pytest.raises(ConnectingLimitError):
        place("a4", "10.0.0.1")
    ended["a2"](second, "connect_timeout")
    place("a4", "10.0.0.1")  # nor does an ended one
    assert len(registry) == 4 and first.id == "a1"


def test_open_sessions_count_per_bounded_client_across_transports_until_they_end():
    registry = CallRegistry(16, max_sessions_per_client=2)
    ended: dict[str, Callable[[Any, str], None]] = {}

    def place(call_id: str, admission: Admission) -> Placed:
        def create(on_closed: Callable[[Any, str], None]) -> Placed:
            ended[call_id] = on_closed
            return Placed(call_id)

        return registry.admit(create, admission=admission)

    call = Admission("203.0.113.7", bounded=True, connects=True)
    socket = Admission("203.0.113.7", bounded=True, connects=False)
    first = place("a1", call)
    registry.connected("a1")  # connected, it still holds its slot
    place("a2", socket)
    with pytest.raises(ClientLimitError):
        place("a3", socket)
    place("b1", Admission("203.0.113.8", bounded=True, connects=False))  # another client has its own count
    for number in range(3):  # an unbounded client (this machine's, or the API key's) is held only to the total
        place(f"local{number}", Admission("127.0.0.1", bounded=False, connects=False))
    ended["a1"](first, "closed")
    place("a3", socket)  # an ended session no longer counts
    assert len(registry) == 6
