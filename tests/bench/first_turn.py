"""The first turn after a server starts against the ones after it, over the WebSocket and WebRTC.

Run: .venv/bin/python tests/bench/first_turn.py [--rounds 3] [--turns 3] [--transport websocket webrtc]
     [--out tests/bench/results/first_turn.json]

Each round starts a fresh ``omni-rtc serve`` with the dev model per transport (as ``soak.py``
does: CPU, engine on one thread, seed 0, answers capped at 25 codec frames), waits until
``/healthz`` says ok, and at once opens one session and says ``tests/fixtures/hello.wav``
``--turns`` times, each turn ended by the server VAD (500 ms) and waited out until its answer
has played. Per turn:

- ``commit_ms``: the server's commit -> first audio (``response.done``'s latency block:
  ``end_of_speech_to_first_audio_ms`` - ``silence_wait_ms``), what the issue measured as
  ``response.create`` -> first audio delta: everything the server does once it has the turn;
- ``engine_ms``: of that, the engine's own time to first audio (``engine_first_audio_ms``);
- ``client_ms``: end of speech -> first audible answer frame at the client (``TurnResult.latency_s``);
- ``cpu_ms``: the CPU each of the server's processes (front, engine, media workers) used over the
  turn, read with psutil before and after it: on a loaded machine wall times are mostly waiting
  for a core, and this says which process a first turn's extra time was spent in.

Also per server: ``start_s``, process start -> ``/healthz`` ok, and the warm-up the server
reports in ``/healthz`` (the engine processes' ``warm_up``: its turns and milliseconds). The
summary is the median over rounds of turn 1 and of turn 2 and their ratio, per transport.

``--part stages`` finds out what a first turn pays, in the engine's own code path and in CPU
time (which a loaded machine inflates far less than wall time): each of ``--rounds`` fresh
interpreters loads the dev model as the engine process does (``pipeline.local.checkpoint._load``), runs the
engine's warm-up (``pipeline.local.warmup``) or not, then two spoken turns (hello.wav, the second's
clip scaled by 0.999 so that it is not found in the features cache) through a
``DecodeBatch`` stage by stage, timing each stage's CPU ms up to the first audio chunk: render
(Whisper features), Thinker prefill, Talker prefill, first Thinker step, first Talker step
(with the code predictor), first Code2Wav chunk. ``--part servers stages`` (the default) runs both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, write_report  # noqa: E402
from soak import DEV_MODEL_AUDIO_FRAMES, FIXTURES, REPO, TURN_TIMEOUT_S, dev_model_server  # noqa: E402

from app.client.webrtc import RealtimeClient  # noqa: E402  (after the path set-up above)
from app.client.websocket import RealtimeSocketClient  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "first_turn.json"
COLUMNS = ("commit_ms", "engine_ms", "client_ms")


def server_processes(url: str) -> dict[str, list[psutil.Process]]:
    """The server's processes by role, as its ``/healthz`` names them (the front: the one listening on the port)."""
    health = httpx.get(f"{url}/healthz", timeout=10).json()
    port = int(url.rsplit(":", 1)[1])
    front = [process for process in psutil.process_iter(["cmdline"])
             if "serve" in (process.info["cmdline"] or []) and str(port) in (process.info["cmdline"] or [])]
    engines = [psutil.Process(engine["pid"]) for engine in health["engine"].get("engines", []) if engine["pid"]]
    workers = [psutil.Process(worker["pid"]) for worker in health["workers"]
               if worker["pid"] and worker["pid"] not in {process.pid for process in front}]
    return {"front": front, "engine": engines, "workers": workers}


