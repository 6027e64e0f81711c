"""A vLLM-Omni engine behind the server: how soon a cancel closes the upstream stream, and what the
front adds to the first audio on its way to the client.

Run: .venv/bin/python tests/bench/remote_engine.py [--turns 20] [--transport websocket|webrtc]
     [--media-workers 1] [--out tests/bench/results/remote_engine.json]

``omni-rtc serve --engine-url`` runs as deployed (a subprocess) against the replay of a vLLM-Omni
0.30 server (tests/vllm_omni_replay.py, on a thread of this process, decoding at real time so that
every answer is still streaming when it is cancelled). Each turn: a typed user message and
``response.create``; once the answer's audio reaches the client, ``response.cancel``. Per turn:

- cancel → upstream closed: from just before the client sends ``response.cancel`` to the moment
  the replay's server sees its client go (uvicorn's ``http.disconnect``), both on this process's
  monotonic clock. It includes the client → server hop (WebSocket, or the WebRTC data channel to a
  media worker and IPC to the front) and the session's cancel. Target: under 100 ms.
- first audio through the front (WebSocket only): from the replay sending the first audio chunk
  to the client receiving the first ``response.output_audio.delta``: the HTTP hop, decoding the
  WAV, the session, the WebSocket.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import free_port, machine, wait_until_healthy, write_report

from app.client.webrtc import RealtimeClient
from app.client.websocket import RealtimeSocketClient
from tests.vllm_omni_replay import Pace, ReplayServer

REPO = Path(__file__).resolve().parents[2]
TURN_GUARD_S = 60.0  # against hangs only
TARGET_MS = 100.0


async def one_turn(client: RealtimeClient | RealtimeSocketClient, replay: ReplayServer) -> dict[str, float | None]:
    start = len(client.events)
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}})
    await client.send({"type": "response.create"})
    first_audio = "response.output_audio.delta" if isinstance(client, RealtimeSocketClient) else \
        "output_audio_buffer.started"
    await client.wait_for(first_audio, start=start, timeout_s=TURN_GUARD_S)
    received = replay.requests[-1]
    passthrough_ms = None
    if isinstance(client, RealtimeSocketClient) and received.first_audio_at is not None:
        index = next(i for i in range(start, len(client.events)) if client.events[i]["type"] == first_audio)
        passthrough_ms = (client.arrived_at[index] - received.first_audio_at) * 1000
    cancelled_at = time.monotonic()
    await client.send({"type": "response.cancel"})
    await client.wait_for("response.done", start=start, timeout_s=TURN_GUARD_S)
    if not await asyncio.to_thread(received.wait_ended, TURN_GUARD_S) or received.closed_at is None:
        raise RuntimeError("the upstream stream was not closed by the cancel")
    return {"cancel_to_close_ms": (received.closed_at - cancelled_at) * 1000, "first_audio_passthrough_ms": passthrough_ms}


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


async def measure(args: argparse.Namespace, url: str, replay: ReplayServer) -> list[dict[str, float | None]]:
    session = {"type": "realtime", "instructions": "Answer briefly."}
    client: RealtimeClient | RealtimeSocketClient
    if args.transport == "websocket":
        client = RealtimeSocketClient(url, session=session, timeout_s=TURN_GUARD_S)
    else:
        client = RealtimeClient(url, ice_loopback=True, session=session, timeout_s=TURN_GUARD_S)
    async with client:
        await one_turn(client, replay)  # warm-up: connections, imports on first use
        return [await one_turn(client, replay) for _ in range(args.turns)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--transport", choices=["websocket", "webrtc"], default="websocket")
    parser.add_argument("--media-workers", type=int, default=None, help="the server's (default: its own default)")
    parser.add_argument("--out", type=Path, default=REPO / "tests/bench/results/remote_engine.json")
    args = parser.parse_args()

    with ReplayServer(pace=Pace(real_time_factor=1.0)) as replay:
        port = free_port()
        command = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--engine-url", replay.url,
                   "--ice-loopback", "--log-level", "warning"]
        if args.media_workers is not None:
            command += ["--media-workers", str(args.media_workers)]
        server = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(url, server, deadline_s=120)
            turns = asyncio.run(measure(args, url, replay))
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)

    close = summary([float(turn["cancel_to_close_ms"] or 0.0) for turn in turns])
    passthrough_values = [float(value) for turn in turns if (value := turn["first_audio_passthrough_ms"]) is not None]
    passthrough = summary(passthrough_values) if passthrough_values else None
    print(f"{args.turns} cancelled turns over {args.transport}")
    print(f"{'':36}{'p50':>8}{'p95':>8}{'max':>8}")
    print(f"{'cancel -> upstream closed (ms)':36}" + "".join(f"{close[k]:8.1f}" for k in ("p50", "p95", "max")))
    if passthrough is not None:
        print(f"{'first audio through the front (ms)':36}" + "".join(f"{passthrough[k]:8.1f}" for k in ("p50", "p95", "max")))
    print(f"target: cancel -> closed under {TARGET_MS:g} ms: {'met' if close['max'] < TARGET_MS else 'NOT met'} (max)")
    report: dict[str, Any] = {
        "machine": machine(transport=args.transport, media_workers=args.media_workers),
        "turns": turns,
        "cancel_to_close_ms": close,
        "first_audio_passthrough_ms": passthrough,
        "target_ms": TARGET_MS,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
