"""End-to-end latency over WebRTC: end of speech in the fixture -> first audible frame at the client.

Run: .venv/bin/python tests/bench/e2e_latency.py [--turns 10] [--url http://127.0.0.1:8000]
     [--max-output-tokens 8] [--transport webrtc|websocket] [--out tests/bench/results/e2e_latency.json]
     [--turn-detection server_vad|semantic_vad[:low|medium|high] ...] [--utterances espeak|finished|families]
     [--paused N] [--speculation off on] [--speed dev FIRST_AUDIO_MS[/FRAME_MS] ...] [--visitors N]

``--transport websocket`` measures the same over ``GET /v1/realtime`` with
``app.client.websocket.RealtimeSocketClient`` (speech appended in 100 ms events paced as a
microphone captures them; ``client_ms`` runs to the first ``response.output_audio.delta``),
written to ``e2e_latency_websocket.json`` by default.

``--turn-detection`` is sent with the session (default server_vad, 500 ms). Given several modes
(``--turn-detection server_vad semantic_vad:medium``), one session per mode is opened and the
modes take turns utterance by utterance in one run, so that other jobs' load falls on each alike;
the JSON's ``median_client_ms_drop`` is the first mode's median client_ms minus each other's. ``--utterances
finished`` speaks the finished sentences of tests/fixtures/turns (Flite voices, labelled for
turn-taking) instead of the two espeak-ng fixtures.

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

Target: median overhead_ms <= 60.

Speculation, emulated speed and visitors:

- ``--speculation off on`` sends ``audio.input.turn_detection.speculative_response`` with each
  mode's session (one session per value; without the option the field is not sent, and the
  server's default applies). The columns then add ``hidden_ms`` (``response.done``'s
  ``speculation_hidden_ms``: engine time that ran before the commit, which the user did not wait
  for) and, from the mode's server's ``/metrics`` read before and after each utterance, the
  speculations started and used (hit rate = used / started) and the engine time thrown away
  (``omni_rtc_speculative_discarded_engine_seconds``) against the engine time of the turns used
  (``omni_rtc_engine_turn_seconds{task="respond"}`` less the discarded).
- ``--speed dev 400`` starts one dev-model server per speed, side by side: ``dev`` at the dev
  model's own speed, ``400`` (or ``400/30``) with an emulated model whose first audio takes 400 ms
  of model time (and each later codec frame 30 ms): ``--generation '{"emulate": ...}'``
  (``pipeline/local/emulation.py``, benchmarks only). Every mode of an emulated server is named
  ``emulated ...`` in the table and the JSON, which also records each server's speed.
- Modes are every speed x turn detection x speculation, each its own session(s), all open at
  once; they take turns utterance by utterance. ``--visitors N`` gives each mode N sessions that
  say each utterance at the same moment (N visitors talking at once), so that a mode's turns
  meet N-1 others in the engine.
- ``--utterances families`` says finished sentences of two voice families of
  tests/fixtures/turns (Flite and espeak-ng, alternately), and ``--paused N`` mixes in N paused
  sentences (Flite and espeak-ng, spread evenly): speech that stops for 0.7-1 s mid-sentence and
  goes on, where a speculation starts and should be thrown away. Latency columns are over the
  finished sentences only; the engine time thrown away is reported per kind. After a paused
  sentence the bench waits ``SETTLE_S`` and until every commit of it has its answer, since a
  server VAD of 500 ms commits at the pause and again at the end.

For the record (one run with every part merged)::

    .venv/bin/python tests/bench/e2e_latency.py --utterances families --turns 10 --paused 4 \
        --turn-detection server_vad semantic_vad:medium --speculation off on --speed dev 400 \
        --out tests/bench/results/e2e_latency_speculation.json
    .venv/bin/python tests/bench/e2e_latency.py --utterances families --turns 6 --visitors 5 \
        --speculation off on --out tests/bench/results/e2e_latency_visitors.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, write_report  # noqa: E402
from soak import DEV_MODEL_AUDIO_FRAMES, FIXTURES, REPO, TURN_TIMEOUT_S, dev_model_server  # noqa: E402

from app.client.webrtc import RealtimeClient  # noqa: E402
from app.client.websocket import CHUNK_MS, RealtimeSocketClient  # noqa: E402  (after the path set-up above)
from media.detector_events import UtteranceCommitted
from media.detector_params import TurnDetectionParams
from media.rates import SPEECH_RATE  # noqa: E402
from media.vad import WINDOW_SAMPLES, SileroVad  # noqa: E402
from media.voice_activity_detector import VoiceActivityDetector

DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "e2e_latency.json"
UTTERANCES = ("hello.wav", "weather.wav")
FINISHED = tuple(f"turns/finished_{n:02d}_{voice}.wav" for n, voice in ((3, "slt85"), (4, "awb110"), (7, "awb90"),
                                                                          (10, "rms100"), (1, "awb90")))
ESPEAK_FINISHED = tuple(f"turns/espeak-ng/finished_{name}.wav" for name in (
    "00_en-us", "01_en-gb-x-rp", "03_en-us", "04_en-us-f2", "05_en-us"))
# Two voice families taking turns: Flite, espeak-ng, Flite...
FAMILIES = tuple(itertools.chain.from_iterable(zip(FINISHED, ESPEAK_FINISHED)))
PAUSED = ("turns/paused_00_slt100.wav", "turns/espeak-ng/paused_00_en-us.wav", "turns/paused_02_rms115.wav",
          "turns/espeak-ng/paused_01_en-gb-x-rp.wav", "turns/paused_03_awb110.wav", "turns/espeak-ng/paused_02_en-us.wav")
COLUMNS = ("client_ms", "silence_wait_ms", "engine_first_audio_ms", "other_ms", "wire_ms", "overhead_ms")
# After a paused sentence: past the longest silence wait a session may hold before committing
# (semantic VAD's 1.2 s when unsure) and the VAD's lag, so that its last commit has happened.
SETTLE_S = 2.0
# The speculation figures read from a server's /metrics (app/metrics.py).
SPECULATIONS = "omni_rtc_speculative_responses_total"
DISCARDED = "omni_rtc_speculative_discarded_engine_seconds_total"
ENGINE_TURNS = "omni_rtc_engine_turn_seconds_sum"
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
    row: dict[str, Any] = {"turn": number, "fixture": fixture, "kind": "paused" if "paused_" in fixture else "finished"}
    if client_latency_s is None or latency is None or latency.get("engine_first_audio_ms") is None:
        return {**row, **dict.fromkeys(COLUMNS)}
    client_ms = client_latency_s * 1000
    return {
        **row,
        "speculative": latency.get("speculative"),
        "hidden_ms": latency.get("speculation_hidden_ms"),
        "client_ms": round(client_ms, 1),
        "silence_wait_ms": latency["silence_wait_ms"],
        "engine_first_audio_ms": latency["engine_first_audio_ms"],
        "queue_wait_ms": latency["queue_wait_ms"],
        "other_ms": latency["other_ms"],
        "wire_ms": round(client_ms - latency["end_of_speech_to_first_audio_ms"], 1),
        "overhead_ms": round(client_ms - latency["silence_wait_ms"] - latency["engine_first_audio_ms"], 1),
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
    if turn_detection["type"] == "server_vad":
        return f"server_vad {turn_detection['silence_duration_ms']} ms"
    return f"semantic_vad {turn_detection['eagerness']}"


@dataclass(frozen=True)
class Speed:
    """A server's model speed: the dev model's own (``first_audio_ms`` None), or emulated."""

    first_audio_ms: float | None = None
    frame_ms: float | None = None

    @property
    def name(self) -> str:
        if self.first_audio_ms is None:
            return "dev"
        return f"emulated {self.first_audio_ms:g} ms" + (f", {self.frame_ms:g} ms/frame" if self.frame_ms else "")

    def emulate(self) -> dict[str, float] | None:
        """``GenerationParams.emulate`` for this speed (None: not emulated)."""
        if self.first_audio_ms is None:
            return None
        return {"first_audio_ms": self.first_audio_ms} | ({"frame_ms": self.frame_ms} if self.frame_ms else {})


def speed_object(spec: str) -> Speed:
    """``dev``, ``FIRST_AUDIO_MS`` or ``FIRST_AUDIO_MS/FRAME_MS``."""
    if spec == "dev":
        return Speed()
    first, _, frame = spec.partition("/")
    try:
        return Speed(float(first), float(frame) if frame else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected dev, FIRST_AUDIO_MS or FIRST_AUDIO_MS/FRAME_MS, got {spec!r}") from None


@dataclass(frozen=True)
class Mode:
    """One column of the run: a server (its speed), a turn detection, speculation on, off or unset."""

    speed: Speed
    turn_detection: dict[str, Any]
    speculation: bool | None

    @property
    def name(self) -> str:
        parts = [mode_name(self.turn_detection)]
        if self.speculation is not None:
            parts.append(f"spec {'on' if self.speculation else 'off'}")
        if self.speed.first_audio_ms is not None:
            parts.append(self.speed.name)
        return ", ".join(parts)

    def session(self, max_output_tokens: int) -> dict[str, Any]:
        turn_detection = dict(self.turn_detection)
        if self.speculation is not None:
            turn_detection["speculative_response"] = self.speculation
        return {"max_output_tokens": max_output_tokens, "audio": {"input": {"turn_detection": turn_detection}}}


def open_client(url: str, transport: str, session: dict[str, Any]) -> RealtimeClient | RealtimeSocketClient:
    if transport == "websocket":
        return RealtimeSocketClient(url, session=session, timeout_s=TURN_TIMEOUT_S)
    return RealtimeClient(url, ice_loopback=True, session=session, timeout_s=TURN_TIMEOUT_S)


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


async def speculation_figures(http: httpx.AsyncClient) -> dict[str, float]:
    """The server's speculation counters and respond turns' engine seconds (0 where it has none)."""
    figures = {"started": 0.0, "used": 0.0, "discarded": 0.0, "discarded_s": 0.0, "engine_s": 0.0}
    for line in (await http.get("/metrics")).text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None:
            continue
        name, labels, value = sample["name"], sample["labels"] or "", float(sample["value"])
        if name == SPECULATIONS:
            outcome = re.search(r'outcome="([^"]*)"', labels)
            if outcome is not None and outcome[1] in figures:
                figures[outcome[1]] += value
        elif name == DISCARDED:
            figures["discarded_s"] += value
        elif name == ENGINE_TURNS and 'task="respond"' in labels:
            figures["engine_s"] += value
    return figures


async def settle(client: RealtimeClient | RealtimeSocketClient, first_event: int) -> None:
    """After a paused sentence: its last commit has come and every commit has its answer, played."""
    await asyncio.sleep(SETTLE_S)
    async with asyncio.timeout(TURN_TIMEOUT_S):
        while True:
            events = client.events[first_event:]
            commits = sum(event["type"] == "input_audio_buffer.committed" for event in events)
            answers = sum(event["type"] == "response.done" for event in events)
            playing = sum(event["type"] == "output_audio_buffer.started" for event in events) > sum(
                event["type"] in ("output_audio_buffer.stopped", "output_audio_buffer.cleared") for event in events)
            if answers >= commits and not playing:
                return
            await asyncio.sleep(0.1)


async def one_turn(client: RealtimeClient | RealtimeSocketClient, speech: np.ndarray, number: int,
                   fixture: str) -> dict[str, Any]:
    first_event = len(client.events)
    result = await client.speak(speech)
    latency = next(e for e in result.events if e["type"] == "response.done").get("latency")
    row = turn_row(number, fixture, result.latency_s, latency)
    row["status"] = result.status
    if row["kind"] == "paused":
        await settle(client, first_event)
    return row


async def run_turns(url: str | dict[Speed, str], turns: int, max_output_tokens: int, transport: str = "webrtc",
                    turn_detections: list[dict[str, Any]] | None = None,
                    utterances: tuple[str, ...] = UTTERANCES, *, speculations: list[bool] | None = None,
                    visitors: int = 1, paused: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``turns`` turns per mode (every server speed x turn detection x speculation), ``visitors``
    sessions per mode, all open at once; the modes take turns utterance by utterance, so that
    load from other jobs falls on each alike. ``paused`` paused sentences are spread among them."""
    servers = url if isinstance(url, dict) else {Speed(): url}
    order = [utterances[(number - 1) % len(utterances)] for number in range(1, turns + 1)]
    for index in range(paused):  # spread evenly, never first
        order.insert(round((index + 1) * len(order) / (paused + 1)) + index, PAUSED[index % len(PAUSED)])
    speech = {name: sf.read(FIXTURES / name, dtype="float32")[0] for name in set(order)}
    modes = [Mode(speed, turn_detection, speculation) for speed in servers
             for turn_detection in (turn_detections or [turn_detection_object("server_vad")])
             for speculation in (speculations or [None])]
    rows: dict[str, list[dict[str, Any]]] = {mode.name: [] for mode in modes}
    async with contextlib.AsyncExitStack() as stack:
        clients: list[tuple[Mode, list[RealtimeClient | RealtimeSocketClient]]] = []
        metrics = {speed: await stack.enter_async_context(httpx.AsyncClient(base_url=server, timeout=30))
                   for speed, server in servers.items()}
        for mode in modes:
            group = []
            for _ in range(visitors):
                client = await stack.enter_async_context(open_client(servers[mode.speed], transport,
                                                                     mode.session(max_output_tokens)))
                # The session as the server last stated it (over the WebSocket, session.updated
                # follows session.created; over WebRTC the offer carried it).
                stated = next(e for e in reversed(client.events) if e["type"] in ("session.created", "session.updated"))
                effective = stated["session"]["audio"]["input"]["turn_detection"]
                if effective["type"] != mode.turn_detection["type"]:
                    raise SystemExit(f"the server runs {effective['type']}, not {mode.turn_detection['type']}: "
                                     f"{client.events[1:2]}")
                group.append(client)
            clients.append((mode, group))
        for number, fixture in enumerate(order, start=1):
            for mode, group in clients:
                before = await speculation_figures(metrics[mode.speed])
                mode_rows = await asyncio.gather(*(one_turn(client, speech[fixture], number, fixture) for client in group))
                after = await speculation_figures(metrics[mode.speed])
                # Sessions of one mode speak together and other modes wait: the server's counters
                # moved for this mode's utterance alone (split evenly over its visitors).
                for row in mode_rows:
                    row["speculation"] = {key: round((after[key] - before[key]) / len(group), 4) for key in after}
                    rows[mode.name].append(row)
                    print(f"{mode.name[:40]:<40}" + format_row(row), flush=True)
    return rows


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation between turns)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median and p90 of each column over the finished sentences answered audibly."""
    measured = [row for row in rows if row["overhead_ms"] is not None and row["kind"] == "finished"]
    if not measured:
        raise SystemExit("no turn produced audible audio with a server latency breakdown")
    columns = COLUMNS + (("hidden_ms",) if any(row.get("hidden_ms") is not None for row in measured) else ())
    return {
        name: {
            column: round(statistic([row[column] or 0.0 for row in measured]), 1)
            for column in columns
        }
        for name, statistic in (("median", statistics.median), ("p90", lambda v: percentile(v, 0.9)))
    }


def speculation_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Hit rate (used / started) and the engine time thrown away, per kind of sentence and over all,
    against the engine time of the turns used (the mode's respond turns less what was thrown away)."""
    def totals(kind_rows: list[dict[str, Any]]) -> dict[str, float]:
        return {key: sum(row["speculation"][key] for row in kind_rows) for key in
                ("started", "used", "discarded", "discarded_s", "engine_s")}

    every = totals(rows)
    used_engine_s = every["engine_s"] - every["discarded_s"]
    out: dict[str, Any] = {
        "started": round(every["started"], 2), "used": round(every["used"], 2), "discarded": round(every["discarded"], 2),
        "hit_rate": round(every["used"] / every["started"], 3) if every["started"] else None,
        "used_engine_s": round(used_engine_s, 3),
    }
    for kind in ("finished", "paused"):
        kind_totals = totals([row for row in rows if row["kind"] == kind])
        out[f"hit_rate_{kind}"] = round(kind_totals["used"] / kind_totals["started"], 3) if kind_totals["started"] else None
        out[f"discarded_s_{kind}"] = round(kind_totals["discarded_s"], 3)
        out[f"discarded_share_{kind}"] = round(kind_totals["discarded_s"] / used_engine_s, 3) if used_engine_s > 0 else None
    return out


