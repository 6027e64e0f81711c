"""Streaming Code2Wav: how exact its chunks are against one whole decode, and what a frame costs.

Run: .venv/bin/python tests/bench/code2wav.py --config real --frames 300
     [--path stream|left-context] [--schedules engine|all-sizes] [--threads 1] [--label NAME]
     [--out tests/bench/results/code2wav.json]

A Code2Wav with random weights in float32 (``--config real``: Qwen3-Omni-30B-A3B-Instruct's
``code2wav_config``, pipeline/local/qwen3_omni_config.py; ``narrow``: the same layout with the test's
narrow widths) decodes ``--frames`` seeded random frames once whole, then chunk by chunk under
each schedule, each first chunk 4 frames as the engine's:

- ``--path stream``: ``pipeline.local.code2wav.StreamingCode2Wav``, this tree's engine (carried state);
- ``--path left-context``: the engine before it, re-implemented here: each chunk decoded
  whole with up to 25 already decoded frames before it (vllm-omni's left context), its
  final samples kept.

``--schedules engine``: 4 then 25-frame chunks (vllm-omni's; the engine without adaptive
chunks), 4 then 100 (the largest adaptive chunk), a growing schedule as the adaptive chunker
makes when the engine is faster than real time, the window's edges (the cache exactly full,
chunks of 71-73), and single frames. ``all-sizes``: runs that together hold every chunk size
from 1 to 100 (slow with the real widths: ~5,000 frames).

Per schedule: the error against the whole decode, relative to its peak (max |chunks - whole| /
max |whole|) and as energy (dB of the difference's RMS against the signal's), and the time.
``ms_per_frame`` is the 4-then-25 schedule's time per frame. The last line printed is one JSON
object: ``max_rel_error`` over the schedules and ``ms_per_frame``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from harness import machine, write_report  # this folder: a script's is first on sys.path
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from pipeline.local.code2wav import StreamingCode2Wav
from pipeline.local.qwen3_omni_config import code2wav_config
from tests.chunk_schedules import schedules_covering

RESULTS = Path(__file__).resolve().parent / "results" / "code2wav.json"
FIRST_CHUNK = 4
LEFT_CONTEXT = 25  # the engine's left_context_frames before streaming carried state
NARROW = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "decoder_dim": 16}
TIMED = "4 then 25"


def fill(schedule: list[int], frames: int) -> list[int]:
    """``schedule`` cut or completed (by repeating its last size) to exactly ``frames`` frames."""
    out: list[int] = []
    sizes = iter(schedule)
    size = schedule[-1]
    while sum(out) < frames:
        size = next(sizes, size)
        out.append(min(size, frames - sum(out)))
    return out


def engine_schedules(frames: int) -> dict[str, list[int]]:
    return {
        TIMED: fill([FIRST_CHUNK, 25], frames),
        "4 then 100": fill([FIRST_CHUNK, 100], frames),
        "growing": fill([FIRST_CHUNK, 5, 10, 20, 40, 80, 100], frames),
        "window edges": fill([FIRST_CHUNK, 67, 1, 72, 73, 71, 12], frames),
        "single frames": fill([FIRST_CHUNK] + [1] * 40 + [frames], frames),
    }


def all_size_schedules(frames: int) -> dict[str, list[int]]:
    runs = schedules_covering(range(1, 101), frames=frames, first=FIRST_CHUNK)
    return {TIMED: fill([FIRST_CHUNK, 25], frames), **{f"sizes {run[1]}..{run[-1]}": run for run in runs}}


def decode_streaming(model, codes: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    return StreamingCode2Wav(model).decode_in_chunks(codes, schedule)


def decode_with_left_context(model, codes: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    samples_per_frame = int(model.total_upsample)
    pieces, start, emitted = [], 0, 0
    for size in schedule:
        context_start = max(0, start - LEFT_CONTEXT)
        wave = model(codes[..., context_start : start + size])[0, 0]
        pieces.append(wave[emitted - context_start * samples_per_frame :])
        emitted = context_start * samples_per_frame + wave.shape[-1]
        start += size
    return torch.cat(pieces)


def errors(got: torch.Tensor, whole: torch.Tensor) -> tuple[float, float]:
    if got.shape != whole.shape:
        raise RuntimeError(f"chunks hold {got.shape[-1]} samples, the whole decode {whole.shape[-1]}")
    difference = got - whole
    relative = (difference.abs().max() / whole.abs().max()).item()
    rms = difference.pow(2).mean().sqrt().item()
    db = 20 * math.log10(max(rms, 1e-30) / whole.pow(2).mean().sqrt().item())
    return relative, db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=["real", "narrow"], default="real")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--path", choices=["stream", "left-context"], default="stream")
    parser.add_argument("--schedules", choices=["engine", "all-sizes"], default="engine")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--label", default=None, help="the result entry to write (default: the path)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = code2wav_config(**(NARROW if args.config == "narrow" else {}))
    model = Qwen3OmniMoeCode2Wav(config).eval()
    codes = torch.randint(0, config.codebook_size, (1, config.num_quantizers, args.frames), generator=torch.Generator().manual_seed(1))
    decode = decode_streaming if args.path == "stream" else decode_with_left_context
    schedules = (engine_schedules if args.schedules == "engine" else all_size_schedules)(args.frames)

    rows = []
    with torch.inference_mode():
        started = time.perf_counter()
        whole = model(codes)[0, 0]
        whole_s = time.perf_counter() - started
        print(f"whole decode of {args.frames} frames: {whole_s:.2f} s", flush=True)
        for name, schedule in schedules.items():
            started = time.perf_counter()
            got = decode(model, codes, schedule)
            seconds = time.perf_counter() - started
            relative, db = errors(got, whole)
            rows.append({"schedule": name, "chunks": len(schedule), "max_rel_error": relative, "error_db": db, "seconds": seconds})
            print(f"  {name}: {len(schedule)} chunks, error {relative:.2e} ({db:.0f} dB), {seconds:.2f} s", flush=True)

    timed = next(row for row in rows if row["schedule"] == TIMED)
    summary = {
        "config": args.config,
        "path": args.path,
        "frames": args.frames,
        "schedules": args.schedules,
        "max_rel_error": max(row["max_rel_error"] for row in rows),
        "max_error_db": max(row["error_db"] for row in rows),
        "ms_per_frame": 1000 * timed["seconds"] / args.frames,
        "whole_decode_ms_per_frame": 1000 * whole_s / args.frames,
    }
    print(f"\n{'schedule':<16} {'chunks':>6} {'max rel error':>14} {'error dB':>9} {'seconds':>8}")
    for row in rows:
        print(f"{row['schedule']:<16} {row['chunks']:>6} {row['max_rel_error']:>14.2e} {row['error_db']:>9.0f} {row['seconds']:>8.2f}")
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report[args.label or args.path] = {
        "machine": machine(threads=args.threads, torch=torch.__version__),
        "summary": summary,
        "rows": rows,
    }
    write_report(args.out, report)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
