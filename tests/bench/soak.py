"""Soak: many turns in one call, then many calls, and what the server holds before and after.

Run: .venv/bin/python tests/bench/soak.py [--url http://127.0.0.1:8000] [--turns 200]
     [--cycles 100] [--speech-every 10] [--max-output-tokens 8] [--out tests/bench/results/soak.json]

Without ``--url`` it starts ``omni-rtc serve`` on a free loopback port with the dev model (CPU,
one thread, answers capped at 25 codec frames = 2 s), as the e2e tests do, and stops it afterwards. With ``--url`` the server must run on
this machine (``/debug/resources`` answers loopback clients only).

Phases, each read from ``GET /debug/resources`` (server RSS, threads, fds, asyncio tasks, and
its child processes' RSS: the engine and the media workers; each media worker's own figures too):

1. warm-up: one call with a text turn and a spoken turn, so that first-use allocations
   (model caches, thread pools, codecs) are in the baseline; the baseline is read after it;
2. turns: one call, ``--turns`` turns; text turns (``conversation.item.create`` +
   ``response.create``, answered with audio and waited out until it has played) with every
   ``--speech-every``-th turn spoken (``tests/fixtures/hello.wav`` through the server VAD);
3. cycles: ``--cycles`` calls, each connected until ``session.created`` and hung up;
4. end: once ``/healthz`` shows no open session, after a short settle.

A leak shows as counts that do not return to the baseline, or RSS that keeps growing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import soundfile as sf

from app.client.webrtc import RealtimeClient
from app.realtime.turn_taking import ECHO_TAIL_MS
from tests.listening_ports import free_port

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "soak.json"
TURN_TIMEOUT_S = 180.0  # a guard against hangs on 2 shared cores, not a speed limit
DEV_MODEL_AUDIO_FRAMES = 25
SETTLE_S = 2.0  # after the last call: aiortc's closing tasks and the engine's cancellations finish


@dataclass
class Snapshot:
    phase: str
    rss_bytes: int
    children_rss_bytes: int
    asyncio_tasks: int
    threads: int
    thread_kinds: dict[str, int]
    os_threads: int
    fds: int
    sessions: int
    # Each media worker's own figures (``/debug/resources`` ``workers``; none with one process):
    # the calls' peers, sessions and tasks live there.
    workers: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SoakResult:
    turns: int = 0
    turn_statuses: dict[str, int] = field(default_factory=dict)
    cycles: int = 0
    snapshots: list[Snapshot] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def snapshot(self, phase: str) -> Snapshot:
        return next(s for s in self.snapshots if s.phase == phase)


async def read_snapshot(http: httpx.AsyncClient, phase: str) -> Snapshot:
    figures = (await http.get("/debug/resources")).raise_for_status().json()
    sessions = (await http.get("/healthz")).json()["sessions"]
    return Snapshot(
        phase=phase,
        rss_bytes=figures["rss_bytes"],
        children_rss_bytes=figures["children_rss_bytes"],
        asyncio_tasks=figures["asyncio_tasks"],
        threads=figures["threads"],
        thread_kinds=figures["thread_kinds"],
        os_threads=figures["os_threads"],
        fds=figures["fds"],
        sessions=sessions,
        workers=figures.get("workers", []),
    )


async def wait_for_no_sessions(http: httpx.AsyncClient) -> None:
    async with asyncio.timeout(TURN_TIMEOUT_S):
        while (await http.get("/healthz")).json()["sessions"] != 0:
            await asyncio.sleep(0.2)
    await asyncio.sleep(SETTLE_S)


async def text_turn(client: RealtimeClient, text: str) -> str:
    """One text turn answered with audio; returns once its audio has played out."""
    start = len(client.events)
    await client.send(
        {"type": "conversation.item.create",
         "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}
    )
    await client.send({"type": "response.create"})
    done = await client.wait_for("response.done", start=start, timeout_s=TURN_TIMEOUT_S)
    response = done["response"]
    # Wait for the playout even when response.done came before output_audio_buffer.started
    # (a fast answer): half-duplex does not hear the user while the assistant still speaks.
    if response["output_modalities"] == ["audio"] and response["usage"] and response["usage"]["output_token_details"]["audio_tokens"]:
        await client.wait_for(
            lambda e: e["type"] in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
            and e.get("response_id") == response["id"],
            start=start, timeout_s=TURN_TIMEOUT_S,
        )
        # Then the echo tail, during which half-duplex still does not listen, as a user pauses.
        await asyncio.sleep(ECHO_TAIL_MS / 1000 + 0.1)
    return str(response["status"])


async def run_soak(
    url: str,
    *,
    turns: int,
    cycles: int,
    speech_every: int = 10,
    max_output_tokens: int = 8,
    progress: Callable[[str], None] = lambda line: None,
) -> SoakResult:
    speech, _ = sf.read(FIXTURES / "hello.wav", dtype="float32")
    session = {"max_output_tokens": max_output_tokens}
    result = SoakResult()

    def client() -> RealtimeClient:
        return RealtimeClient(url, ice_loopback=True, session=session, timeout_s=TURN_TIMEOUT_S)

    async with httpx.AsyncClient(base_url=url, timeout=30.0) as http:
        started = time.monotonic()
        async with client() as warm:
            await text_turn(warm, "Hello, warming up.")
            await warm.speak(speech)
        await wait_for_no_sessions(http)
        result.snapshots.append(await read_snapshot(http, "start"))
        result.seconds["warm_up"] = time.monotonic() - started

        started = time.monotonic()
        async with client() as call:
            for number in range(1, turns + 1):
                if speech_every and number % speech_every == 0:
                    status = (await call.speak(speech)).status
                else:
                    status = await text_turn(call, f"Turn {number}: tell me something.")
                result.turn_statuses[status] = result.turn_statuses.get(status, 0) + 1
                result.turns += 1
                if number % 10 == 0 or number == turns:
                    progress(f"turn {number}/{turns}: {result.turn_statuses}")
            result.snapshots.append(await read_snapshot(http, "after_turns_in_call"))
        await wait_for_no_sessions(http)
        result.snapshots.append(await read_snapshot(http, "after_turns"))
        result.seconds["turns"] = time.monotonic() - started

        started = time.monotonic()
        for number in range(1, cycles + 1):
            async with client() as call:
                await call.wait_for("session.created")
            result.cycles += 1
            if number % 10 == 0 or number == cycles:
                progress(f"cycle {number}/{cycles}")
        await wait_for_no_sessions(http)
        result.snapshots.append(await read_snapshot(http, "end"))
        result.seconds["cycles"] = time.monotonic() - started
    return result


# The random dev model's Talker never says EOS: cap each answer at 2 s of speech.
CAPPED_ANSWERS = json.dumps({"max_audio_frames": DEV_MODEL_AUDIO_FRAMES})


@contextlib.contextmanager
def dev_model_server(*serve_args: str, generation: str | None = CAPPED_ANSWERS) -> Iterator[str]:
    """``omni-rtc serve`` with the dev model on a free loopback port (plus ``serve_args``, and
    ``--generation`` unless None); yields its URL once healthy, interrupts it afterwards."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--device", "cpu", "--seed", "0",
               "--ice-loopback", "--log-level", "warning", *serve_args]
    if generation is not None:
        command += ["--generation", generation]
    process = subprocess.Popen(command, env=env)
    try:
        give_up = time.monotonic() + 600.0  # may build the dev model first
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the server exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=5.0).json().get("status") == "ok":
                    break
            if time.monotonic() > give_up:
                raise SystemExit("the server did not become healthy")
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def table(result: SoakResult) -> str:
    rows = [f"{'phase':<22}{'RSS MB':>9}{'child MB':>11}{'tasks':>7}{'threads':>9}{'os thr':>8}{'fds':>6}{'sessions':>10}"]
    for s in result.snapshots:
        rows.append(
            f"{s.phase:<22}{s.rss_bytes / 2**20:>9.1f}{s.children_rss_bytes / 2**20:>11.1f}{s.asyncio_tasks:>7}"
            f"{s.threads:>9}{s.os_threads:>8}{s.fds:>6}{s.sessions:>10}"
        )
        for worker in s.workers:
            rows.append(
                f"{'  worker ' + worker['worker']:<22}{worker.get('rss_bytes', 0) / 2**20:>9.1f}{'':>11}"
                f"{worker.get('asyncio_tasks', '-'):>7}{worker.get('threads', '-'):>9}{worker.get('os_threads', '-'):>8}"
                f"{worker.get('fds', '-'):>6}"
            )
    rows.append(f"turns: {result.turns} {result.turn_statuses}; cycles: {result.cycles}; "
                f"seconds: { {k: round(v, 1) for k, v in result.seconds.items()} }")
    return "\n".join(rows)


async def _main(args: argparse.Namespace) -> SoakResult:
    return await run_soak(
        args.url, turns=args.turns, cycles=args.cycles, speech_every=args.speech_every,
        max_output_tokens=args.max_output_tokens, progress=lambda line: print(line, flush=True),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running server on this machine (default: start one with the dev model)")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--speech-every", type=int, default=10, help="every Nth turn is spoken (0: none)")
    parser.add_argument("--max-output-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.url is None:
            args.url = stack.enter_context(dev_model_server())
        result = asyncio.run(_main(args))
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "platform": platform.platform(),
         "result": asdict(result)}, indent=2,
    ) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
