"""Processes the edge tests run beside the server: the server itself as deployed (``omni-rtc serve``
with an environment), and the proxies and relays in front of it (nginx, Caddy, coturn), each
stopped when its block ends, its log kept for a failing test's message."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# As tests/e2e/conftest.py: imports torch twice and loads the model, on 2 shared cores.
STARTUP_DEADLINE_S = 180.0
SHUTDOWN_DEADLINE_S = 30.0
LISTEN_DEADLINE_S = 30.0


def get_json(url: str, *, headers: dict[str, str] | None = None, cafile: Path | None = None) -> dict:
    context = ssl.create_default_context(cafile=str(cafile)) if cafile is not None else None
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.load(response)


def healthy(url: str, *, cafile: Path | None = None) -> Callable[[], bool]:
    """A probe: ``GET /healthz`` answers ``ok``."""
    def probe() -> bool:
        try:
            return get_json(f"{url}/healthz", cafile=cafile)["status"] == "ok"
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
    return probe


def listening(host: str, port: int) -> Callable[[], bool]:
    """A probe: something accepts TCP connections on ``host:port``."""
    def probe() -> bool:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            return False
        return True
    return probe


@dataclass(frozen=True)
class Launch:
    """A process to run: ``ready()`` says it serves. SIGINT stops an ``omni-rtc serve`` gracefully
    (every call closed before the engine); the others take SIGTERM."""

    command: Sequence[str]
    log_path: Path
    ready: Callable[[], bool]
    env: dict[str, str] | None = None
    deadline_s: float = LISTEN_DEADLINE_S
    stop_signal: int = signal.SIGTERM


@contextlib.contextmanager
def running_together(*launches: Launch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Starts every process at once (servers spend their start loading models: in parallel, the
    wait is the longest, not the sum), enters once each is ready, stops them all when the block ends."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for launch in launches:
            with open(launch.log_path, "wb") as log:
                processes.append(
                    subprocess.Popen(list(launch.command), stdout=log, stderr=subprocess.STDOUT, env=launch.env)
                )
        for launch, process in zip(launches, processes, strict=True):
            _wait_until_ready(launch, process)
        yield processes
    finally:
        stop_all(processes, [launch.stop_signal for launch in launches])


def stop_all(processes: Sequence[subprocess.Popen[bytes]], stop_signals: Sequence[int]) -> None:
    """Signals every process still running (all at once: they stop in parallel), then waits for
    each, killing one that outlives ``SHUTDOWN_DEADLINE_S``."""
    for process, stop_signal in zip(processes, stop_signals, strict=False):
        if process.poll() is None:
            process.send_signal(stop_signal)
    for process in processes:
        try:
            process.wait(timeout=SHUTDOWN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running(command: Sequence[str], **launch: Any) -> Iterator[subprocess.Popen[bytes]]:
    """One process, as :func:`running_together` runs it (the keywords are :class:`Launch`'s)."""
    with running_together(Launch(command, **launch)) as [process]:
        yield process


def _wait_until_ready(launch: Launch, process: subprocess.Popen[bytes]) -> None:
    name = Path(launch.command[0]).name
    give_up = time.monotonic() + launch.deadline_s
    while not launch.ready():
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{launch.log_path.read_text()[-4000:]}")
        if time.monotonic() > give_up:
            raise RuntimeError(f"{name} was not ready within {launch.deadline_s:g} s:\n{launch.log_path.read_text()[-4000:]}")
        time.sleep(0.3)
