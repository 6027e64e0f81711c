"""A real server for the end-to-end tests: ``omni-rtc serve`` on 127.0.0.1 with the dev model.

It runs as a subprocess (its own event loop, engine process and logs, as deployed), gathers
ICE candidates on 127.0.0.1 only (``--ice-loopback``), and ends calls whose peer has sent no
media for ``DISCONNECT_TIMEOUT_S``. One server serves every e2e test of a test process (``make test``
runs two, each taking whole files: pytest-xdist's ``--dist loadfile``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from tests.listening_ports import free_port

# Short, so a peer that vanishes is released quickly; every test client sends media
# continuously (a paced microphone track, silence between utterances).
DISCONNECT_TIMEOUT_S = 3.0
# The random dev model ends an answer after 1 in 24 tokens on average, and speaks one codec frame
# (80 ms) per token: answers of at least 12 tokens are about a second of speech or more. At most
# 4 s of speech (50 frames) keeps every turn short.
GENERATION = {"force_output_tokens": 12, "max_audio_frames": 50}
# Start-up builds nothing (the dev model is built by the fixture) but imports torch twice
# (server and engine process) and loads the model, on 2 shared cores.
STARTUP_DEADLINE_S = 180.0
SHUTDOWN_DEADLINE_S = 30.0


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def open_sessions(base_url: str) -> int:
    return int(get_json(f"{base_url}/healthz")["sessions"])


def wait_for_sessions(base_url: str, expected: int, *, deadline_s: float = 60.0) -> int:
    """The open session count once it equals ``expected``, or the last count seen at the deadline."""
    give_up = time.monotonic() + deadline_s
    sessions = open_sessions(base_url)
    while sessions != expected and time.monotonic() < give_up:
        time.sleep(0.2)
        sessions = open_sessions(base_url)
    return sessions


@contextlib.asynccontextmanager
async def serving_in_process(app: FastAPI, **config: Any) -> AsyncIterator[str]:
    """Serves ``app`` with uvicorn on 127.0.0.1 in the running loop; yields its base URL.

    As ``omni-rtc serve`` runs it: uvicorn reads no forwarded header (the app does, from its
    trusted proxies). ``config`` goes to uvicorn (``ssl_certfile``... for HTTPS).
    """
    server = uvicorn.Server(  # port 0: the kernel picks a free one as it binds
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", proxy_headers=False, **config)
    )
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                if serving.done():
                    serving.result()  # start-up failed: raise why
                await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"{'https' if config.get('ssl_certfile') else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


@pytest.fixture(scope="session")
def server_url(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(dev_model_dir, tmp_path_factory.mktemp("server")) as base_url:
        yield base_url


@contextlib.contextmanager
def running_server(
    dev_model_dir: Path, log_dir: Path, *extra_args: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``omni-rtc serve`` on a free port of 127.0.0.1 with the dev model, until the block ends;
    ``extra_args``: more flags (a module that needs a server of its own); ``env``: variables set
    over :func:`server_env`'s."""
    port = free_port()
    log_path = log_dir / "server.log"
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            server_command(dev_model_dir, port, *extra_args), stdout=log, stderr=subprocess.STDOUT,
            env={**server_env(), **(env or {})},
        )
    try:
        wait_until_healthy(base_url, process, log_path)
        yield base_url
    finally:
        process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown: the lifespan closes every call
        try:
            process.wait(timeout=SHUTDOWN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"the server did not shut down within {SHUTDOWN_DEADLINE_S:g} s; log: {log_path}")


def server_env() -> dict[str, str]:
    return {
        **os.environ,
        "OMNI_RTC_DISCONNECT_TIMEOUT_S": str(DISCONNECT_TIMEOUT_S),
        "OMNI_RTC_GENERATION": json.dumps(GENERATION),
        "OMNI_RTC_ENGINE_THREADS": "1",  # 2 cores shared by the whole team
    }


def server_command(dev_model_dir: Path, port: int, *extra_args: str) -> list[str]:
    """``omni-rtc serve`` on ``port`` of 127.0.0.1 with the dev model (run it with :func:`server_env`)."""
    return [
        sys.executable, "-m", "app.cli", "serve",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(dev_model_dir), "--device", "cpu", "--seed", "0",
        "--ice-loopback", "--log-level", "info", *extra_args,
    ]


def wait_until_healthy(base_url: str, process: subprocess.Popen, log_path: Path) -> None:
    give_up = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < give_up:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if get_json(f"{base_url}/healthz")["status"] == "ok":
                return
        except (urllib.error.URLError, ConnectionError):
            pass  # not listening yet
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy within {STARTUP_DEADLINE_S:g} s:\n{log_path.read_text()[-4000:]}")
