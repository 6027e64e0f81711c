"""End-to-end latency over WebRTC: end of speech in the fixture -> first audible frame at the client.

Run: .venv/bin/python tests/bench/e2e_latency.py [--turns 10] [--url http://127.0.0.1:8000]
     [--max-output-tokens 8] [--transport webrtc|websocket] [--out tests/bench/results/e2e_latency.json]
     [--turn-detection server_vad|semantic_vad[:low|medium|high] ...] [--utterances espeak|finished]
     [--speculation on|off ...]

``--transport websocket`` measures the same over ``GET /v1/realtime`` with
``app.client.websocket.RealtimeSocketClient`` (speech appended in 100 ms events paced as a
microphone captures them; ``client_ms`` runs to the first ``response.output_audio.delta``),
written to ``e2e_latency_websocket.json`` by default.

``--turn-detection`` is sent with the session (default server_vad, 500 ms). Given several modes
(``--turn-detection server_vad semantic_vad:medium``), one session per mode is opened and the
modes take turns utterance by utterance in one run, so that other jobs' load falls on each alike;
the JSON's ``median_client_ms_drop`` is the first mode's median client_ms minus each other's. ``--utterances
finished`` speaks the finished sentences of tests/fixtures/turns (Flite voices, labelled for
turn-taking) instead of the two espeak-ng fixtures. ``--speculation`` sets the sessions'
``turn_detection.speculative_response`` (default on, the server's default); ``--speculation off on``
runs every turn-detection mode both ways, interleaved like the modes.

Without ``--url`` it starts ``omni-rtc serve --ice-loopback`` with the dev model on a free
loopback port (as ``soak.py`` does; answers capped at 25 codec frames). One headless client
(``app.client.webrtc.RealtimeClient``) says ``tests/fixtures/hello.wav`` and ``weather.wav`` in turn,
``--turns`` times, each turn ended by the server VAD and waited out until its answer has played.

Per turn:
- ``client_ms``: the client's figure (``TurnResult.latency_s``): last fixture sample sent by
  the paced microphone -> first received 20 ms frame with a peak >= -60 dBFS;
- the server's ``latency`` block from ``response.done``: ``silence_wait_ms`` (the VAD's silence
  wait), ``engine_first_audio_ms`` (the engine's time to first audio, queue wait included),
  ``other_ms`` (commit -> first chunk handed to the outbound track, minus the engine's part);
- ``overhead_ms`` = client_ms - silence_wait_ms - engine_first_audio_ms: everything that is
  neither waiting for silence nor the model (inbound RTP/Opus/jitter buffer/VAD windows,
  session, engine IPC, outbound pacing, Opus/RTP, the client's jitter buffer and decode);
- ``wire_ms`` = client_ms - end_of_speech_to_first_audio_ms: the part the server cannot see
  (inbound path to the VAD's commit beyond the silence wait, and outbound path to the client).

Most of the overhead is the VAD itself: silero's probability stays above threshold for a
window or two after speech ends (tests/bench/path_latency.py takes it apart, with Opus and the
transport). So the same VAD also runs here offline over each fixture followed by silence, fed in 20 ms chunks as the
inbound track delivers them, at 16 alignments of the fixture against the windows: ``vad_lag_ms``
= commit - (chunk holding the fixture's last sample) - silence_duration_ms, the median over the
alignments. ``overhead_ms - vad_lag_ms`` is then what transport, session and pacing add.

Target (issue 6): median overhead_ms <= 60.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, write_report  # noqa: E402
from soak import DEV_MODEL_AUDIO_FRAMES, FIXTURES, REPO, TURN_TIMEOUT_S, dev_model_server  # noqa: E402

from app.client.webrtc import RealtimeClient  # noqa: E402
from app.client.websocket import CHUNK_MS, RealtimeSocketClient  # noqa: E402  (after the path set-up above)
from media.rates import SPEECH_RATE  # noqa: E402
from media.turn_detection import TurnDetectionParams, UtteranceCommitted, VoiceActivityDetector  # noqa: E402
from media.vad import WINDOW_SAMPLES, SileroVad  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "e2e_latency.json"
UTTERANCES = ("hello.wav", "weather.wav")
FINISHED = tuple(f"turns/finished_{n:02d}_{voice}.wav" for n, voice in ((3, "slt85"), (4, "awb110"), (7, "awb90"),
                                                                          (10, "rms100"), (1, "awb90")))
COLUMNS = ("client_ms", "silence_wait_ms", "engine_first_audio_ms", "other_ms", "wire_ms", "overhead_ms")
INBOUND_CHUNK_SAMPLES = 320  # 20 ms at 16 kHz: one Opus frame, as media.inbound delivers it
VAD_ALIGNMENTS = 16  # fixture starts 0, 2, 4 ... 30 ms into a 32 ms VAD window


def vad_lag_ms(
    pcm: np.ndarray, params: TurnDetectionParams, vad: SileroVad, chunk_samples: int = INBOUND_CHUNK_SAMPLES
) -> list[float]:
    """Per alignment: the server VAD's commit after the fixture's end, beyond silence_duration_ms,
    with the input arriving in ``chunk_samples`` pieces (20 ms over WebRTC, 100 ms appends over the WebSocket)."""
    lags = []
    for alignment in range(VAD_ALIGNMENTS):
        lead = SPEECH_RATE + alignment * WINDOW_SAMPLES // VAD_ALIGNMENTS  # 1 s of silence, then the shift
        stream = np.concatenate([np.zeros(lead, np.float32), pcm, np.zeros(2 * SPEECH_RATE, np.float32)])
        end_chunk = -(-(lead + len(pcm)) // chunk_samples)  # the chunk after which the client says "spoken"
        detector = VoiceActivityDetector(vad, params)
        for chunk, start in enumerate(range(0, len(stream), chunk_samples), start=1):
            if any(isinstance(e, UtteranceCommitted) for e in detector.push(stream[start : start + chunk_samples])):
                waited_ms = (chunk - end_chunk) * chunk_samples * 1000 / SPEECH_RATE
                lags.append(waited_ms - params.silence_duration_ms)
                break
    return lags


def turn_row(number: int, fixture: str, client_latency_s: float | None, latency: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"turn": number, "fixture": fixture}
    if client_latency_s is None or latency is None or latency.get("engine_first_audio_ms") is None:
        return {**row, **dict.fromkeys(COLUMNS)}
    client_ms = client_latency_s * 1000
    return {
        **row,
        "client_ms": round(client_ms, 1),
        "silence_wait_ms": latency["silence_wait_ms"],
        "engine_first_audio_ms": latency["engine_first_audio_ms"],
        "queue_wait_ms": latency["queue_wait_ms"],
        "other_ms": latency["other_ms"],
        "wire_ms": round(client_ms - latency["end_of_speech_to_first_audio_ms"], 1),
        "overhead_ms": round(client_ms - latency["silence_wait_ms"] - latency["engine_first_audio_ms"], 1),
        "speculative": latency.get("speculative", False),
        "speculation_hidden_ms": latency.get("speculation_hidden_ms", 0.0),
    }


def turn_detection_object(spec: str) -> dict[str, Any]:
    """``server_vad`` or ``semantic_vad[:eagerness]`` as a session's turn_detection."""
    kind, _, eagerness = spec.partition(":")
    if kind == "server_vad" and not eagerness:
        return {"type": "server_vad", "silence_duration_ms": 500}
    if kind == "semantic_vad" and eagerness in ("", "low", "medium", "high", "auto"):
        return {"type": "semantic_vad", "eagerness": eagerness or "auto"}
    raise argparse.ArgumentTypeError(f"expected server_vad or semantic_vad[:low|medium|high|auto], got {spec!r}")


