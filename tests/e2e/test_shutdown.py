"""Stopping ``omni-rtc serve`` as a terminal or a service manager does: the signal reaches the
whole process group (Ctrl-C in a terminal: SIGINT; systemd's default ``KillMode=control-group``
and GNU ``timeout``: SIGTERM), the media workers and the engine process included. The front
alone decides the order: every call closed, then the workers, then the engine; nothing is taken
for a crash and nothing is started again.

The order is watched from outside: the test polls each process of the server (its pids from the
log) and notes when it is seen gone; a call's worker logs its end before it exits."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from app.client.webrtc import RealtimeClient
from tests.e2e.conftest import (
    SHUTDOWN_DEADLINE_S,
    server_command,
    server_env,
    wait_until_healthy,
)
from tests.listening_ports import free_port

pytestmark = pytest.mark.e2e

POLL_S = 0.005


def server_processes(logged: str) -> dict[str, int]:
    """The pids of the media workers and the engine process, as the front logged them at start."""
    workers = re.search(r"media workers ready: pids \[([\d, ]+)\]", logged)
    engine = re.search(r"engine process (\d+) ready", logged)
    assert workers is not None and engine is not None, logged[-4000:]
    pids = {f"worker {index}": int(pid) for index, pid in enumerate(workers.group(1).split(", "))}
    return {**pids, "engine": int(engine.group(1))}


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def has_exited(pid: int) -> bool:
    """Gone, or a zombie: exited, not yet reaped by its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or reaped between open and read
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # the state follows the command's name


def exit_polls(pids: dict[str, int], deadline_s: float) -> dict[str, int]:
    """Blocking: polls every POLL_S until every process has exited; for each, the number of the
    first poll that saw it gone (two that exited within one poll share a number)."""
    seen: dict[str, int] = {}
    give_up = time.monotonic() + deadline_s
    poll = 0
    while len(seen) < len(pids) and time.monotonic() < give_up:
        for name, pid in pids.items():
            if name not in seen and has_exited(pid):
                seen[name] = poll
        poll += 1
        time.sleep(POLL_S)
    return seen


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
        pids = server_processes(log_path.read_text())
        async with RealtimeClient(base_url, ice_loopback=True) as client:
            await client.wait_for("session.created")
            watching = asyncio.create_task(asyncio.to_thread(exit_polls, pids, SHUTDOWN_DEADLINE_S))
            # The group gets it all at once; the workers' forkserver (their parent) first, as it
            # may: killed by it, it took the workers' exit statuses with it, and the front,
            # reading them as gone, stopped the engine while they still closed their calls.
            os.kill(parent_of(pids["worker 0"]), stop_signal)
            os.killpg(process.pid, stop_signal)  # the group: the server is its leader
            returncode = await asyncio.to_thread(process.wait, SHUTDOWN_DEADLINE_S)
            exits = await watching
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    logged = log_path.read_text()
    # uvicorn raises the signal again once it has shut down (server.py, capture_signals): SIGINT
    # ends in the CLI's exit 0, SIGTERM in death by SIGTERM, which systemd counts a clean stop.
    assert returncode in (0, -stop_signal), logged[-4000:]
    assert set(exits) == set(pids), (exits, logged[-4000:])
    # Every worker was gone by the time the engine was: none outlived it.
    assert max(exits[name] for name in pids if name != "engine") <= exits["engine"], exits
    # The call was closed by the server, as such, before the engine was told to stop.
    call_ended = logged.find("ended: server_shutdown")
    assert 0 <= call_ended < logged.find("command pipe closed; stopping"), logged[-4000:]
    for crash in ("ended unexpectedly", "restarting it", "did not stop", "exited with code", "Traceback"):
        assert crash not in logged, logged[-4000:]
