"""What one codec frame costs, stage by stage, in a streamed turn.

Run: .venv/bin/python tests/bench/frame_cost.py [--tokens 64] [--frames-per-token 3] [--turns 3]
     [--threads 1] [--model DIR] [--device cpu] [--dtype float32] [--label after]
     [--out tests/bench/results/frame_cost.json]

One spoken turn (the one ``tests/bench/ttfa.py`` answers) is streamed ``--turns`` times with a
forced length of N Thinker tokens (sampling as ttfa.py: temperature 0.8, seed 0). The stages of
``pipeline.local.generation`` are timed by wrapping their methods from outside:

- thinker step: ``DecodeBatch.step_thinker`` (one answer token: forward, processors,
  sampling, the Talker's projection of it);
- talker step: ``DecodeBatch.step_talker`` less the code predictor inside it (one
  first-layer codec token: forward, processors, sampling);
- code predictor: ``TalkerDecoder.residual_codes`` (pipeline/local/decoder.py: the 15 residual codes of a frame);
- code2wav: ``DecodeBatch.decode_chunks`` (per frame = all chunks / frames);
- prefill: the Thinker's and the Talker's prefill (once per turn, not per frame);
- python overhead: the turn's time outside all of the above (the ``stream_generation`` loop,
  detokenization, events).

Host syncs are the device-to-host reads (``Tensor.item``, ``tolist``, ``cpu``, ``numpy``) made
in the whole turn (prefill's few included), per frame; on CPU they cost little, on CUDA each one waits for the GPU queue to drain, so
they are counted per frame. Times are this process's CPU seconds (one thread: the compute
alone, whatever else loads the machine) and wall seconds; the per-frame table is the median
over turns. A result file keeps one entry per ``--label`` (e.g. ``before`` and ``after``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline.contract import AudioChunk, GenerationDone
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.decoder import TalkerDecoder
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_report  # noqa: E402
from ttfa import SEED, TEMPERATURE, add_model_options, loaded_model, model_name  # noqa: E402

# (stage, class, method): the methods whose time is charged to a stage. The talker step's
# time includes its code predictor call; the table subtracts it. (The ``before`` entry in the
# results was measured on the per-turn decoders these replaced, _ThinkerDecoder.step etc.)
STAGES: tuple[tuple[str, type, str], ...] = (
    ("thinker prefill", DecodeBatch, "prefill_thinker"),
    ("talker prefill", DecodeBatch, "prefill_talker"),
    ("thinker step", DecodeBatch, "step_thinker"),
    ("talker step", DecodeBatch, "step_talker"),
    ("code predictor", TalkerDecoder, "residual_codes"),
    ("code2wav", DecodeBatch, "decode_chunks"),
)
HOST_SYNCS = ("item", "tolist", "cpu", "numpy")


class Meter:
    """Accumulates wall and CPU seconds and call counts per stage, and host sync counts."""

    def __init__(self, sync: Callable[[], None] = lambda: None) -> None:
        # On an accelerator, sync waits for the queued kernels, so a stage is charged its own.
        self._sync = sync
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.syncs: dict[str, int] = defaultdict(int)

    def timed(self, stage: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._sync()
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                self._sync()
                self.wall[stage] += time.perf_counter() - wall
                self.cpu[stage] += time.process_time() - cpu
                self.calls[stage] += 1

        return wrapper

    def counted(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.syncs[name] += 1
            return method(*args, **kwargs)

        return wrapper


@contextlib.contextmanager
def instrumented(meter: Meter) -> Iterator[None]:
    originals = [(cls, name, cls.__dict__[name]) for _, cls, name in STAGES]
    originals += [(torch.Tensor, name, getattr(torch.Tensor, name)) for name in HOST_SYNCS]
    try:
        for stage, cls, name in STAGES:
            setattr(cls, name, meter.timed(stage, cls.__dict__[name]))
        for name in HOST_SYNCS:
            setattr(torch.Tensor, name, meter.counted(name, getattr(torch.Tensor, name)))
        yield
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def measure_turn(
    model,
    tokenizer,
    inputs,
    tokens: int,
    frames_cap: int,
    *,
    talker_frames_per_token: float | None = None,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """One forced-length turn, timed stage by stage (``sync``: waits for an accelerator's queue)."""
    params = GenerationParams(
        temperature=TEMPERATURE,
        seed=SEED,
        force_output_tokens=tokens,
        max_output_tokens=tokens,
        max_audio_frames=frames_cap,
        talker_frames_per_token=talker_frames_per_token,
    )
    meter = Meter(sync)
    chunks = 0
    with instrumented(meter):
        wall, cpu = time.perf_counter(), time.process_time()
        for event in stream_generation(model, tokenizer, inputs, params, lambda: False):
            if isinstance(event, AudioChunk):
                chunks += 1
            elif isinstance(event, GenerationDone):
                done = event
        sync()
        total_wall, total_cpu = time.perf_counter() - wall, time.process_time() - cpu
    frames = done.usage.output_audio_tokens
    rows: dict[str, dict[str, float]] = {}
    for clock, spent, total in (("cpu", meter.cpu, total_cpu), ("wall", meter.wall, total_wall)):
        talker_only = spent["talker step"] - spent["code predictor"]
        per_turn = {
            "thinker step": spent["thinker step"],
            "talker step": talker_only,
            "code predictor": spent["code predictor"],
            "code2wav": spent["code2wav"],
        }
        prefill = spent["thinker prefill"] + spent["talker prefill"]
        overhead = total - prefill - sum(per_turn.values())
        for stage, seconds in per_turn.items():
            rows.setdefault(stage, {})[clock] = seconds / frames * 1000
        rows.setdefault("python overhead", {})[clock] = overhead / frames * 1000
        rows.setdefault("frame total", {})[clock] = (total - prefill) / frames * 1000
        rows.setdefault("prefill (per turn)", {})[clock] = prefill * 1000
    return {
        "frames": frames,
        "text_tokens": done.usage.output_text_tokens,
        "chunks": chunks,
        "ms_per_frame": rows,
        "host_syncs_per_frame": {name: meter.syncs[name] / frames for name in HOST_SYNCS},
        "calls": dict(meter.calls),
        "rtf": {"wall": total_wall / (frames * 0.08), "cpu": total_cpu / (frames * 0.08)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--frames-per-token", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    add_model_options(parser, "frame_cost.json")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--label", default="after", help="the result entry to (over)write, e.g. before/after")
    args = parser.parse_args()

    model, tokenizer, inputs = loaded_model(args)
    frames_cap = args.frames_per_token * args.tokens

    measure_turn(model, tokenizer, inputs, tokens=4, frames_cap=8)  # warm-up
    turns = [measure_turn(model, tokenizer, inputs, args.tokens, frames_cap) for _ in range(args.turns)]
    stages = list(turns[0]["ms_per_frame"])
    median = {
        stage: {clock: statistics.median(t["ms_per_frame"][stage][clock] for t in turns) for clock in ("cpu", "wall")}
        for stage in stages
    }
    syncs = {name: statistics.median(t["host_syncs_per_frame"][name] for t in turns) for name in HOST_SYNCS}
    rtf = {clock: statistics.median(t["rtf"][clock] for t in turns) for clock in ("cpu", "wall")}

    print(
        f"\n{args.label}: {args.tokens} tokens, {turns[0]['frames']} frames, {turns[0]['chunks']} chunks per turn; "
        f"{args.device} {args.dtype}, {args.threads} thread(s); median of {args.turns} turns"
    )
    header = f"{'stage':<20} {'cpu ms/frame':>13} {'wall ms/frame':>14}"
    print(header)
    print("-" * len(header))
    for stage in stages:
        print(f"{stage:<20} {median[stage]['cpu']:>13.2f} {median[stage]['wall']:>14.2f}")
    print("host syncs per frame: " + ", ".join(f"{name} {count:.1f}" for name, count in syncs.items()))
    print(f"RTF (turn time / audio time): cpu {rtf['cpu']:.3f}, wall {rtf['wall']:.3f}")

    entry = {
        "command": " ".join([".venv/bin/python", "tests/bench/frame_cost.py", *sys.argv[1:]]),
        "model": model_name(args),
        "machine": machine(torch=torch.__version__, threads=args.threads, device=args.device, dtype=args.dtype),
        "settings": {"tokens": args.tokens, "frames_cap": frames_cap, "temperature": TEMPERATURE, "seed": SEED},
        "ms_per_frame": median,
        "host_syncs_per_frame": syncs,
        "rtf": rtf,
        "turns": turns,
    }
    report: dict[str, Any] = {"benchmark": "frame_cost", "runs": {}}
    if args.out.exists():
        report = json.loads(args.out.read_text())
    report["runs"][args.label] = entry
    write_report(args.out, report, note=f" ({args.label})")


if __name__ == "__main__":
    main()