def mode_name(turn_detection: dict[str, Any]) -> str:
    speculation = "" if turn_detection.get("speculative_response", True) else ", no spec"
    if turn_detection["type"] == "server_vad":
        return f"server_vad {turn_detection['silence_duration_ms']} ms{speculation}"
    return f"semantic_vad {turn_detection['eagerness']}{speculation}"


def open_client(url: str, transport: str, session: dict[str, Any]) -> RealtimeClient | RealtimeSocketClient:
    if transport == "websocket":
        return RealtimeSocketClient(url, session=session, timeout_s=TURN_TIMEOUT_S)
    return RealtimeClient(url, ice_loopback=True, session=session, timeout_s=TURN_TIMEOUT_S)


async def run_turns(url: str, turns: int, max_output_tokens: int, transport: str = "webrtc",
                    turn_detections: list[dict[str, Any]] | None = None,
                    utterances: tuple[str, ...] = UTTERANCES) -> dict[str, list[dict[str, Any]]]:
    """``turns`` turns per turn-detection mode, one session per mode, all open at once; the modes
    take turns utterance by utterance, so that load from other jobs falls on each alike."""
    speech = {name: sf.read(FIXTURES / name, dtype="float32")[0] for name in utterances}
    modes = turn_detections or [turn_detection_object("server_vad")]
    rows: dict[str, list[dict[str, Any]]] = {mode_name(mode): [] for mode in modes}
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for mode in modes:
            session = {"max_output_tokens": max_output_tokens, "audio": {"input": {"turn_detection": mode}}}
            client = await stack.enter_async_context(open_client(url, transport, session))
            effective = client.events[0]["session"]["audio"]["input"]["turn_detection"]
            if effective["type"] != mode["type"]:
                raise SystemExit(f"the server runs {effective['type']}, not {mode['type']}: {client.events[1:2]}")
            clients.append((mode_name(mode), client))
        for number in range(1, turns + 1):
            fixture = utterances[(number - 1) % len(utterances)]
            for name, client in clients:
                result = await client.speak(speech[fixture])
                latency = next(e for e in result.events if e["type"] == "response.done").get("latency")
                row = turn_row(number, fixture, result.latency_s, latency)
                row["status"] = result.status
                rows[name].append(row)
                print(f"{name:<22}" + format_row(row), flush=True)
    return rows


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation between turns)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    measured = [row for row in rows if row["overhead_ms"] is not None]
    if not measured:
        raise SystemExit("no turn produced audible audio with a server latency breakdown")
    return {
        name: {
            column: round(statistic([row[column] for row in measured]), 1)
            for column in COLUMNS
        }
        for name, statistic in (("median", statistics.median), ("p90", lambda v: percentile(v, 0.9)))
    }


