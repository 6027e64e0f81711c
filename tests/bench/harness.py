"""What the benchmarks share: a loopback server's port and health, the machine, the result file.

Benchmarks run as scripts (``.venv/bin/python tests/bench/NAME.py``), so they import this as
``harness``: a script's own folder is first on ``sys.path``. Importing it puts the repository
root there too, for the helpers the benches share with the tests (``tests.*``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))

from tests.listening_ports import free_port as free_port  # noqa: E402  (the benches' servers' ports)


def wait_until_healthy(url: str, server: subprocess.Popen[bytes], deadline_s: float, poll_s: float = 0.3) -> None:
    """Until ``GET /healthz`` says "ok"; ``RuntimeError`` if the server exits or ``deadline_s`` passes
    (the first start may build the dev model)."""
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
                if json.load(response)["status"] == "ok":
                    return
        except OSError:
            pass  # not listening yet, or 503 while its engine loads
        time.sleep(poll_s)
    raise RuntimeError(f"the server did not become healthy in {deadline_s:.0f} s")


def machine(**extra: Any) -> dict[str, Any]:
    """This machine as a result file records it, plus the run's own settings (threads, device...)."""
    return {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        **extra,
    }


def write_report(out: Path, report: dict[str, Any], note: str = "") -> None:
    """Write the result file whole or not at all (a run interrupted mid-write leaves the last one)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(out)
    print(f"wrote {out}{note}")


def read_wav(path: Path) -> np.ndarray:
    """A 16-bit mono WAV (the speech fixtures) as float32 PCM, with the standard library only:
    the GPU image the device check runs on has no soundfile."""
    with wave.open(str(path)) as wav:
        if wav.getsampwidth() != 2 or wav.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono, got {wav.getsampwidth() * 8}-bit x {wav.getnchannels()}")
        frames = wav.readframes(wav.getnframes())
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
