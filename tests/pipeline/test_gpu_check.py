"""scripts/gpu-check.sh as far as a machine without a GPU can run it: the same steps on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"


def gpu_check(*arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHON": sys.executable} | env,
    )


def test_the_dry_run_on_cpu_runs_a_bfloat16_turn_and_the_ttfa_bench(tmp_path):
    completed = gpu_check("--device", "cpu", "--dtype", "bfloat16", "--tokens", "8", "--out", str(tmp_path))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    table = completed.stdout[completed.stdout.index("gpu-check on cpu (bfloat16)") :]
    rows = {line.split("  ")[0]: line for line in table.splitlines()[2:]}
    assert "full turn (engine)  ok" in rows["full turn (engine)"]
    assert "32 tokens" in rows["full turn (engine)"]
    assert "TTFA bench          ok" in rows["TTFA bench"]
    assert rows["per-frame bench"].split()[2] in {"ok", "absent"}
    report = json.loads((tmp_path / "ttfa.json").read_text())
    assert report["machine"]["dtype"] == "bfloat16" and [row["tokens"] for row in report["rows"]] == [8]


def test_without_a_visible_gpu_it_says_so_and_fails():
    completed = gpu_check(CUDA_VISIBLE_DEVICES="")
    assert completed.returncode == 2
    assert "no CUDA device is visible" in completed.stderr and "--device cpu" in completed.stderr
