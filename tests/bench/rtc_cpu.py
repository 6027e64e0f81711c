"""Server CPU per WebRTC session: idle, N calls streaming, and N calls talking.

    .venv/bin/python tests/bench/rtc_cpu.py            # dev model, 5 sessions

Starts ``omni-rtc serve --ice-loopback`` (engine on one thread) on 127.0.0.1 and reads the
server process's CPU time (psutil; the engine process is counted apart) over three windows:

- idle: no calls;
- streaming: N headless clients connected, each sending a paced silent microphone track and
  receiving the server's track, no turns (the WebRTC cost alone: SRTP, Opus both ways,
  resampling, VAD);
- talking: ``omni-rtc call --sessions N`` saying two fixture utterances per call and waiting
  for each answer to play out (adds the session, the outbound audio and the data channel).

Per-session figures are (server CPU - idle CPU) / N, in % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from harness import wait_until_healthy, write_report  # noqa: E402

from app.client.webrtc import RealtimeClient  # noqa: E402  (after the path set-up above)

FIXTURES = REPO / "tests" / "fixtures"
STARTUP_DEADLINE_S = 300.0


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def engine_cpu_seconds(process: psutil.Process) -> float:
    return sum(cpu_seconds(child) for child in process.children(recursive=True))


class Window:
    """CPU of the server and of its engine process between start and stop, per wall second."""

    def __init__(self, server: psutil.Process) -> None:
        self._server = server
        self._started = (time.monotonic(), cpu_seconds(server), engine_cpu_seconds(server))

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._started[0]
        return {
            "wall_s": round(wall, 1),
            "server_core_pct": round(100 * (cpu_seconds(self._server) - self._started[1]) / wall, 1),
            "engine_core_pct": round(100 * (engine_cpu_seconds(self._server) - self._started[2]) / wall, 1),
        }


async def streaming(url: str, sessions: int, seconds: float, server: psutil.Process) -> dict[str, float]:
    clients = [RealtimeClient(url, ice_loopback=True) for _ in range(sessions)]
    try:
        for client in clients:
            await client.connect()
        await asyncio.sleep(3)  # past the connection set-up
        window = Window(server)
        await asyncio.sleep(seconds)
        return window.stop()
    finally:
        for client in clients:
            await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the idle and streaming windows")
    parser.add_argument("--model", help="checkpoint directory (default: the dev model)")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / "rtc_cpu.json")
    args = parser.parse_args()

    url = f"http://127.0.0.1:{args.port}"
    command = [
        sys.executable, "-m", "app.cli", "serve", "--port", str(args.port), "--device", "cpu",
        "--ice-loopback", "--engine-threads", "1", "--seed", "0", "--log-level", "warning",
        # Every call in the server process, as the split above assumes (its children are the
        # engine); tests/bench/media_capacity.py measures the media workers' whole tree.
        "--media-workers", "1",
    ]
    if args.model:
        command += ["--model", args.model]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        wait_until_healthy(url, server, STARTUP_DEADLINE_S, poll_s=0.5)
        process = psutil.Process(server.pid)
        time.sleep(3)
        window = Window(process)
        time.sleep(args.seconds)
        idle = window.stop()
        stream = asyncio.run(streaming(url, args.sessions, args.seconds, process))
        window = Window(process)
        call = subprocess.run(
            [
                sys.executable, "-m", "app.cli", "call", url, "--ice-loopback", "--json",
                "--sessions", str(args.sessions), "--out", str(REPO / "test-output" / "rtc_cpu"),
                "--wav", str(FIXTURES / "hello.wav"), "--wav", str(FIXTURES / "weather.wav"),
            ],
            cwd=REPO, capture_output=True, text=True, check=False,
        )
        talk = window.stop()
    finally:
        server.terminate()
        server.wait(60)
    if call.returncode != 0:
        raise SystemExit(f"omni-rtc call failed ({call.returncode}): {call.stderr[-2000:]}")
    turns = [turn for session in json.loads(call.stdout)["sessions"] for turn in session["turns"]]

    rows = {"idle": idle, "streaming": stream, "talking": talk}
    for name in ("streaming", "talking"):
        rows[name]["per_session_core_pct"] = round((rows[name]["server_core_pct"] - idle["server_core_pct"]) / args.sessions, 1)
    print(f"{'window':<10} {'wall s':>7} {'server %':>9} {'per session %':>14} {'engine %':>9}")
    for name, row in rows.items():
        print(
            f"{name:<10} {row['wall_s']:>7} {row['server_core_pct']:>9} "
            f"{row.get('per_session_core_pct', '-'):>14} {row['engine_core_pct']:>9}"
        )
    latencies = sorted(turn["latency_s"] for turn in turns if turn["latency_s"] is not None)
    print(f"talking: {len(turns)} turns, end of speech -> first audio median {latencies[len(latencies) // 2]:.2f} s")
    result = {
        "sessions": args.sessions,
        "load_average": os.getloadavg(),
        "windows": rows,
        "talking_turns": [{k: turn[k] for k in ("status", "audio_seconds", "audible_seconds", "latency_s")} for turn in turns],
    }
    write_report(args.out, result)


if __name__ == "__main__":
    main()
