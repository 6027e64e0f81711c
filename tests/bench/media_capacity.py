"""Media-plane capacity: how many WebRTC calls one server core carries without audible holes.

    .venv/bin/python tests/bench/media_capacity.py                       # server on core 0, clients on core 1
    .venv/bin/python tests/bench/media_capacity.py --server-cores 0-3 --client-cores 4-7 --sessions 8 16 24 32

The method is the one the peer servers were measured with: the server is pinned to
``--server-cores`` (``os.sched_setaffinity``), the clients to ``--client-cores``. For each N in
``--sessions`` (one server for the whole sweep), N headless aiortc peers connect at once; each
streams a looping utterance (``hello.wav`` then 1.5 s of silence) as a paced microphone, the
server's VAD ends each utterance, and an instant stand-in engine answers with 2 s of tone at once,
so the server's outbound track plays 2 s of answer per utterance. Over a ``--seconds`` window
(after a warm-up) the bench measures:

- server CPU (the whole process tree, so media workers count) per session, in % of one core;
- received audio frames per second per session (50 is every 20 ms frame);
- the p99 gap between consecutive received frames over all sessions;
- end of speech (last utterance sample sent) → first audible answer frame, as the client measures
  it, and ``response.done.latency`` as the server reports it.

N *passes* when p99 gap < 30 ms and no session received fewer than 49 frames/s. The table ends with
the largest passing N per server core. Client CPU is printed too: a client core above ~90 % makes
the client, not the server, the bottleneck of that row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from harness import free_port, wait_until_healthy, write_report  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
STARTUP_DEADLINE_S = 120.0
WARMUP_S = 4.0  # past connection set-up and the first utterance
PASS_P99_GAP_MS = 30.0
PASS_MIN_FPS = 49.0
REPLY_SECONDS = 2.0
# Silence after each utterance: the server's 500 ms silence wait, the 2 s answer and its 400 ms echo
# tail (the half-duplex server is deaf until then), and room to spare, so every utterance is heard.
PAUSE_SECONDS = 3.5
AUDIBLE_PEAK = 10 ** (-60 / 20)


def parse_cores(text: str) -> list[int]:
    """``0``, ``0,2`` or ``0-3`` → a sorted core list."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return sorted(cores)


# -- the server side: omni-rtc with an instant stand-in engine ------------------------------


class InstantReplyEngine:
    """Answers every turn at once with ``REPLY_SECONDS`` of a quiet 220 Hz tone, in 80 ms chunks."""

    name = "instant-reply"

    @property
    def capabilities(self) -> Any:
        from pipeline.contract import EngineCapabilities

        return EngineCapabilities(function_calls=True, forced_function_calls=True, end_of_turn_scores=True, images=True,
                                  preemptible_generations=True)

    async def start(self) -> None:
        return None

    async def promote(self, preemptible_id: str) -> bool:
        """A speculative answer the session used: it runs on as any other (nothing to hold here)."""
        return True

    async def close(self) -> None:
        return None

    def health(self) -> Any:
        from pipeline.contract import EngineHealth

        return EngineHealth(alive=True)

    async def run_generation(self, request: Any) -> AsyncIterator[Any]:
        from pipeline.contract import AudioChunk, GenerationDone, GenerationTimings, TextDelta, Usage

        chunk = 1920  # one 80 ms codec frame at 24 kHz
        frames = int(REPLY_SECONDS * 24_000) // chunk
        tone = (0.1 * np.sin(2 * np.pi * 220 * np.arange(chunk) / 24_000)).astype(np.float32)
        yield TextDelta("Hello.")
        for _ in range(frames):
            yield AudioChunk(tone)
            await asyncio.sleep(0)
        yield GenerationDone(
            text="Hello.",
            usage=Usage(input_text_tokens=1, input_audio_tokens=1, output_text_tokens=1, output_audio_tokens=frames),
            finish_reason="stop",
            timings=GenerationTimings(),
        )


