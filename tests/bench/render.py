"""A spoken turn's prompt render with its history's audio: every past clip extracted again, or kept.

Run: .venv/bin/python tests/bench/render.py [--clip-seconds 5 15 30] [--repeats 9] [--out tests/bench/results/render.json]

The engine renders each turn's prompt between decoding steps (holding every visitor's decoding
meanwhile), and the prompt holds the history's audio clips again every turn: up to
``HistoryLimits.max_audio_clips`` (4) and 120 s. The conversation here is that bound filled: four
spoken turns of ``--clip-seconds`` each (tests/fixtures/long_story.wav repeated, each clip with
its own dither so no two are alike), three answered. Its render (dev model's renderer, one torch
thread, the caches of pipeline/local/processed_cache.py): **cold**, nothing kept, every clip's Whisper
features extracted (as before the audio cache); **warm**, after the turn before was rendered, only
the new clip's. Median of ``--repeats``, ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import machine, read_wav, write_report  # this folder: a script's is first on sys.path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from media.rates import SPEECH_RATE  # noqa: E402
from pipeline.conversation import AssistantText, Conversation, UserAudio  # noqa: E402
from pipeline.local.devmodel import ensure_dev_model  # noqa: E402
from pipeline.local.processed_cache import AUDIO_CACHE_BYTES, ProcessedCache  # noqa: E402
from pipeline.local.prompt import PromptRenderer  # noqa: E402

TURNS = 4  # HistoryLimits.max_audio_clips


def spoken_conversation(turns: int, clip_seconds: float) -> Conversation:
    """``turns`` spoken turns of ``clip_seconds`` each, all but the last answered."""
    speech = read_wav(REPO / "tests" / "fixtures" / "long_story.wav")
    samples = int(clip_seconds * SPEECH_RATE)
    base = np.resize(speech, samples)
    items: list = []
    for turn in range(turns):
        dither = np.random.default_rng(turn).normal(0.0, 1e-4, samples).astype(np.float32)
        items.append(UserAudio(base + dither))
        if turn < turns - 1:
            items.append(AssistantText("I see. Tell me more."))
    return Conversation(items=tuple(items))


def measure(renderer: PromptRenderer, clip_seconds: float, repeats: int) -> dict[str, float]:
    previous, current = spoken_conversation(TURNS - 1, clip_seconds), spoken_conversation(TURNS, clip_seconds)
    cold, warm = [], []
    for _ in range(repeats):
        renderer.audio_features = ProcessedCache(max_bytes=0)
        started = time.perf_counter()
        renderer.render(current)
        cold.append(time.perf_counter() - started)
        renderer.audio_features = ProcessedCache(AUDIO_CACHE_BYTES)
        renderer.render(previous)
        started = time.perf_counter()
        renderer.render(current)
        warm.append(time.perf_counter() - started)
    return {
        "history_audio_s": TURNS * clip_seconds,
        "cold_ms": round(statistics.median(cold) * 1000, 1),
        "warm_ms": round(statistics.median(warm) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip-seconds", type=float, nargs="+", default=[5.0, 15.0, 30.0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "render.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    renderer = PromptRenderer.from_pretrained(ensure_dev_model(Path.home() / ".cache" / "omni-rtc"))
    rows = [measure(renderer, seconds, args.repeats) for seconds in args.clip_seconds]
    print(f"{'history audio s':>15} {'cold ms':>8} {'warm ms':>8}")
    for row in rows:
        print(f"{row['history_audio_s']:>15.0f} {row['cold_ms']:>8.1f} {row['warm_ms']:>8.1f}")
    write_report(args.out, {
        "bench": "render",
        "command": "python tests/bench/render.py " + " ".join(sys.argv[1:]),
        "machine": machine(torch_threads=1),
        "turns": TURNS,
        "rows": rows,
    })


if __name__ == "__main__":
    main()
