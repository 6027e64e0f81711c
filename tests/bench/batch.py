"""Concurrent turns on one engine: decoded together (batched) vs. one at a time (FIFO).

Run: .venv/bin/python tests/bench/batch.py [--concurrency 1 2 4 8] [--repeats 3] [--tokens 64] [--frames-per-token 3]
     [--threads 1] [--model DIR] [--device cpu] [--out tests/bench/results/batch.json]

For each concurrency N, N identical spoken turns (the turn ``tests/bench/ttfa.py`` answers:
``hello.wav`` after a short text exchange, answers forced to ``--tokens`` Thinker tokens and
at most ``frames-per-token`` codec frames per token, engine seed 0, temperature 0.8) are
submitted at the same moment to a real ``TransformersEngine`` (its own process, one torch
thread), twice: with ``max_batch`` 8 (decoded together) and with ``max_batch`` 1 (the FIFO
queue it replaces). Per turn, from the engine's own timings (measured from submission):
TTFA = time to the first audio chunk, RTF = turn time / its seconds of audio. Aggregate
frames/s = all turns' codec frames / wall time from submission to the last GenerationDone; and per
engine CPU second (the engine process's user + system time over the same span), which other
jobs on a shared machine disturb far less than wall time. Each concurrency runs ``--repeats``
times, levels interleaved; the table shows medians.

Targets (2-core CPU, one run): batched, 4 concurrent turns' median TTFA <= 2x a lone
turn's, and aggregate frames/s at 4 >= 2.5x a lone turn's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import soundfile as sf
import torch

from media.rates import VOICE_RATE
from pipeline.contract import AudioChunk, GenerationDone, GenerationRequest
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserText
from pipeline.local.transformers_engine import TransformersEngine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_report  # noqa: E402
from ttfa import FIXTURES, SEED, TEMPERATURE, add_model_options, checkpoint, model_name  # noqa: E402

MODES = {"batched": 8, "fifo": 1}


def spoken_request(tokens: int) -> GenerationRequest:
    pcm, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    conversation = Conversation(items=(UserText("hi there"), AssistantText("Hello! How can I help?"), UserAudio(pcm)))
    return GenerationRequest(conversation=conversation, temperature=TEMPERATURE, max_output_tokens=tokens)


async def one_turn(engine: TransformersEngine, request: GenerationRequest) -> dict[str, Any]:
    samples = 0
    async for event in engine.run_generation(request):
        if isinstance(event, AudioChunk):
            samples += len(event.pcm)
        elif isinstance(event, GenerationDone):
            done = event
    audio_s = samples / VOICE_RATE
    return {
        "queue_wait_s": done.timings.queue_wait,
        "ttfa_s": done.timings.first_audio,
        "total_s": done.timings.total,
        "audio_s": audio_s,
        "rtf": done.timings.total / audio_s,
        "frames": done.usage.output_audio_tokens,
    }


def engine_cpu_s(engine: TransformersEngine) -> float:
    times = psutil.Process(engine.pid).cpu_times()
    return times.user + times.system


async def concurrent(engine: TransformersEngine, request: GenerationRequest, turns: int) -> dict[str, Any]:
    started, cpu = time.perf_counter(), engine_cpu_s(engine)
    results = await asyncio.gather(*(one_turn(engine, request) for _ in range(turns)))
    wall, cpu = time.perf_counter() - started, engine_cpu_s(engine) - cpu
    frames = sum(result["frames"] for result in results)
    return {"turns": turns, "wall_s": wall, "engine_cpu_s": cpu, "frames": frames, "per_turn": results}


def summary(turns: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats; TTFA percentiles over every turn of every repeat."""
    per_turn = [result for run in runs for result in run["per_turn"]]
    ttfa = sorted(result["ttfa_s"] for result in per_turn)
    return {
        "turns": turns,
        "ttfa_p50_s": statistics.median(ttfa),
        "ttfa_p90_s": ttfa[min(len(ttfa) - 1, round(0.9 * (len(ttfa) - 1)))],
        "rtf_median": statistics.median(result["rtf"] for result in per_turn),
        "frames_per_s": statistics.median(run["frames"] / run["wall_s"] for run in runs),
        "frames_per_engine_cpu_s": statistics.median(run["frames"] / run["engine_cpu_s"] for run in runs),
        "runs": runs,
    }


