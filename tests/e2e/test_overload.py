"""An overloaded media worker shows in /healthz and /metrics (real server, real aiortc peer).

A worker is overloaded when its event loop cannot hand out each call's 20 ms frames on time.
Here the loop is blocked outright (three 300 ms stalls, as a CPU-starved worker would be):
the call's outbound track falls behind, and the server must say so.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from app.client.webrtc import RealtimeClient
from app.config import Settings
from app.http.server import create_app
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_worker_that_falls_behind_is_reported_overloaded(tmp_path) -> None:
    # One process (media_workers=1): the call must live on this test's own loop, which it blocks.
    # A worker process behind a front is stalled the same way in test_media_workers (SIGSTOP).
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            before = (await http.get("/healthz")).json()["workers"]
            assert [worker["overloaded"] for worker in before] == [False]
            async with RealtimeClient(url, ice_loopback=True) as client:
                await client.wait_for("session.created")
                await asyncio.sleep(1.0)  # frames flowing on time
                for _ in range(3):
                    time.sleep(0.3)  # blocks the loop: nothing is paced meanwhile
                    await asyncio.sleep(0.1)
                health = (await http.get("/healthz")).json()
                metrics = (await http.get("/metrics")).text
    [worker] = health["workers"]
    assert worker["overloaded"] is True
    assert worker["skipped_frames"] >= 3 * 10  # 300 ms stalls: at least 10 slots each past the 60 ms limit
    assert metric(metrics, 'omni_rtc_media_worker_overloaded{worker="0"}') == 1.0
    assert metric(metrics, 'omni_rtc_outbound_frames_skipped_total{worker="0"}') == worker["skipped_frames"]
    assert metric(metrics, 'omni_rtc_outbound_frame_lateness_seconds_bucket{le="+Inf",worker="0"}') > 50
