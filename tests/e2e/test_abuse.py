"""A hostile peer beside a well-behaved one on the same media worker: the hostile one
floods its data channel with chunks aiortc's receive path handled at a cost growing with their
square, then calls again with a camera far past the decoded size; meanwhile its neighbour's turns
complete with audio.

A real server (uvicorn in this process as the front, two spawned media workers: the calls live in
worker processes, as deployed), real aiortc peers, the real VAD, the scripted engine in front.
The hostile traffic comes from the test's own aiortc peer (tests/hostile_sctp.py,
tests/hostile_video.py). Before the fix, the flood held the worker's event loop for ~30 s
(tests/bench/sctp_abuse.py) and the camera decoded 25 MB frames without bound
(tests/bench/video_abuse.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.client.webrtc import RealtimeClient
from app.config import Settings
from app.http.server import create_app
from tests import hostile_sctp, hostile_video
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.speech import load_fixture

pytestmark = pytest.mark.e2e

SETTLE_S = 90.0  # workers start (imports, VAD) and report every 0.5 s: a guard against hangs
GAPPED_CHUNKS = 16_000  # the flood: one-byte chunks, every other TSN missing
HUGE_CAMERA = (4096, 4096)


@contextlib.asynccontextmanager
async def front(tmp_path: Any) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=2), engine=ScriptedEngine("Hi there"))
    async with serving_in_process(app) as url, httpx.AsyncClient(base_url=url) as http:
        yield url, http


async def sessions_by_worker(http: httpx.AsyncClient, condition: Callable[[list[int]], bool]) -> list[int]:
    async with asyncio.timeout(SETTLE_S):
        while not condition(counts := [worker["sessions"] for worker in (await http.get("/healthz")).json()["workers"]]):
            await asyncio.sleep(0.2)
    return counts


async def answered(client: RealtimeClient) -> int:
    """One spoken turn; the images its utterance held."""
    turn = await client.speak(load_fixture("hello"))
    assert turn.status == "completed"
    assert turn.transcript == "Hi there"
    assert turn.audible_seconds > 0
    return turn.images_shown


async def ended(client: RealtimeClient) -> str:
    async with asyncio.timeout(SETTLE_S):
        while client.ended is None:
            await asyncio.sleep(0.05)
    return client.ended


async def test_a_hostile_peer_leaves_its_neighbour_on_the_same_worker_talking(tmp_path) -> None:
    huge_camera = hostile_video.coded_frames("libvpx", *HUGE_CAMERA, count=10)  # before any call: seconds of libvpx
    async with front(tmp_path) as (url, http):
        async with (
            RealtimeClient(url, ice_loopback=True) as neighbour,  # worker 0
            RealtimeClient(url, ice_loopback=True) as filler,  # worker 1, so that the next call is worker 0's
            RealtimeClient(url, ice_loopback=True) as flooder,  # worker 0 again: the fewest calls, first
        ):
            assert await sessions_by_worker(http, lambda counts: sum(counts) == 3) == [2, 1]
            await answered(neighbour)

            sctp: Any = flooder._pc.sctp  # type: ignore[union-attr]
            flood = hostile_sctp.send(sctp, hostile_sctp.gapped(hostile_sctp.next_tsn(sctp), GAPPED_CHUNKS))
            await asyncio.gather(flood, answered(neighbour))
            # The worker ended it (data_channel_overrun), not a loop too stuck to send ("nothing heard").
            assert await ended(flooder) in ("the server closed the call", "the connection closed")
            await flooder.close()  # its tracks and watchers too: this process's loop carries every peer
            assert await sessions_by_worker(http, lambda counts: sum(counts) == 2) == [1, 1]

            camera = hostile_video.CodedVideoTrack(huge_camera, fps=10)  # ~30 KB/s
            async with RealtimeClient(url, ice_loopback=True, video=camera) as watcher:  # worker 0
                assert await sessions_by_worker(http, lambda counts: sum(counts) == 3) == [2, 1]
                await filler.close()  # placed: one peer fewer for this process's loop to carry
                assert await answered(neighbour) == 0
                assert await answered(watcher) == 0  # its frames dropped undecoded; its call goes on
                assert camera.sent > 0 and watcher.ended is None
            assert neighbour.ended is None
