"""scripts/gpu-check.sh as far as a machine without a GPU can run it: the dev model on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dev_model  # computes with the dev model: make test, not make test-unit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
STEPS = (
    "device",
    "Qwen's files",
    "processor ids, 5 conversations",
    "build",
    "generation config",
    "engine turn",
    "greedy stream vs generate(), float32",
    "ASR round trip",
    "thinker prefill, 10 s audio",
    "TTFA",
    "per-frame cost",
    "streaming RTF, turns together",
    "code2wav streaming",
)


def gpu_check(*arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=480,
        # No wheels folder: the check runs on this venv's packages.
        env=os.environ | {"PYTHON": sys.executable, "DEVICE_WHEELS": str(REPO / "no-such-folder")} | env,
    )


def test_the_dry_run_on_cpu_measures_every_step_and_prints_one_table(tmp_path):
    completed = gpu_check("--device", "cpu", "--tokens", "6", "--out", str(tmp_path))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    table = completed.stdout[completed.stdout.index("gpu-check on cpu (dev size, float32)") :]
    rows = {line.split("  ")[0]: line for line in table.splitlines()[2:]}
    assert list(rows) == list(STEPS)
    assert all(f"{step}  " in row and " ok " in row for step, row in rows.items())
    assert "6 tokens" in rows["engine turn"]
    assert "no --model" in rows["Qwen's files"]
    assert "5/5 equal (audio and history " in rows["processor ids, 5 conversations"]
    # The dev model's generation config as it is, and the sampling the engine takes from it.
    assert '"top_k": 20' in rows["generation config"] and "the Talker at temperature 0.9, top_k 50" in rows["generation config"]
    frames = re.search(r"text equal \(6 tokens\); codec frames (\d+) of (\d+) equal from the first \(stream: (\d+)\)",
                       rows["greedy stream vs generate(), float32"])
    assert frames and int(frames[1]) == int(frames[2]) == int(frames[3]) > 0
    assert "WER " in rows["ASR round trip"] and "random weights" in rows["ASR round trip"]
    assert "ms per frame: thinker token" in rows["per-frame cost"] and "(18 frames" in rows["per-frame cost"]
    assert all(f"{turns}: RTF" in rows["streaming RTF, turns together"] for turns in (1, 4, 8))
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [row["step"] for row in report["rows"]] == list(STEPS)
    error = float(rows["code2wav streaming"].split("max relative error ")[1].split(";")[0])
    assert error <= 1e-4  # float32: streaming is exact


def test_without_a_visible_gpu_it_says_so_and_fails():
    completed = gpu_check(CUDA_VISIBLE_DEVICES="")
    assert completed.returncode == 2
    assert "no CUDA device is visible" in completed.stderr and "--device cpu" in completed.stderr

