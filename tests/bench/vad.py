"""Cost of server VAD per session: silero window inference and the turn-detection glue.

Run: .venv/bin/python tests/bench/vad.py [--seconds 60] [--out tests/bench/results/vad.json]

Feeds the speech fixtures (with silence between them, as in a conversation) through
one VadStream window by window, and through a VoiceActivityDetector in the 20 ms
chunks that inbound WebRTC audio arrives in. Prints a table and writes a JSON result.
onnxruntime runs single-threaded, as in the server.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime
import soundfile as sf
from harness import machine, write_report  # this folder: a script's is first on sys.path

from media.detector_params import TurnDetectionParams
from media.rates import SPEECH_RATE
from media.vad import WINDOW_SAMPLES, SileroVad
from media.voice_activity_detector import VoiceActivityDetector

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHUNK_SAMPLES = 320  # 20 ms, one inbound WebRTC frame after resampling to 16 kHz


def conversation_audio(seconds: float) -> np.ndarray:
    """Fixtures separated by 1 s of silence, repeated to ``seconds``."""
    gap = np.zeros(SPEECH_RATE, dtype=np.float32)
    parts = []
    for name in ("hello", "weather", "long_story"):
        pcm, _ = sf.read(FIXTURES / f"{name}.wav", dtype="float32")
        parts += [pcm, gap]
    one_round = np.concatenate(parts)
    repeats = int(np.ceil(seconds * SPEECH_RATE / one_round.size))
    return np.tile(one_round, repeats)[: int(seconds * SPEECH_RATE)]


def percentiles_us(durations: list[float]) -> dict[str, float]:
    values = np.array(durations) * 1e6
    return {
        "mean_us": round(float(values.mean()), 1),
        "p50_us": round(float(np.percentile(values, 50)), 1),
        "p99_us": round(float(np.percentile(values, 99)), 1),
        "max_us": round(float(values.max()), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="audio to process (default 60 s)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vad.json")
    args = parser.parse_args()

    vad = SileroVad.load()
    audio = conversation_audio(args.seconds)

    stream = vad.new_stream()
    windows = audio[: audio.size - audio.size % WINDOW_SAMPLES].reshape(-1, WINDOW_SAMPLES)
    for window in windows[:50]:  # warm-up: onnxruntime allocates on the first runs
        stream.probability(window)
    stream.reset()
    window_times = []
    for window in windows:
        started = time.perf_counter()
        stream.probability(window)
        window_times.append(time.perf_counter() - started)

    detector = VoiceActivityDetector(vad, TurnDetectionParams())
    chunk_times, commits = [], 0
    for start in range(0, audio.size, CHUNK_SAMPLES):
        started = time.perf_counter()
        events = detector.push(audio[start : start + CHUNK_SAMPLES])
        chunk_times.append(time.perf_counter() - started)
        commits += sum(type(event).__name__ == "UtteranceCommitted" for event in events)

    window_stats = percentiles_us(window_times)
    chunk_stats = percentiles_us(chunk_times)
    # Share of one core that one session's VAD uses: cost per second of audio.
    core_share = sum(chunk_times) / args.seconds
    result = {
        "benchmark": "vad",
        "audio_seconds": args.seconds,
        "window_samples": WINDOW_SAMPLES,
        "windows": len(window_times),
        "vad_window": window_stats,
        "detector_chunk_20ms": chunk_stats,
        "utterances_committed": commits,
        "core_share_per_session": round(core_share, 5),
        "sessions_per_core": int(1 / core_share),
        "onnxruntime": onnxruntime.__version__,
        "machine": machine(),
    }

    print(f"{'measure':<28}{'mean µs':>10}{'p50 µs':>10}{'p99 µs':>10}{'max µs':>10}")
    for label, stats in (("VAD window (512 samples)", window_stats), ("detector push (20 ms)", chunk_stats)):
        print(f"{label:<28}{stats['mean_us']:>10}{stats['p50_us']:>10}{stats['p99_us']:>10}{stats['max_us']:>10}")
    print(
        f"{args.seconds:.0f} s of conversation: {commits} utterances committed; "
        f"VAD uses {core_share:.2%} of a core per session (~{result['sessions_per_core']} sessions/core)"
    )

    write_report(args.out, result)


if __name__ == "__main__":
    main()
