"""Stopping ``omni-rtc serve`` as a terminal or a service manager does: the signal reaches the
whole process group (Ctrl-C in a terminal: SIGINT; systemd's default ``KillMode=control-group``
and GNU ``timeout``: SIGTERM), the media workers and the engine process included. The front
alone decides the order: every call closed, then the workers, then the engine; nothing is taken
for a crash and nothing is started again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest

from app.client.webrtc import RealtimeClient
from tests.e2e.conftest import (
    SHUTDOWN_DEADLINE_S,
    free_port,
    server_command,
    server_env,
    wait_until_healthy,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "service-stop"])
async def test_a_stop_signal_to_the_whole_process_group_closes_calls_then_workers_then_the_engine(
    dev_model_dir: Path, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    port, log_path = free_port(), tmp_path / "server.log"
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            server_command(dev_model_dir, port, "--media-workers", "2"),
            stdout=log, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True,
        )
    try:
        await asyncio.to_thread(wait_until_healthy, base_url, process, log_path)
        async with RealtimeClient(base_url, ice_loopback=True) as client:
            await client.wait_for("session.created")
            os.killpg(process.pid, stop_signal)  # the group: the server is its leader
            returncode = await asyncio.to_thread(process.wait, SHUTDOWN_DEADLINE_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    logged = log_path.read_text()
    # uvicorn raises the signal again once it has shut down (server.py, capture_signals): SIGINT
    # ends in the CLI's exit 0, SIGTERM in death by SIGTERM, which systemd counts a clean stop.
    assert returncode in (0, -stop_signal), logged[-4000:]
    assert "ended: server_shutdown" in logged  # the call was closed by the server, as such
    for crash in ("ended unexpectedly", "restarting it", "did not stop", "Traceback"):
        assert crash not in logged, logged[-4000:]
