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
from pathlib import Path

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


@contextlib.contextmanager
def running(
    command: Sequence[str],
    *,
    log_path: Path,
    ready: Callable[[], bool],
    env: dict[str, str] | None = None,
    deadline_s: float = LISTEN_DEADLINE_S,
    stop_signal: int = signal.SIGTERM,
) -> Iterator[subprocess.Popen[bytes]]:
    """Runs ``command`` until the block ends; enters once ``ready()``. SIGINT stops an ``omni-rtc
    serve`` gracefully (every call closed before the engine); the others take SIGTERM."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        give_up = time.monotonic() + deadline_s
        while not ready():
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > give_up:
                raise RuntimeError(f"{command[0]} was not ready within {deadline_s:g} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.3)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(stop_signal)
            try:
                process.wait(timeout=SHUTDOWN_DEADLINE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