async def run(args: argparse.Namespace, model_dir: Path) -> dict[str, list[dict[str, Any]]]:
    request = spoken_request(args.tokens)
    generation = {"force_output_tokens": args.tokens, "max_audio_frames": args.frames_per_token * args.tokens}
    rows: dict[str, list[dict[str, Any]]] = {}
    for mode, max_batch in MODES.items():
        engine = TransformersEngine(
            model_dir,
            device=args.device,
            seed=SEED,
            threads=args.threads,
            generation=generation,
            max_batch=max_batch,
        )
        await engine.start()
        try:
            await one_turn(engine, request)  # warm-up
            # Concurrency levels interleaved, so that load from other jobs falls on all alike.
            runs: dict[int, list[dict[str, Any]]] = {turns: [] for turns in args.concurrency}
            for _ in range(args.repeats):
                for turns in args.concurrency:
                    runs[turns].append(await concurrent(engine, request, turns))
            rows[mode] = [summary(turns, runs[turns]) for turns in args.concurrency]
        finally:
            await engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs per concurrency (medians)")
    parser.add_argument("--frames-per-token", type=int, default=3)
    add_model_options(parser, "batch.json")
    args = parser.parse_args()

    rows = asyncio.run(run(args, checkpoint(args)))

    print(f"\n{args.tokens} tokens per turn; {args.device}, {args.threads} engine thread(s); wall seconds")
    header = (
        f"{'mode':>8} {'turns':>5} {'TTFA p50':>9} {'TTFA p90':>9} {'RTF p50':>8} {'frames/s':>9} "
        f"{'x lone':>7} {'fr/cpu-s':>9} {'x lone':>7} {'TTFA/lone':>9}"
    )
    print(header)
    print("-" * len(header))
    ratios: dict[str, float] = {}
    for mode, mode_rows in rows.items():
        lone = next(row for row in mode_rows if row["turns"] == 1) if 1 in args.concurrency else None
        for row in mode_rows:
            speedup = row["frames_per_s"] / lone["frames_per_s"] if lone else float("nan")
            cpu_speedup = row["frames_per_engine_cpu_s"] / lone["frames_per_engine_cpu_s"] if lone else float("nan")
            ttfa_ratio = row["ttfa_p50_s"] / lone["ttfa_p50_s"] if lone else float("nan")
            row["frames_per_s_over_lone"] = speedup
            row["frames_per_engine_cpu_s_over_lone"] = cpu_speedup
            row["ttfa_p50_over_lone"] = ttfa_ratio
            print(
                f"{mode:>8} {row['turns']:>5} {row['ttfa_p50_s']:>9.3f} {row['ttfa_p90_s']:>9.3f} "
                f"{row['rtf_median']:>8.2f} {row['frames_per_s']:>9.1f} {speedup:>7.2f} "
                f"{row['frames_per_engine_cpu_s']:>9.1f} {cpu_speedup:>7.2f} {ttfa_ratio:>9.2f}"
            )
            if row["turns"] == 4:
                ratios[f"{mode}_ttfa_p50_4_over_lone"] = ttfa_ratio
                ratios[f"{mode}_frames_per_s_4_over_lone"] = speedup
                ratios[f"{mode}_frames_per_engine_cpu_s_4_over_lone"] = cpu_speedup
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}")

    report = {
        "benchmark": "batch",
        "command": " ".join([".venv/bin/python", "tests/bench/batch.py", *sys.argv[1:]]),
        "model": model_name(args),
        "machine": machine(torch=torch.__version__, threads=args.threads, device=args.device),
        "settings": {
            "tokens": args.tokens,
            "frames_cap": args.frames_per_token * args.tokens,
            "temperature": TEMPERATURE,
            "seed": SEED,
            "max_batch": MODES,
            "repeats": args.repeats,
        },
        "rows": rows,
        "ratios": ratios,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
