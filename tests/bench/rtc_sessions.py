"""N concurrent WebRTC sessions talking at once: end of speech -> first answer audio, per session.

Run: .venv/bin/python tests/bench/rtc_sessions.py [--sessions 5] [--max-batch 8 1] [--wav hello.wav --wav weather.wav]
     [--generation JSON] [--session JSON] [--label NAME] [--out tests/bench/results/rtc_sessions.json]

For each ``--max-batch`` value, starts ``omni-rtc serve --ice-loopback`` with the dev model on a
free loopback port (engine: 1 thread, seed 0, turns decoded together up to that many; 1 is the
FIFO queue the batch replaced) and runs ``omni-rtc call --sessions N --json``: N headless aiortc
clients connect at once and each says every ``--wav`` in order, the server VAD ending each turn
(500 ms silence wait). Per turn, from the client (``TurnResult``): latency = last fixture sample
sent -> first audible answer frame received (the silence wait included), audio seconds received
and audible seconds (first to last audible frame; audible/audio > 1 means holes in the playout).

Targets: 5 sessions, median end of speech -> first audio < 3 s; a 64-token
answer's audible time within 10 % of its audio time (``--sessions 1 --generation
'{"force_output_tokens": 64}' --session '{"max_output_tokens": 64}'``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, write_report  # noqa: E402
from soak import FIXTURES, REPO, dev_model_server  # noqa: E402


def call(url: str, sessions: int, wavs: list[Path], session: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "app.cli", "call", url, "--ice-loopback", "--json",
                   "--sessions", str(sessions), "--out", out]
        for wav in wavs:
            command += ["--wav", str(wav)]
        if session:
            command += ["--session", session]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        raise SystemExit(f"omni-rtc call failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(completed.stdout)


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for session in result["sessions"]:
        for turn in session["turns"]:
            audio, audible = turn["audio_seconds"], turn["audible_seconds"]
            rows.append({
                "session": session["session"],
                "turn": turn["turn"],
                "input": Path(turn["input"]).name,
                "status": turn["status"],
                "eos_to_first_audio_s": turn["latency_s"],
                "audio_s": audio,
                "audible_s": audible,
                "audible_over_audio": audible / audio if audio else None,
                "output_text_tokens": turn["usage"]["output_token_details"]["text_tokens"] if turn["usage"] else None,
                "output_audio_tokens": turn["usage"]["output_token_details"]["audio_tokens"] if turn["usage"] else None,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--max-batch", type=int, nargs="+", default=[8, 1], help="one server run per value")
    parser.add_argument("--wav", type=Path, action="append", help="repeatable (default hello.wav, weather.wav)")
    parser.add_argument("--generation", default=None, help="the server's --generation JSON")
    parser.add_argument("--session", default=None, help="the call's --session JSON")
    parser.add_argument("--label", default="sessions", help="the result entry to write")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / "rtc_sessions.json")
    args = parser.parse_args()
    wavs = args.wav or [FIXTURES / "hello.wav", FIXTURES / "weather.wav"]

    runs = []
    for max_batch in args.max_batch:
        load_before = os.getloadavg()[0]
        with dev_model_server("--max-batch", str(max_batch), generation=args.generation) as url:
            result = call(url, args.sessions, wavs, args.session)
        rows = rows_of(result)
        latencies = [row["eos_to_first_audio_s"] for row in rows if row["eos_to_first_audio_s"] is not None]
        runs.append({
            "max_batch": max_batch,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg()[0],
            "median_eos_to_first_audio_s": statistics.median(latencies) if latencies else None,
            "max_eos_to_first_audio_s": max(latencies, default=None),
            # Every session says its first utterance at the same moment: those turns are concurrent.
            "median_first_turn_eos_to_first_audio_s": statistics.median(
                row["eos_to_first_audio_s"] for row in rows if row["turn"] == 1
            ),
            "turns": rows,
        })

    for run in runs:
        print(f"\nmax_batch {run['max_batch']}, {args.sessions} session(s); load average "
              f"{run['load_average_before']:.1f} -> {run['load_average_after']:.1f}")
        print(f"{'session':>7} {'turn':>4} {'input':>12} {'EOS->audio s':>12} {'audio s':>8} {'audible s':>9} "
              f"{'audible/audio':>13} {'tokens':>6} {'frames':>6}")
        for row in run["turns"]:
            ratio = row["audible_over_audio"]
            print(f"{row['session']:>7} {row['turn']:>4} {row['input']:>12} {row['eos_to_first_audio_s'] or float('nan'):>12.3f} "
                  f"{row['audio_s']:>8.2f} {row['audible_s']:>9.2f} {ratio if ratio is not None else float('nan'):>13.2f} "
                  f"{row['output_text_tokens'] or 0:>6} {row['output_audio_tokens'] or 0:>6}")
        print(f"median EOS -> first audio: {run['median_eos_to_first_audio_s']:.3f} s "
              f"(max {run['max_eos_to_first_audio_s']:.3f} s); first turns (said at once): "
              f"{run['median_first_turn_eos_to_first_audio_s']:.3f} s")

    report = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "rtc_sessions"}
    report[args.label] = {
        "command": " ".join([".venv/bin/python", "tests/bench/rtc_sessions.py", *sys.argv[1:]]),
        "model": "dev model",
        "machine": machine(),
        "sessions": args.sessions,
        "wavs": [wav.name for wav in wavs],
        "generation": args.generation,
        "session": args.session,
        "runs": runs,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
