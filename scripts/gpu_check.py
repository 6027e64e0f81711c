"""The GPU check: the dev model on CUDA in bfloat16, one full turn, the TTFA and per-frame benches.

Run: scripts/gpu-check.sh [--device cuda] [--dtype bfloat16] [--out DIR]

For the day a GPU is lent: it must run unattended, offline, in under 5 minutes, with only this
working tree and the installed packages. Steps, each bounded by its own timeout, each a row of
the table printed at the end (exit status 1 if any step failed):

1. one full spoken turn through ``TransformersEngine`` (the engine process, as the server runs
   it): engine start, time to first audio, the answer's audio seconds and level;
2. ``tests/bench/ttfa.py`` on the same device and dtype (its JSON goes to ``--out``, not over
   ``tests/bench/results/``);
3. ``tests/bench/frame_cost.py``, the per-frame cost breakdown, when present.

``--device cpu`` is a dry run of the same steps (what CI and the development machine can do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from media.rates import VOICE_RATE  # noqa: E402
from pipeline.conversation import Conversation, UserAudio  # noqa: E402
from pipeline.devmodel import ensure_dev_model  # noqa: E402
from pipeline.engine import TransformersEngine  # noqa: E402
from pipeline.turn import AudioChunk, TextDelta, TurnDone, TurnRequest  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
FRAME_COST_BENCH = REPO / "tests" / "bench" / "frame_cost.py"
# Seconds per step. Together with building the dev model (~15 s) they stay under the 5-minute
# budget: a fresh engine process loads torch and the model in ~10-20 s, a bench run on a GPU
# takes well under a minute for the dev model.
TURN_TIMEOUT_S = 90
BENCH_TIMEOUT_S = 90
# The turn: 32 answer tokens (forced: the dev Thinker stops at random), 2.6 s of speech.
TURN_TOKENS = 32


@dataclass
class Row:
    step: str
    status: str  # "ok", "FAIL", or "absent" (a bench not in this tree yet; not a failure)
    seconds: float
    figures: str


async def full_turn(model_dir: Path, device: str, dtype: str) -> str:
    started = time.perf_counter()
    generation = {"force_output_tokens": TURN_TOKENS, "max_audio_frames": 2 * TURN_TOKENS}
    engine = TransformersEngine(model_dir, device=device, dtype=dtype, seed=0, threads=1, generation=generation)
    try:
        await engine.start()
        loaded_s = time.perf_counter() - started
        pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
        request = TurnRequest(conversation=Conversation(items=(UserAudio(pcm),)), max_output_tokens=TURN_TOKENS)
        cold_first_audio_s = None
        # The first turn pays one-off costs (CUDA kernels, allocator); the second is the figure.
        for _ in range(2):
            text, chunks, first_audio_s, done = "", [], None, None
            turn_started = time.perf_counter()
            async for event in engine.run_turn(request):
                if isinstance(event, TextDelta):
                    text += event.text
                elif isinstance(event, AudioChunk):
                    first_audio_s = first_audio_s or time.perf_counter() - turn_started
                    chunks.append(event.pcm)
                elif isinstance(event, TurnDone):
                    done = event
            turn_s = time.perf_counter() - turn_started
            cold_first_audio_s = cold_first_audio_s or first_audio_s
    finally:
        await engine.close()
    if done is None:
        raise RuntimeError("the turn ended without a TurnDone")
    if first_audio_s is None or cold_first_audio_s is None:
        raise RuntimeError("a turn produced no audio")
    audio = np.concatenate(chunks)
    if not np.isfinite(audio).all():
        raise RuntimeError("the answer's audio holds NaN or infinity")
    audio_s = len(audio) / VOICE_RATE
    rms_dbfs = 20 * np.log10(max(float(np.sqrt(np.mean(audio**2))), 1e-12))
    if rms_dbfs < -60:
        raise RuntimeError(f"the answer is silent ({rms_dbfs:.0f} dBFS)")
    return (
        f"start {loaded_s:.1f} s, TTFA {first_audio_s * 1000:.0f} ms (cold {cold_first_audio_s * 1000:.0f}), "
        f"turn {turn_s:.2f} s, "
        f"{done.usage.output_text_tokens} tokens, audio {audio_s:.2f} s (RTF {turn_s / audio_s:.2f}), "
        f"{rms_dbfs:.0f} dBFS, finish {done.finish_reason}"
    )


def run_bench(script: Path, arguments: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )


def ttfa_figures(report: dict) -> str:
    parts = []
    for row in report["rows"]:
        stream = row["stream"]
        parts.append(
            f"{row['tokens']} tok: TTFA {stream['first_audio_median_s']['wall'] * 1000:.0f} ms, "
            f"RTF {stream['rtf']['wall']:.2f}"
        )
    return "; ".join(parts)


def frame_cost_arguments(device: str, dtype: str, out: Path) -> list[str]:
    """The flags frame_cost.py understands, read from its --help (it is written beside this script)."""
    usage = run_bench(FRAME_COST_BENCH, ["--help"], 60).stdout
    arguments = []
    for flag, value in (("--device", device), ("--dtype", dtype), ("--out", str(out))):
        if flag in usage:
            arguments += [flag, value]
    return arguments


def step(name: str, action) -> Row:
    started = time.perf_counter()
    try:
        figures, status = action(), "ok"
    except Exception as exc:  # every failure becomes a row of the table, and the exit status
        figures, status = f"{type(exc).__name__}: {exc}", "FAIL"
    return Row(name, status, time.perf_counter() - started, figures)


def bench_step(script: Path, arguments: list[str], summarise) -> str:
    completed = run_bench(script, arguments, BENCH_TIMEOUT_S)
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {completed.returncode}: {' | '.join(tail)}")
    return summarise(completed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", type=Path, default=None, help="where the bench JSON files go (default: a temp dir)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64, 256], help="TTFA bench answer lengths")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    rows: list[Row] = []
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("gpu-check: no CUDA device is visible (torch.cuda.is_available() is false); "
                  "use --device cpu for a dry run", file=sys.stderr)
            return 2
        rows.append(Row("device", "ok", 0.0, f"{torch.cuda.get_device_name()}, torch {torch.__version__}"))

    cache = REPO / ".cache" / "gpu-check"
    model_dir = ensure_dev_model(cache, progress=lambda message: print(f"gpu-check: {message}", flush=True))
    print(f"gpu-check: full turn on {args.device} in {args.dtype}", flush=True)
    rows.append(step("full turn (engine)", lambda: asyncio.run(
        asyncio.wait_for(full_turn(model_dir, args.device, args.dtype), TURN_TIMEOUT_S))))

    print("gpu-check: TTFA bench", flush=True)
    ttfa_json = out / "ttfa.json"
    ttfa_arguments = [
        "--model", str(model_dir), "--device", args.device, "--dtype", args.dtype,
        "--tokens", *map(str, args.tokens), "--probes", "3", "--out", str(ttfa_json),
    ]
    rows.append(step("TTFA bench", lambda: bench_step(
        REPO / "tests" / "bench" / "ttfa.py", ttfa_arguments,
        lambda _: ttfa_figures(json.loads(ttfa_json.read_text())))))

    if FRAME_COST_BENCH.exists():
        print("gpu-check: per-frame bench", flush=True)
        frame_json = out / "frame_cost.json"
        rows.append(step("per-frame bench", lambda: bench_step(
            FRAME_COST_BENCH, frame_cost_arguments(args.device, args.dtype, frame_json),
            lambda completed: " | ".join(completed.stdout.strip().splitlines()[-2:]))))
    else:
        rows.append(Row("per-frame bench", "absent", 0.0,
                        f"{FRAME_COST_BENCH.relative_to(REPO)} is not in this tree yet: merge it, then rerun"))

    width = max(len(row.step) for row in rows)
    print(f"\ngpu-check on {args.device} ({args.dtype}), {time.perf_counter() - started:.0f} s in all; bench JSON in {out}")
    print(f"{'step':<{width}}  {'result':<6} {'seconds':>7}  figures")
    for row in rows:
        print(f"{row.step:<{width}}  {row.status:<6} {row.seconds:>7.1f}  {row.figures}")
    return 1 if any(row.status == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
