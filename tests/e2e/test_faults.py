"""Faults: what the server does when a peer, the engine or its process misbehaves.

Two kinds of server here: the whole app in this process under uvicorn on 127.0.0.1 with a
scripted engine (so a test can stall it, and see what it was asked and what was cancelled),
and the shared dev-model server of ``conftest.py`` (for the engine process itself).
Covered elsewhere and not repeated: a peer killed outright (test_webrtc), the paced track
through event-loop stalls (tests/media/test_outbound), engine errors in a session
(tests/app/test_session), shutdown closing calls (tests/app/test_server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from app.client.webrtc import RealtimeClient
from app.config import Settings
from app.http.server import create_app
from media.outbound import OutboundAudioTrack
from pipeline.contract import EngineHealth
from tests.clock import FakeClock
from tests.e2e.conftest import get_json, serving_in_process, wait_for_sessions
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DEADLINE_S = 60.0  # a guard against hangs, not a speed limit


def serving(engine: Any, **overrides: Any) -> contextlib.AbstractAsyncContextManager[str]:
    """The whole app with ``engine`` under uvicorn on 127.0.0.1, in this process."""
    return serving_in_process(create_app(Settings(ice_loopback=True, **overrides), engine=engine))


async def text_turn(client: RealtimeClient, text: str) -> dict[str, Any]:
    """Asks for a response to ``text``; returns its response.done."""
    start = len(client.events)
    await client.send(
        {"type": "conversation.item.create",
         "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}
    )
    await client.send({"type": "response.create"})
    return await client.wait_for("response.done", start=start, timeout_s=DEADLINE_S)


async def test_stalled_engine_fails_the_response_and_the_session_serves_the_next_turn():
    engine = ScriptedEngine("one two three")
    engine.hold = asyncio.Event()  # every turn stops after its first word until released
    async with serving(engine, turn_stall_timeout_s=0.5) as url:
        async with RealtimeClient(url, ice_loopback=True, timeout_s=DEADLINE_S) as client:
            stalled = await text_turn(client, "hello?")
            engine.hold = None
            served = await text_turn(client, "hello again?")
    assert stalled["response"]["status"] == "failed"
    assert stalled["response"]["status_details"]["error"]["code"] == "engine_timeout"
    assert engine.cancelled_turns == 1  # the stalled turn was cancelled in the engine
    assert served["response"]["status"] == "completed"


async def test_stall_is_reported_as_an_error_event_too():
    engine = ScriptedEngine("one two")
    engine.hold = asyncio.Event()
    async with serving(engine, turn_stall_timeout_s=0.3) as url:
        async with RealtimeClient(url, ice_loopback=True, timeout_s=DEADLINE_S) as client:
            await text_turn(client, "hello?")
            error = await client.wait_for("error", timeout_s=DEADLINE_S)
    assert error["error"]["code"] == "engine_timeout"


async def test_peer_frozen_mid_response_is_released_and_its_engine_turn_cancelled(tmp_path: Path):
    engine = ScriptedEngine("a long answer")
    engine.hold = asyncio.Event()  # the answer is still being generated when the peer freezes
    async with serving(engine, disconnect_timeout_s=1.0) as url:
        caller = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "call", url, "--ice-loopback",
             "--wav", str(FIXTURES / "hello.wav"), "--out", str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            async with asyncio.timeout(DEADLINE_S):
                assert "connected" in await asyncio.to_thread(caller.stdout.readline)
                while not engine.requests:  # the VAD heard the utterance; the turn is running
                    await asyncio.sleep(0.05)
            # SIGSTOP: a frozen tab or a dropped network. No close, no BYE, no more packets.
            caller.send_signal(signal.SIGSTOP)
            sessions = await asyncio.to_thread(wait_for_sessions, url, 0, deadline_s=DEADLINE_S)
        finally:
            caller.kill()
            caller.wait()
            caller.stdout.close()
    assert sessions == 0
    assert engine.cancelled_turns == 1


class DeadEngine(ScriptedEngine):
    """An engine whose process has died and is being restarted."""

    def health(self) -> EngineHealth:
        return EngineHealth(alive=False, restarts=2)


async def test_healthz_reports_a_dead_engine_as_degraded_with_its_restarts():
    app = create_app(Settings(ice_loopback=True), engine=DeadEngine())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            response = await http.get("/healthz")
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"
    assert response.json()["engine"]["restarts"] == 2


async def test_healthz_is_ok_once_the_engine_has_warmed_up_and_every_worker_is_ready(server_url: str):
    health = get_json(f"{server_url}/healthz")
    assert health["status"] == "ok"
    [described] = health["engine"]["engines"]
    assert (described["state"], described["alive"]) == ("ready", True)
    assert (described["warm_up"]["turns"], described["warm_up"]["failed"]) == (4, 0)
    assert described["warm_up"]["audio_chunks"] > 0
    assert health["workers"] and all(worker["ready"] for worker in health["workers"])


def engine_process(server_url: str) -> psutil.Process:
    """The dev-model server's one engine process, known by what the server says it is.

    The serving process has other spawned children (its media workers, multiprocessing's
    resource tracker), so the engine is the pid /healthz gives for it, checked to be a child of
    the server and none of its media workers.
    """
    port = server_url.rsplit(":", 1)[1]
    [server] = [
        process for process in psutil.Process().children(recursive=True)
        if "serve" in process.cmdline() and port in process.cmdline()
    ]
    health = get_json(f"{server_url}/healthz")
    [engine_pid] = [engine["pid"] for engine in health["engine"]["engines"]]
    assert engine_pid in {child.pid for child in server.children()}
    assert engine_pid not in {worker["pid"] for worker in health["workers"]}
    return psutil.Process(engine_pid)


def wait_for_health(server_url: str, restarts: int) -> dict[str, Any]:
    give_up = time.monotonic() + 180.0  # the model reloads on 2 shared cores
    while True:
        try:
            health = get_json(f"{server_url}/healthz")
        except OSError:  # urllib raises HTTPError (an OSError) on the 503 while restarting
            health = {}
        if health.get("status") == "ok" and health["engine"]["restarts"] >= restarts:
            return health
        if time.monotonic() > give_up:
            return health
        time.sleep(0.5)


async def test_killed_engine_process_is_restarted_and_reported(server_url: str):
    before = get_json(f"{server_url}/healthz")["engine"]["restarts"]
    engine = engine_process(server_url)
    engine.kill()
    engine.wait(timeout=30)
    health = await asyncio.to_thread(wait_for_health, server_url, before + 1)
    assert health.get("status") == "ok", health
    assert health["engine"]["restarts"] == before + 1
    restarted = engine_process(server_url)
    assert restarted.pid != engine.pid
    # The new process said ready only after its warm-up turns, as the first one did.
    [described] = health["engine"]["engines"]
    assert (described["state"], described["warm_up"]["turns"], described["warm_up"]["failed"]) == ("ready", 4, 0)
    async with RealtimeClient(server_url, ice_loopback=True, timeout_s=120.0) as client:
        await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "max_output_tokens": 8}})
        done = await text_turn(client, "still there?")
    assert done["response"]["status"] in ("completed", "incomplete")


async def test_call_past_the_maximum_duration_is_told_and_ended():
    async with serving(ScriptedEngine(), max_session_s=1.0) as url:
        async with RealtimeClient(url, ice_loopback=True, timeout_s=DEADLINE_S) as client:
            error = await client.wait_for("error", timeout_s=DEADLINE_S)
            sessions = await asyncio.to_thread(wait_for_sessions, url, 0, deadline_s=DEADLINE_S)
    assert error["error"]["code"] == "session_expired"
    assert "maximum duration" in error["error"]["message"]
    assert sessions == 0


async def test_outbound_track_keeps_its_clock_through_an_engine_stall():
    """An answer whose engine stalls mid-way: silence on the same clock, then paced audio again."""
    clock = FakeClock()
    track = OutboundAudioTrack(clock=clock, sleep=clock.sleep)
    tone = (0.3 * np.sin(np.arange(4_800) * 2 * np.pi * 440 / 24_000)).astype(np.float32)  # 0.2 s
    track.write(tone)
    before = [await track.recv() for _ in range(10)]  # the first chunk plays out
    during = [await track.recv() for _ in range(25)]  # the engine produces nothing for 0.5 s
    track.write(tone)  # the engine catches up
    clock.sleeps.clear()
    after = [await track.recv() for _ in range(10)]
    track.stop()
    frames = before + during + after
    assert [frame.pts for frame in frames] == [index * 960 for index in range(len(frames))]
    # Silence while stalled (the first of these frames may still carry the resampler's tail).
    assert not any(frame.to_ndarray().any() for frame in during[1:])
    assert any(frame.to_ndarray().any() for frame in after)
    # No burst to catch up: the resumed audio's first frame goes half a frame after the last silence
    # frame (audio after silence is not held to the next slot: media/pacing.py), then every 20 ms.
    assert clock.sleeps == pytest.approx([0.01] + [0.02] * 9)


# A client that asks for a long text answer, then stops reading: its event loop blocks (as a frozen
# tab's would), so its SCTP acknowledges nothing more while the answer's deltas keep coming.
STOPS_READING = """
import asyncio, sys, time
from app.client.webrtc import RealtimeClient