ROW_COLUMNS = (*COLUMNS, "hidden_ms")
_SHORT = {"silence_wait_ms": "silence", "engine_first_audio_ms": "engine TTFA"}


def header() -> str:
    return f"{'turn':>4} {'fixture':<44}" + "".join(f"{_SHORT.get(c, c.removesuffix('_ms')):>14}" for c in ROW_COLUMNS)


def format_row(row: dict[str, Any]) -> str:
    cells = "".join(f"{'-' if row.get(c) is None else row[c]:>14}" for c in ROW_COLUMNS)
    return f"{row['turn']:>4} {row['fixture']:<44}{cells}"


def table(stats: dict[str, dict[str, Any]], speculation: dict[str, dict[str, Any]]) -> str:
    """The one table of the run: a row per mode."""
    lines = [
        "| mode | client p50 | client p90 | silence wait | engine TTFA after commit | hidden | other | wire "
        "| hit rate | discarded on paused / used engine time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, values in stats.items():
        median, p90 = values["median"], values["p90"]
        spec = speculation[mode]
        hit = "-" if spec["hit_rate"] is None else f"{spec['hit_rate']:.0%} ({spec['used']:g}/{spec['started']:g})"
        share = "-" if spec["discarded_share_paused"] is None or not spec["started"] else f"{spec['discarded_share_paused']:.1%}"
        lines.append(
            f"| {mode} | {median['client_ms']} | {p90['client_ms']} | {median['silence_wait_ms']} | "
            f"{median['engine_first_audio_ms']} | {median.get('hidden_ms', '-')} | {median['other_ms']} | "
            f"{median['wire_ms']} | {hit} | {share} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running server (default: start one with the dev model)")
    parser.add_argument("--turns", type=int, default=10, help="finished-sentence turns per mode")
    parser.add_argument("--max-output-tokens", type=int, default=8)
    parser.add_argument("--transport", choices=["webrtc", "websocket"], default="webrtc")
    parser.add_argument("--out", type=Path, help=f"default: {DEFAULT_OUT} (websocket: e2e_latency_websocket.json)")
    parser.add_argument("--turn-detection", type=turn_detection_object, nargs="+",
                        default=[turn_detection_object("server_vad")], metavar="server_vad|semantic_vad[:EAGERNESS]",
                        help="one or more modes; several run side by side, turn by turn, in one run")
    parser.add_argument("--utterances", choices=["espeak", "finished", "families"], default="espeak")
    parser.add_argument("--paused", type=int, default=0, help="paused sentences mixed in per mode")
    parser.add_argument("--speculation", nargs="+", choices=["off", "on"],
                        help="turn_detection.speculative_response per session (default: not sent)")
    parser.add_argument("--speed", type=speed_object, nargs="+", metavar="dev|FIRST_AUDIO_MS[/FRAME_MS]",
                        help="one dev-model server per speed, side by side (emulated speeds: benchmarks only)")
    parser.add_argument("--visitors", type=int, default=1, help="sessions per mode saying each utterance at once")
    args = parser.parse_args()
    utterances = {"espeak": UTTERANCES, "finished": FINISHED, "families": FAMILIES}[args.utterances]
    if args.url and args.speed:
        parser.error("--speed starts its own servers; it cannot be used with --url")
    speeds = args.speed or [Speed()]
    speculations = None if args.speculation is None else [value == "on" for value in args.speculation]
    if args.out is None:
        args.out = DEFAULT_OUT if args.transport == "webrtc" else DEFAULT_OUT.with_name("e2e_latency_websocket.json")
    print("milliseconds; overhead = client - silence_wait - engine_first_audio; wire = client - server's end_of_speech_to_first_audio")
    print(f"{'mode':<40}" + header(), flush=True)
    with contextlib.ExitStack() as stack:
        if args.url:
            servers = {Speed(): args.url}
        else:
            servers = {}
            for speed in speeds:
                generation: dict[str, Any] = {"max_audio_frames": DEV_MODEL_AUDIO_FRAMES}
                if speed.emulate() is not None:
                    generation["emulate"] = speed.emulate()
                servers[speed] = stack.enter_context(dev_model_server(generation=json.dumps(generation)))
        rows = asyncio.run(run_turns(servers, args.turns, args.max_output_tokens, args.transport, args.turn_detection,
                                     utterances, speculations=speculations, visitors=args.visitors, paused=args.paused))
    stats = {name: summary(mode_rows) for name, mode_rows in rows.items()}
    speculation = {name: speculation_summary(mode_rows) for name, mode_rows in rows.items()}
    for mode, mode_stats in stats.items():
        for name, values in mode_stats.items():
            print(f"{mode[:40]:<40}{name:>9}" + "".join(f"{values.get(c, '-'):>14}" for c in ROW_COLUMNS))
        print(f"{mode}: median overhead beyond silence wait and engine TTFA: {mode_stats['median']['overhead_ms']} ms"
              " (target <= 60)")
    print(table(stats, speculation))
    first, *others = stats
    drops = {other: round(stats[first]["median"]["client_ms"] - stats[other]["median"]["client_ms"], 1) for other in others}
    for other, drop in drops.items():
        print(f"median end of speech -> first audio, {first} minus {other}: {drop} ms")
    vad = SileroVad.load()
    params = TurnDetectionParams()  # the session default: 500 ms silence, threshold 0.5
    chunk_samples = INBOUND_CHUNK_SAMPLES if args.transport == "webrtc" else CHUNK_MS * SPEECH_RATE // 1000
    spoken = sorted({row["fixture"] for mode_rows in rows.values() for row in mode_rows if row["kind"] == "finished"})
    vad_lags = {
        name: vad_lag_ms(sf.read(FIXTURES / name, dtype="float32")[0], params, vad, chunk_samples) for name in spoken
    }
    for name, lags in vad_lags.items():
        print(f"VAD commit after {name} beyond {params.silence_duration_ms} ms (offline, {len(lags)} alignments): "
              f"median {statistics.median(lags):.0f}, min {min(lags):.0f}, max {max(lags):.0f} ms")
    all_lags = [lag for lags in vad_lags.values() for lag in lags]
    vad_median = statistics.median(all_lags)
    print(f"median overhead less the VAD's median lag ({vad_median:.0f} ms), {first}: "
          f"{stats[first]['median']['overhead_ms'] - vad_median:.0f} ms of transport, session and pacing")
    emulated = {speed.name: speed.emulate() for speed in servers if speed.emulate() is not None}
    write_report(args.out, {
        "args": {k: str(v) for k, v in vars(args).items()},
        "turn_detection": args.turn_detection,
        "server": args.url or f"dev model, answers capped at {DEV_MODEL_AUDIO_FRAMES} codec frames",
        # Benchmarks only: these servers' model was slowed to a stated speed (pipeline/local/emulation.py).
        "emulation": emulated or None,
        "visitors": args.visitors,
        "machine": machine(),
        "summary": stats,
        "speculation": speculation,
        "table": table(stats, speculation),
        "median_client_ms_drop": drops,
        "vad_lag_ms": {"per_fixture": vad_lags, "median": vad_median},
        "turns": rows,
    })


if __name__ == "__main__":
    main()