def cpu_seconds(processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """CPU seconds (user + system) each role's processes have used so far."""
    return {role: sum(sum(process.cpu_times()[:2]) for process in members) for role, members in processes.items()}


async def run_turns(url: str, transport: str, turns: int) -> list[dict[str, Any]]:
    speech = sf.read(FIXTURES / "hello.wav", dtype="float32")[0]
    processes = server_processes(url)
    session = {"max_output_tokens": 8}
    client: RealtimeClient | RealtimeSocketClient
    if transport == "websocket":
        client = RealtimeSocketClient(url, session=session, timeout_s=TURN_TIMEOUT_S)
    else:
        client = RealtimeClient(url, ice_loopback=True, session=session, timeout_s=TURN_TIMEOUT_S)
    rows = []
    async with client:
        for number in range(1, turns + 1):
            cpu_before = cpu_seconds(processes)
            result = await client.speak(speech)
            cpu_after = cpu_seconds(processes)
            latency = next(e for e in result.events if e["type"] == "response.done").get("latency") or {}
            to_first = latency.get("end_of_speech_to_first_audio_ms")
            rows.append({
                "turn": number,
                "status": result.status,
                "commit_ms": None if to_first is None else round(to_first - latency["silence_wait_ms"], 1),
                "engine_ms": latency.get("engine_first_audio_ms"),
                "client_ms": None if result.latency_s is None else round(result.latency_s * 1000, 1),
                # What each process computed over the turn (utterance, answer, playout): under load
                # the figure that tells where a first turn's extra time went.
                "cpu_ms": {role: round((cpu_after[role] - cpu_before[role]) * 1000, 1) for role in cpu_after},
            })
    return rows


def one_server(transport: str, turns: int) -> dict[str, Any]:
    started = time.monotonic()
    with dev_model_server() as url:
        start_s = round(time.monotonic() - started, 1)
        health = httpx.get(f"{url}/healthz", timeout=10).json()
        rows = asyncio.run(run_turns(url, transport, turns))
    warm_up = [engine.get("warm_up") for engine in health.get("engine", {}).get("engines", [])]
    return {"transport": transport, "start_s": start_s, "warm_up": warm_up, "turns": rows}


STAGES = ("render", "thinker_prefill", "talker_prefill", "thinker_step", "talker_step", "code2wav", "to_first_audio")


def stage_profile(model_dir: str, warm: bool) -> list[dict[str, float]]:
    """In a fresh interpreter: the engine's load, its warm-up when ``warm``, then two spoken turns'
    stages up to their first audio chunk, CPU ms each."""
    import dataclasses

    import torch

    from pipeline.contract import GenerationRequest
    from pipeline.conversation import Conversation, UserAudio
    from pipeline.local.checkpoint import load_checkpoint
    from pipeline.local.decode_batch import DecodeBatch
    from pipeline.local.engine_messages import EngineProcessSpec
    from pipeline.local.engine_process import warm_up

    spec = EngineProcessSpec(model=model_dir, device="cpu", seed=0, threads=1,
                             generation={"max_audio_frames": DEV_MODEL_AUDIO_FRAMES})
    loaded = load_checkpoint(spec)
    if warm:
        warm_up(loaded)
    speech = sf.read(FIXTURES / "hello.wav", dtype="float32")[0]
    turns = []
    for number in range(2):
        # The second turn's clip differs by a hair: the renderer keeps a clip's features by
        # content (pipeline/local/processed_cache.py), and the same clip again would be found there.
        clip = speech * (1.0 - 0.001 * number)
        request = GenerationRequest(conversation=Conversation(items=(UserAudio(clip),)), max_output_tokens=8)
        params = dataclasses.replace(loaded.base_params, voice=request.voice, temperature=request.temperature,
                                     max_output_tokens=request.max_output_tokens)
        times: dict[str, float] = {}

        def timed(stage: str, work: Any) -> Any:
            started = time.thread_time()
            result = work()
            if stage not in times:  # a stage's first call in this turn
                times[stage] = round((time.thread_time() - started) * 1000, 2)
            return result

        batch = DecodeBatch[int](loaded.model, loaded.tokenizer)
        began = time.thread_time()
        with torch.inference_mode():
            inputs = timed("render", lambda: loaded.renderer.render_request(request))
            timed("thinker_prefill", lambda: batch.prefill_thinkers([(number, inputs, params)]))
            timed("talker_prefill", lambda: batch.prefill_talkers([number]))
            while not batch.chunks_due():
                if batch.thinker_rows:
                    timed("thinker_step", batch.step_thinker)
                timed("talker_step", batch.step_talker)
            timed("code2wav", batch.decode_chunks)
        times["to_first_audio"] = round((time.thread_time() - began) * 1000, 2)
        turns.append(times)
    return turns


def run_stages(rounds: int) -> dict[str, Any]:
    """``rounds`` cold interpreters without the warm-up and as many with it, interleaved."""
    import concurrent.futures
    import multiprocessing

    from pipeline.local.devmodel import ensure_dev_model

    model_dir = str(ensure_dev_model(Path.home() / ".cache" / "omni-rtc"))
    results: dict[str, list[list[dict[str, float]]]] = {"cold": [], "warmed": []}
    context = multiprocessing.get_context("spawn")
    print(f"{'round':>5} {'engine':<7} {'turn':>4} " + "".join(f"{stage:>16}" for stage in STAGES) + "   (CPU ms)", flush=True)
    for round_number in range(1, rounds + 1):
        for name in results:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as fresh:
                turns = fresh.submit(stage_profile, model_dir, name == "warmed").result()
            results[name].append(turns)
            for number, times in enumerate(turns, start=1):
                print(f"{round_number:>5} {name:<7} {number:>4} " + "".join(f"{times.get(s, '-'):>16}" for s in STAGES),
                      flush=True)
    medians = {
        name: {f"turn {number}": {stage: round(statistics.median(turns[number - 1][stage] for turns in runs), 2)
                                  for stage in STAGES} for number in (1, 2)}
        for name, runs in results.items()
    }
    for name, per_turn in medians.items():
        for turn, times in per_turn.items():
            print(f"median {name:<7} {turn:>6} " + "".join(f"{times[s]:>16}" for s in STAGES), flush=True)
    return {"median_cpu_ms": medians, "rounds": results}


def summary(servers: list[dict[str, Any]], transport: str) -> dict[str, Any]:
    mine = [server for server in servers if server["transport"] == transport]
    out: dict[str, Any] = {}
    for column in COLUMNS:
        per_turn = {}
        for number in (1, 2):
            values = [row[column] for server in mine for row in server["turns"]
                      if row["turn"] == number and row[column] is not None]
            per_turn[number] = round(statistics.median(values), 1) if values else None
        first, second = per_turn[1], per_turn[2]
        out[column] = {"first": first, "second": second,
                       "first_over_second": round(first / second, 2) if first and second else None}
    out["start_s"] = round(statistics.median(server["start_s"] for server in mine), 1)
    roles = sorted({role for server in mine for row in server["turns"] for role in row.get("cpu_ms", {})})
    out["cpu_ms"] = {
        role: {f"turn {number}": round(statistics.median(
            row["cpu_ms"][role] for server in mine for row in server["turns"] if row["turn"] == number), 1)
            for number in (1, 2)}
        for role in roles
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh servers per transport")
    parser.add_argument("--turns", type=int, default=3, help="turns per server (at least 2)")
    parser.add_argument("--transport", nargs="+", choices=["websocket", "webrtc"], default=["websocket", "webrtc"])
    parser.add_argument("--part", nargs="+", choices=["servers", "stages"], default=["servers", "stages"])
    parser.add_argument("--label", default="after", help="the result entry to write (before/after kept side by side)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.turns < 2:
        parser.error("--turns must be at least 2: the first turn is compared with the second")
    servers: list[dict[str, Any]] = []
    stats: dict[str, Any] = {}
    if "servers" in args.part:
        print(f"{'round':>5} {'transport':<10} {'start s':>8} " + " ".join(f"{f'turn {n} {c}':>20}" for n in (1, 2)
                                                                       for c in COLUMNS), flush=True)
        for round_number in range(1, args.rounds + 1):
            for transport in args.transport:  # interleaved, so that other jobs' load falls on both alike
                server = one_server(transport, args.turns)
                servers.append(server)
                cells = " ".join(f"{'-' if row[c] is None else row[c]:>20}" for row in server["turns"][:2] for c in COLUMNS)
                print(f"{round_number:>5} {transport:<10} {server['start_s']:>8} {cells}", flush=True)
        stats = {transport: summary(servers, transport) for transport in args.transport}
        for transport, values in stats.items():
            for column in COLUMNS:
                entry = values[column]
                print(f"{transport:<10} {column:<10} median turn 1 {entry['first']} ms, turn 2 {entry['second']} ms, "
                      f"ratio {entry['first_over_second']}")
            for role, per_turn in values["cpu_ms"].items():
                print(f"{transport:<10} CPU ms of the {role} over the turn: {per_turn}")
    stages = run_stages(args.rounds) if "stages" in args.part else None
    report: dict[str, Any] = {}
    if args.out.exists():
        report = json.loads(args.out.read_text())
    report[args.label] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "server": f"dev model, answers capped at {DEV_MODEL_AUDIO_FRAMES} codec frames",
        "machine": machine(),
        "summary": stats,
        "servers": servers,
        "stages": stages,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