async def main():
    async with RealtimeClient(sys.argv[1], ice_loopback=True, session={"output_modalities": ["text"]}) as client:
        await client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "Tell me everything."}]}})
        await client.send({"type": "response.create"})
        await client.wait_for("response.created")
        print("asked", flush=True)
        time.sleep(120)

asyncio.run(main())
"""


async def test_a_client_that_stops_reading_its_events_is_ended_with_the_reason_logged(monkeypatch, caplog):
    # A 1 MiB bound here stands for the real 16 MiB: it is passed ~5,000 deltas in. The answer is
    # 200,000 words so that it is still being generated when the call is released, however slowly
    # the release runs on a loaded machine (with 20,000 the rest was written, sent nowhere, in the
    # ~0.3 s a loaded CI run took to release the call, and nothing was left to cancel).
    monkeypatch.setattr("app.transports.webrtc.peer_call.MAX_BUFFERED_EVENT_BYTES", 1024 * 1024)
    caplog.set_level(logging.INFO, logger="app.calls.lifecycle")  # "call … ended: client_not_reading"
    engine = ScriptedEngine(" ".join(["word"] * 200_000))
    async with serving(engine, media_workers=1, disconnect_timeout_s=DEADLINE_S) as url:
        caller = subprocess.Popen([sys.executable, "-c", STOPS_READING, url], stdout=subprocess.PIPE, text=True)
        try:
            async with asyncio.timeout(DEADLINE_S):
                assert "asked" in await asyncio.to_thread(caller.stdout.readline)
            sessions = await asyncio.to_thread(wait_for_sessions, url, 0, deadline_s=DEADLINE_S)
        finally:
            caller.kill()
            caller.wait()
            caller.stdout.close()
    assert sessions == 0  # ended long before the media watch (a minute) would have
    messages = [record.getMessage() for record in caplog.records]
    assert any("does not take them; ending the call" in message for message in messages)
    assert any(message.endswith("ended: client_not_reading") for message in messages)
    assert engine.cancelled_turns == 1  # its answer stopped being generated with it
