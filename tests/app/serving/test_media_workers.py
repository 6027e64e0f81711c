"""The media worker pool's placement: a client's calls go to the worker that holds its others."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from app.calls.registry import Admission, CallRegistry
from app.config import Settings
from app.realtime.session_config import SessionConfig
from app.serving.ipc import post, receive
from app.serving.media_workers import MediaWorkerPool
from app.serving.worker_messages import Hello, Offer, OfferAnswered, Shutdown, Status
from tests.fakes import ScriptedEngine

OFFER_SDP = "v=0\r\n"


class FakeWorker:
    """Plays one media worker process on the pool's socket: says who it is, reports, answers every offer."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.offers: list[Offer] = []
        self._task: asyncio.Task[None] | None = None

    async def connect(self, path: str) -> None:
        reader, writer = await asyncio.open_unix_connection(path)
        post(writer, Hello(worker=self.index, pid=os.getpid()))
        post(writer, Status(sessions=0, pacing={}, metrics=[]))
        self._task = asyncio.create_task(self._answer(reader, writer), name=f"fake media worker {self.index}")

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (message := await receive(reader)) is not None and not isinstance(message, Shutdown):
                if isinstance(message, Offer):
                    self.offers.append(message)
                    post(writer, OfferAnswered(request=message.request, call_id=message.call_id, sdp=OFFER_SDP))
        finally:
            writer.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@contextlib.asynccontextmanager
async def pool_of(tmp_path: Path, count: int) -> AsyncIterator[tuple[MediaWorkerPool, list[FakeWorker]]]:
    """A pool whose workers are ``FakeWorker``s on a socket of its own, all reported ready."""
    pool = MediaWorkerPool(Settings(cache_dir=tmp_path), count, ScriptedEngine(), CallRegistry(16))
    path = str(tmp_path / "workers.sock")
    server = await asyncio.start_unix_server(pool.serve_connection, path=path)
    workers = [FakeWorker(index) for index in range(count)]
    try:
        for worker in workers:
            await worker.connect(path)
        async with asyncio.timeout(10):  # a guard against hangs, not a speed limit
            while not all(status["ready"] for status in pool.status()):
                await asyncio.sleep(0.01)
        yield pool, workers
    finally:
        await pool.close()
        for worker in workers:
            await worker.close()
        server.close()
        await server.wait_closed()


def visitor(address: str) -> Admission:
    return Admission(address, bounded=True, connects=True)


async def test_a_clients_next_call_goes_to_the_worker_holding_its_first_with_its_key_in_the_offer(tmp_path):
    async with pool_of(tmp_path, 2) as (pool, workers):
        await pool.place_call("rtc_other", OFFER_SDP, SessionConfig(), admission=visitor("203.0.113.9"))
        await pool.place_call("rtc_first", OFFER_SDP, SessionConfig(), admission=visitor("198.51.100.7"))
        assert (pool.worker_of("rtc_other"), pool.worker_of("rtc_first")) == (0, 1)

        await pool.place_call("rtc_second", OFFER_SDP, SessionConfig(), admission=visitor("198.51.100.7"))
        await pool.place_call("rtc_third", OFFER_SDP, SessionConfig(), admission=visitor("198.51.100.7"))
        assert pool.worker_of("rtc_second") == pool.worker_of("rtc_third") == 1  # though worker 0 holds fewer calls
        assert [offer.client for offer in workers[1].offers] == ["198.51.100.7"] * 3

        # This machine's client holds no share across its sessions: the least loaded worker, no key.
        await pool.place_call("rtc_local", OFFER_SDP, SessionConfig(),
                              admission=Admission("127.0.0.1", bounded=False, connects=True))
        assert pool.worker_of("rtc_local") == 0
        assert workers[0].offers[-1].client is None
