"""The one lifecycle of every call (``app.calls.lifecycle``), with a stand-in transport."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from app.calls.lifecycle import CallLifecycle
from app.calls.registry import CallRegistry, OnClosed, OpenSession


class StandInCall(CallLifecycle):
    """Lives until it is ended; its release waits for ``release_may_finish`` and can fail."""

    transport = "stand-in"

    def __init__(
        self, on_closed: OnClosed | None = None, *, max_duration_s: float | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        super().__init__("call_1", max_duration_s=max_duration_s, on_closed=on_closed, idle_timeout_s=idle_timeout_s)
        self.idle_from: float | None = None  # what its session says (None: busy)
        self.last_words: list[dict[str, Any]] = []
        self.releases: list[str] = []
        self.release_may_finish = asyncio.Event()
        self.release_may_finish.set()
        self.release_fails = False

    def start(self) -> asyncio.Task[None]:
        return self._carry()

    async def _run(self) -> str:
        return await self._until_ended()

    async def _say_last(self, event: dict[str, Any]) -> None:
        self.last_words.append(event)

    def _idle_since(self) -> float | None:
        return self.idle_from

    async def _release_transport(self, reason: str) -> None:
        self.releases.append(reason)
        await self.release_may_finish.wait()
        if self.release_fails:
            raise OSError("the transport failed to close")


class Ends:
    """Records every on_closed call."""

    def __init__(self) -> None:
        self.calls: list[tuple[OpenSession, str]] = []

    def __call__(self, call: OpenSession, reason: str) -> None:
        self.calls.append((call, reason))


async def test_close_twice_releases_once_with_the_first_reason():
    ends = Ends()
    call = StandInCall(ends)
    call.start()
    await call.close("hangup")
    await call.close("again")
    assert call.releases == ["hangup"]
    assert ends.calls == [(call, "hangup")]


async def test_the_first_end_reason_stands():
    ends = Ends()
    call = StandInCall(ends)
    call.start()
    call.end("client_gone")
    call.end("server_shutdown")
    await call.closed.wait()
    assert ends.calls == [(call, "client_gone")]


async def test_a_closer_that_gives_up_waiting_does_not_cut_the_release_short():
    ends = Ends()
    call = StandInCall(ends)
    call.release_may_finish.clear()
    call.start()
    closer = asyncio.create_task(call.close("hangup"))
    while not call.releases:  # the release has begun and waits
        await asyncio.sleep(0)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert ends.calls == []  # the slot is still held: the release is under way
    call.release_may_finish.set()
    await asyncio.wait_for(call.closed.wait(), timeout=5)
    assert ends.calls == [(call, "hangup")]


async def test_a_failing_transport_release_still_frees_the_slot_and_reaches_the_closer():
    ends = Ends()
    call = StandInCall(ends)
    call.release_fails = True
    call.start()
    with pytest.raises(OSError, match="failed to close"):
        await call.close("hangup")
    assert call.closed.is_set()
    assert ends.calls == [(call, "hangup")]


async def test_a_call_closed_before_it_was_carried_is_released_by_close_and_only_once():
    ends = Ends()
    call = StandInCall(ends)
    await call.close("bad_offer")
    await call.start()  # carried afterwards (a socket served after a shutdown closed it): nothing more
    assert call.releases == ["bad_offer"]
    assert ends.calls == [(call, "bad_offer")]


async def test_past_its_duration_a_call_says_session_expired_then_ends_max_duration():
    ends = Ends()
    call = StandInCall(ends, max_duration_s=0.05)
    await call.start()
    assert [event["error"]["code"] for event in call.last_words] == ["session_expired"]
    assert "maximum duration" in call.last_words[0]["error"]["message"]
    assert ends.calls == [(call, "max_duration")]


async def test_the_end_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture):
    call = StandInCall()
    call.start()
    with caplog.at_level(logging.INFO, logger="app.calls.lifecycle"):
        await call.close("hangup")
    assert [record.getMessage() for record in caplog.records] == ["call call_1 ended: hangup"]


async def test_the_registry_forgets_a_released_call_and_counts_its_end():
    ended: list[tuple[str, str]] = []
    registry = CallRegistry(4, on_closed=lambda call, reason: ended.append((call.transport, reason)))
    call = registry.admit(lambda on_closed: StandInCall(on_closed))
    call.start()
    assert registry.counts() == {"stand-in": 1}
    await registry.close_all()
    assert len(registry) == 0 and registry.get(call.id) is None
    assert ended == [("stand-in", "server_shutdown")]


async def test_a_call_whose_session_stays_idle_says_so_and_ends_idle_timeout():
    ends = Ends()
    call = StandInCall(ends, idle_timeout_s=0.05)
    call.start()
    await asyncio.sleep(0.1)
    assert ends.calls == []  # busy (None) is never idle
    call.idle_from = asyncio.get_running_loop().time()
    await asyncio.wait_for(call.closed.wait(), timeout=5)
    assert [event["error"]["code"] for event in call.last_words] == ["session_idle_timeout"]
    assert ends.calls == [(call, "idle_timeout")]


async def test_activity_moves_the_idle_deadline():
    ends = Ends()
    call = StandInCall(ends, idle_timeout_s=0.2)
    loop = asyncio.get_running_loop()
    call.idle_from = loop.time()
    call.start()
    for _ in range(3):
        await asyncio.sleep(0.1)
        call.idle_from = loop.time()  # something happened
    assert ends.calls == []
    await call.close()
    assert ends.calls == [(call, "closed")]
