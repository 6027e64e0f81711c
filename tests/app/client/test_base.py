"""What both headless clients share: waiting for the next event that matches."""

from __future__ import annotations

import asyncio

import pytest

from app.client.base import ClientError, RealtimeClientBase


class Client(RealtimeClientBase):
    """Connected to nothing: a test hands it events, or says the server has gone."""

    def __init__(self) -> None:
        super().__init__(timeout_s=5.0)
        self.gone: str | None = None

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def receive(self, event: dict) -> None:
        self.events.append(event)
        self._notify()

    def _server_gone(self) -> str | None:
        return self.gone


async def test_wait_for_returns_an_event_already_received() -> None:
    async with Client() as client:
        client.receive({"type": "session.created"})
        assert await client.wait_for("session.created") == {"type": "session.created"}


async def test_wait_for_waits_for_the_next_match_from_its_start_index() -> None:
    async with Client() as client:
        client.receive({"type": "response.done", "n": 1})
        waiting = asyncio.ensure_future(client.wait_for("response.done", start=1))
        await asyncio.sleep(0)
        client.receive({"type": "response.created"})
        client.receive({"type": "response.done", "n": 2})
        assert await waiting == {"type": "response.done", "n": 2}


async def test_wait_for_takes_a_test_of_the_event() -> None:
    async with Client() as client:
        client.receive({"type": "error", "error": {"code": "rate_limited"}})
        client.receive({"type": "error", "error": {"code": "invalid_value"}})
        found = await client.wait_for(lambda event: event.get("error", {}).get("code") == "invalid_value")
        assert found["error"]["code"] == "invalid_value"


async def test_wait_for_gives_up_at_its_timeout() -> None:
    async with Client() as client:
        with pytest.raises(TimeoutError):
            await client.wait_for("response.done", timeout_s=0.05)


async def test_a_server_that_has_gone_ends_the_wait_with_why() -> None:
    async with Client() as client:
        waiting = asyncio.ensure_future(client.wait_for("response.done"))
        await asyncio.sleep(0)
        client.gone = "the server closed the data channel"
        client.receive({"type": "response.created"})
        with pytest.raises(ClientError, match="closed the data channel"):
            await waiting


async def test_a_failed_connect_closes_what_it_opened() -> None:
    closed: list[bool] = []

    class Refused(Client):
        async def connect(self) -> None:
            raise ClientError("403")

        async def close(self) -> None:
            closed.append(True)

    with pytest.raises(ClientError):
        async with Refused():
            pass
    assert closed == [True]