def serve(args: argparse.Namespace) -> None:
    """Runs omni-rtc with the stand-in engine (this process is the server)."""
    import logging

    sys.path.insert(0, str(args.server_repo))  # the checkout being measured (default: this one)
    import uvicorn

    from app.config import Settings
    from app.http.server import create_app

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.sched_setaffinity(0, parse_cores(args.server_cores))
    if args.profile is not None:
        profile_on_signals(args.profile)
    extra: dict[str, Any] = {"media_workers": args.media_workers} if args.media_workers is not None else {}
    # N clients connect at once from this one host: none is turned away as "still connecting"
    # (a --server-repo older than that bound has no such setting).
    if "max_connecting_per_client" in Settings.model_fields:
        extra["max_connecting_per_client"] = 1000
    if args.noise_reduction is not None:  # the sessions say nothing: the server's default applies
        extra["noise_reduction"] = args.noise_reduction
    if args.echo_cancellation is not None:
        extra["echo_cancellation"] = args.echo_cancellation
    if args.record_dir is not None:  # every call recorded: the cost of recordings on the media plane
        extra["record_dir"] = args.record_dir
    settings = Settings(port=args.port, ice_loopback=True, max_sessions=1000, log_level="warning", **extra)
    uvicorn.run(create_app(settings, engine=InstantReplyEngine()), host="127.0.0.1", port=args.port, log_level="warning")


def profile_on_signals(out_dir: Path) -> None:
    """SIGUSR1 starts yappi (CPU clock, every thread); SIGUSR2 stops it and writes a pstats file.

    yappi rather than a sampling profiler: py-spy cannot attach inside this sandbox. Its
    per-call overhead inflates small Python functions; read the figures as shares.
    """
    import yappi

    windows = 0

    def start(signum: int, frame: Any) -> None:
        yappi.clear_stats()
        yappi.set_clock_type("cpu")
        yappi.start(builtins=True, profile_threads=True)

    def stop(signum: int, frame: Any) -> None:
        nonlocal windows
        yappi.stop()
        windows += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        yappi.get_func_stats().save(str(out_dir / f"server-window-{windows}.pstat"), type="pstat")

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


# -- the client side --------------------------------------------------------------------------


class LoopingClient:
    """One call: a looping utterance out, arrival times and audibility of every frame in."""

    def __init__(self, url: str, utterance48k: np.ndarray) -> None:
        self.url = url
        self._utterance = utterance48k
        self.arrivals: list[float] = []
        self.audible: list[bool] = []
        self.utterance_ends: list[float] = []  # when the last sample of each utterance was sent
        self.server_latencies_ms: list[float] = []
        self._pc: Any = None
        self._receiver: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        import httpx
        from aiortc import RTCPeerConnection, RTCSessionDescription

        from app.transports.webrtc.ice import loopback_candidates
        from media.inbound import release_audio_promptly
        from media.opus import OpusTrack  # the clients' own encoding costs them less (media/opus.py)

        self._pc = pc = RTCPeerConnection()
        channel = pc.createDataChannel("oai-events")
        channel.on("message", self._on_message)
        pc.addTrack(OpusTrack(_LoopingMicrophone(self._utterance, self.utterance_ends)))
        for transceiver in pc.getTransceivers():
            release_audio_promptly(transceiver.receiver)
        pc.on("track", self._on_track)
        with loopback_candidates(True):
            await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(
                f"{self.url}/v1/realtime/calls", content=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}
            )
        if response.status_code != 201:
            raise RuntimeError(f"call refused: {response.status_code} {response.text}")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        if event.get("type") == "response.done":
            latency = event.get("latency") or {}
            if latency.get("end_of_speech_to_first_audio_ms") is not None:
                self.server_latencies_ms.append(float(latency["end_of_speech_to_first_audio_ms"]))

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio" and self._receiver is None:
            self._receiver = asyncio.create_task(self._receive(track))

    async def _receive(self, track: Any) -> None:
        from aiortc.mediastreams import MediaStreamError

        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.arrivals.append(time.monotonic())
            self.audible.append(int(np.abs(frame.to_ndarray()).max()) >= AUDIBLE_PEAK * 32768)

    async def close(self) -> None:
        if self._pc is not None:
            await self._pc.close()
        if self._receiver is not None:
            self._receiver.cancel()
            try:
                await self._receiver
            except asyncio.CancelledError:
                pass

    def window(self, start: float, end: float) -> dict[str, Any]:
        times = np.array(self.arrivals)
        inside = (times >= start) & (times < end)
        gaps = np.diff(times[inside]) * 1e3
        latencies = []
        for spoken_at in self.utterance_ends:
            if not start <= spoken_at < end:
                continue
            index = int(np.searchsorted(times, spoken_at))
            audible = np.flatnonzero(np.array(self.audible[index:], dtype=bool))
            if audible.size:
                latencies.append((times[index + audible[0]] - spoken_at) * 1e3)
        return {"fps": float(inside.sum()) / (end - start), "gaps_ms": gaps, "latencies_ms": latencies}