def header() -> str:
    return f"{'turn':>4} {'fixture':<28}" + "".join(f"{column.removesuffix('_ms'):>20}" for column in COLUMNS)


def format_row(row: dict[str, Any]) -> str:
    cells = "".join(f"{'-' if row[c] is None else row[c]:>20}" for c in COLUMNS)
    return f"{row['turn']:>4} {row['fixture']:<28}{cells}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running server (default: start one with the dev model)")
    parser.add_argument("--turns", type=int, default=10, help="turns per turn-detection mode")
    parser.add_argument("--max-output-tokens", type=int, default=8)
    parser.add_argument("--transport", choices=["webrtc", "websocket"], default="webrtc")
    parser.add_argument("--out", type=Path, help=f"default: {DEFAULT_OUT} (websocket: e2e_latency_websocket.json)")
    parser.add_argument("--turn-detection", type=turn_detection_object, nargs="+",
                        default=[turn_detection_object("server_vad")], metavar="server_vad|semantic_vad[:EAGERNESS]",
                        help="one or more modes; several run side by side, turn by turn, in one run")
    parser.add_argument("--utterances", choices=["espeak", "finished"], default="espeak")
    parser.add_argument("--speculation", choices=["on", "off"], nargs="+", default=["on"],
                        help="speculative answers (turn_detection.speculative_response); both: each mode both ways")
    args = parser.parse_args()
    args.turn_detection = [{**mode, "speculative_response": speculation == "on"}
                           for mode in args.turn_detection for speculation in args.speculation]
    utterances = UTTERANCES if args.utterances == "espeak" else FINISHED
    if args.out is None:
        args.out = DEFAULT_OUT if args.transport == "webrtc" else DEFAULT_OUT.with_name("e2e_latency_websocket.json")
    print("milliseconds; overhead = client - silence_wait - engine_first_audio; wire = client - server's end_of_speech_to_first_audio")
    print(f"{'mode':<22}" + header(), flush=True)
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(dev_model_server())
        rows = asyncio.run(run_turns(url, args.turns, args.max_output_tokens, args.transport, args.turn_detection,
                                     utterances))
    stats = {name: summary(mode_rows) for name, mode_rows in rows.items()}
    for mode, mode_stats in stats.items():
        for name, values in mode_stats.items():
            print(f"{mode:<22}{name:>9}" + "".join(f"{values[c]:>20}" for c in COLUMNS))
        print(f"{mode}: median overhead beyond silence wait and engine TTFA: {mode_stats['median']['overhead_ms']} ms"
              " (target <= 60)")
    first, *others = stats
    drops = {other: round(stats[first]["median"]["client_ms"] - stats[other]["median"]["client_ms"], 1) for other in others}
    for other, drop in drops.items():
        print(f"median end of speech -> first audio, {first} minus {other}: {drop} ms")
    vad = SileroVad.load()
    params = TurnDetectionParams()  # the session default: 500 ms silence, threshold 0.5
    chunk_samples = INBOUND_CHUNK_SAMPLES if args.transport == "webrtc" else CHUNK_MS * SPEECH_RATE // 1000
    vad_lags = {
        name: vad_lag_ms(sf.read(FIXTURES / name, dtype="float32")[0], params, vad, chunk_samples) for name in utterances
    }
    for name, lags in vad_lags.items():
        print(f"VAD commit after {name} beyond {params.silence_duration_ms} ms (offline, {len(lags)} alignments): "
              f"median {statistics.median(lags):.0f}, min {min(lags):.0f}, max {max(lags):.0f} ms")
    all_lags = [lag for lags in vad_lags.values() for lag in lags]
    vad_median = statistics.median(all_lags)
    print(f"median overhead less the VAD's median lag ({vad_median:.0f} ms), {first}: "
          f"{stats[first]['median']['overhead_ms'] - vad_median:.0f} ms of transport, session and pacing")
    write_report(args.out, {
        "args": {k: str(v) for k, v in vars(args).items()},
        "turn_detection": args.turn_detection,
        "server": args.url or f"dev model, answers capped at {DEV_MODEL_AUDIO_FRAMES} codec frames",
        "machine": machine(),
        "summary": stats,
        "median_client_ms_drop": drops,
        "vad_lag_ms": {"per_fixture": vad_lags, "median": vad_median},
        "turns": rows,
    })


if __name__ == "__main__":
    main()