class _LoopingMicrophone:
    """A paced 48 kHz microphone that says the utterance, pauses, and says it again."""

    def __new__(cls, utterance48k: np.ndarray, ends: list[float]) -> Any:
        from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

        from media.pacing import FRAME_SAMPLES, FramePacer

        pause = np.zeros(int(PAUSE_SECONDS * 48_000), dtype=np.int16)
        speech = (np.clip(utterance48k, -1, 1) * 32767).astype(np.int16)
        loop = np.concatenate([speech, pause])
        loop = np.concatenate([loop, np.zeros(-loop.size % FRAME_SAMPLES, dtype=np.int16)])
        frames = loop.reshape(-1, FRAME_SAMPLES)
        last_speech_frame = (speech.size - 1) // FRAME_SAMPLES

        class Microphone(MediaStreamTrack):
            kind = "audio"

            def __init__(self) -> None:
                super().__init__()
                self._pacer = FramePacer()
                self._index = 0

            async def recv(self) -> Any:
                if self.readyState != "live":
                    raise MediaStreamError
                await self._pacer.wait_until_due()
                position = self._index % len(frames)
                self._index += 1
                if position == last_speech_frame:
                    ends.append(time.monotonic())
                return self._pacer.frame(frames[position])

        return Microphone()


async def measure(
    url: str, sessions: int, seconds: float, utterance48k: np.ndarray, server: psutil.Process, profile: Path | None
) -> dict[str, Any]:
    clients = [LoopingClient(url, utterance48k) for _ in range(sessions)]
    me = psutil.Process()
    try:
        await asyncio.gather(*(client.connect() for client in clients))
        await asyncio.sleep(WARMUP_S)
        start = time.monotonic()
        server_cpu = tree_cpu_seconds(server)
        client_cpu = tree_cpu_seconds(me, leave_out=server)
        if profile is not None:
            server.send_signal(signal.SIGUSR1)  # the server starts yappi (see serve())
        await asyncio.sleep(seconds)
        end = time.monotonic()
        if profile is not None:
            server.send_signal(signal.SIGUSR2)  # and writes what it measured

        server_cpu = tree_cpu_seconds(server) - server_cpu
        client_cpu = tree_cpu_seconds(me, leave_out=server) - client_cpu
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)
    windows = [client.window(start, end) for client in clients]
    gaps = np.concatenate([w["gaps_ms"] for w in windows])
    fps = [w["fps"] for w in windows]
    latencies = sorted(x for w in windows for x in w["latencies_ms"])
    server_reported = sorted(x for client in clients for x in client.server_latencies_ms)
    wall = end - start
    row = {
        "sessions": sessions,
        "server_core_pct": round(100 * server_cpu / wall, 1),
        "per_session_core_pct": round(100 * server_cpu / wall / sessions, 2),
        "client_core_pct": round(100 * client_cpu / wall, 1),
        "min_fps": round(min(fps), 1),
        "mean_fps": round(float(np.mean(fps)), 1),
        "p99_gap_ms": round(float(np.percentile(gaps, 99)), 1) if gaps.size else None,
        "max_gap_ms": round(float(gaps.max()), 1) if gaps.size else None,
        "client_latency_median_ms": round(latencies[len(latencies) // 2]) if latencies else None,
        "client_latency_max_ms": round(latencies[-1]) if latencies else None,
        "server_latency_median_ms": round(server_reported[len(server_reported) // 2]) if server_reported else None,
    }
    row["passes"] = bool(row["p99_gap_ms"] is not None and row["p99_gap_ms"] < PASS_P99_GAP_MS and row["min_fps"] >= PASS_MIN_FPS)
    return row


def tree_cpu_seconds(process: psutil.Process, *, leave_out: psutil.Process | None = None) -> float:
    """CPU seconds of ``process`` and its descendants, without ``leave_out``'s tree."""
    members = [process, *process.children(recursive=True)]
    if leave_out is not None:
        left_out = {leave_out.pid, *(child.pid for child in leave_out.children(recursive=True))}
        members = [member for member in members if member.pid not in left_out]
    total = 0.0
    for member in members:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-cores", default="0", help="cores the server may use: 0, 0,1 or 0-3 (default 0)")
    parser.add_argument("--client-cores", default="1", help="cores the clients may use (default 1)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[4, 6, 8, 10, 12, 14, 16])
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring window per N (default 20)")
    parser.add_argument("--media-workers", type=int, help="passed to the server (default: its own)")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="profile the server (yappi) in each window into DIR")
    parser.add_argument(
        "--server-repo", type=Path, default=REPO, metavar="DIR",
        help="run the server from this checkout (e.g. a git worktree of an older commit) to compare",
    )
    parser.add_argument("--noise-reduction", choices=["off", "near_field", "far_field"],
                        help="the server's default noise reduction for the sessions (default: the server's)")
    parser.add_argument("--echo-cancellation", action=argparse.BooleanOptionalAction, default=None,
                        help="the server's echo cancellation for WebRTC calls (default: the server's)")
    parser.add_argument("--record-dir", type=Path, metavar="DIR",
                        help="the server records every call here (default: no recordings)")
    parser.add_argument("--label", default="", help="a note kept in the JSON (e.g. before/after)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "bench" / "results" / "media_capacity.json")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # internal: be the server
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return

    import soxr

    from app.cli import read_utterance

    server_cores, client_cores = parse_cores(args.server_cores), parse_cores(args.client_cores)
    os.sched_setaffinity(0, client_cores)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, __file__, "--serve", "--port", str(port), "--server-cores", args.server_cores,
        "--server-repo", str(args.server_repo),
    ]
    if args.media_workers is not None:
        command += ["--media-workers", str(args.media_workers)]
    if args.noise_reduction is not None:
        command += ["--noise-reduction", args.noise_reduction]
    if args.echo_cancellation is not None:
        command += ["--echo-cancellation" if args.echo_cancellation else "--no-echo-cancellation"]
    if args.record_dir is not None:
        command += ["--record-dir", str(args.record_dir)]
    if args.profile is not None:
        command += ["--profile", str(args.profile)]
    utterance = soxr.resample(read_utterance(FIXTURES / "hello.wav"), 16_000, 48_000).astype(np.float32)
    environment = {**os.environ, "PYTHONPATH": str(args.server_repo)}
    server = subprocess.Popen(command, cwd=args.server_repo, env=environment)
    rows = []
    try:
        wait_until_healthy(url, server, STARTUP_DEADLINE_S)
        process = psutil.Process(server.pid)
        server_affinity = sorted(process.cpu_affinity())
        for sessions in args.sessions:
            rows.append(asyncio.run(measure(url, sessions, args.seconds, utterance, process, args.profile)))
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(3)  # the calls' release
    finally:
        server.terminate()
        server.wait(60)

    columns = [
        ("sessions", "N"), ("server_core_pct", "server %"), ("per_session_core_pct", "per session %"),
        ("client_core_pct", "client %"), ("min_fps", "min fps"), ("p99_gap_ms", "p99 gap ms"),
        ("max_gap_ms", "max gap ms"), ("client_latency_median_ms", "client lat ms"),
        ("client_latency_max_ms", "client lat max"), ("server_latency_median_ms", "server lat ms"), ("passes", "pass"),
    ]
    print(" | ".join(title for _, title in columns))
    for row in rows:
        print(" | ".join(str(row[key]) for key, _ in columns))
    passing = [row["sessions"] for row in rows if row["passes"]]
    best = max(passing, default=0)
    per_core = best / len(server_cores)
    print(f"largest passing N: {best} on {len(server_cores)} server core(s) = {per_core:g} per core")
    result = {
        "label": args.label,
        "server_repo": str(args.server_repo),
        "noise_reduction": args.noise_reduction,
        "echo_cancellation": args.echo_cancellation,
        "record_dir": None if args.record_dir is None else str(args.record_dir),
        "server_cores": server_cores,
        "client_cores": client_cores,
        "server_affinity": server_affinity,  # as the server process reported it: the pinning took
        "seconds": args.seconds,
        "load_average": os.getloadavg(),
        "rows": rows,
        "largest_passing_sessions": best,
        "sessions_per_core": per_core,
    }
    write_report(args.out, result)


if __name__ == "__main__":
    main()
