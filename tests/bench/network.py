"""Bad networks, before and after the jitter buffer: loss, jitter and reordering against turns and audio.

Run: .venv/bin/python tests/bench/network.py [--turns 4] [--seed 27] [--labels before after]
     [--conditions 0 2 5 10 5b3] [--out tests/bench/results/network.json]

One run, side by side: for each label a server (``omni-rtc serve`` with the dev model, as soak.py
starts it; ``before`` adds ``--no-jitter-buffer``, aiortc's own receive path, and its client reads
the answer the same way) and, per condition, one call of ``--turns`` utterances (hello.wav and
weather.wav in turn) through tests/netem.py's relay, impaired the same way both directions:

- ``0``, ``2``, ``5``, ``10``: that % of RTP/RTCP packets lost at random, with 10 ms of delay plus
  0-30 ms of jitter (uniform: packets overtake each other) and 1 % duplicated;
- ``5b3``: 5 % lost in bursts of 3 packets, same delay and jitter.

The relay's seed is the same for both labels, so both meet the same pattern of loss.

Per condition (medians over its turns unless said):

- ``ok``: turns answered (response.done completed or incomplete, with audio) of those spoken;
- ``commit_ms``: the utterance's last sample sent -> ``input_audio_buffer.committed`` at the client;
  ``late_commit_ms``: the most any turn committed later than the same utterance's median at 0 %
  (target at 5 %: <= 150);
- ``heard_pct``: how much of what the client sent the server's input timeline holds (the audio
  the VAD and the prompt are cut from): from one utterance's start to the next, the advance of
  ``speech_started.audio_start_ms`` against the microphone stream's own (``TurnResult.spoken_from_ms``),
  over the span from the call's second utterance to its last (needs ``--turns`` >= 3) (target at
  5 %: >= 98; over ~13 s, a VAD onset placed a window or two off at either end moves it by ~0.5 %);
- ``srv_fec``/``srv_plc``/``srv_late``: inbound frames the server rebuilt from FEC, concealed by
  PLC, and packets it dropped as late, over the call (``response.done``'s ``latency.network``;
  none before: aiortc's path neither measures nor conceals);
- ``ans_pct``: of the answer's timeline (first to last audible frame, by RTP time), the share the
  client received intact (its own packet, or rebuilt from FEC), least over turns; ``gap_ms``: the
  longest run of that timeline not received intact (concealed by PLC after, simply absent before),
  most over turns (target at 5 %: <= 60); ``cli_fec``/``cli_plc``: the client's own counts.

The gap is measured on the answer's timeline, not by arrival: the headless client records frames
as its jitter buffer releases them (a listener's player would play them at their RTP time plus the
buffer's depth), so what a listener misses is audio that was never received.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, write_report  # noqa: E402
from soak import FIXTURES, REPO, TURN_TIMEOUT_S, dev_model_server  # noqa: E402

from app.cli import read_utterance  # noqa: E402  (after the path set-up above)
from app.client.webrtc import AUDIBLE_PEAK, ClientError, RealtimeClient, ReceivedFrame  # noqa: E402
from tests.netem import ImpairedRelay, Impairment  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "network.json"
UTTERANCES = ("hello.wav", "weather.wav")
SESSION = {"type": "realtime", "max_output_tokens": 16}
FRAME = 960  # 20 ms at 48 kHz
JITTER = {"delay_ms": 10.0, "jitter_ms": 30.0, "duplicate": 0.01}
CONDITIONS = {
    "0": Impairment(loss=0.0, **JITTER),
    "2": Impairment(loss=0.02, **JITTER),
    "5": Impairment(loss=0.05, **JITTER),
    "10": Impairment(loss=0.10, **JITTER),
    "5b3": Impairment(loss=0.05, burst=3, **JITTER),
}
COLUMNS = ("ok", "commit_ms", "late_commit_ms", "heard_pct", "srv_fec", "srv_plc", "srv_late", "ans_pct", "gap_ms",
           "cli_fec", "cli_plc")


@dataclass
class Turn:
    utterance: str
    ok: bool
    commit_ms: float | None = None
    spoken_from_ms: float | None = None  # the utterance's start in the microphone's stream
    heard_from_ms: float | None = None  # speech_started's audio_start_ms: the same on the server's timeline
    answer_intact_pct: float | None = None
    answer_gap_ms: float | None = None
    error: str | None = None


@dataclass
class Condition:
    label: str
    condition: str
    impairment: str
    turns: list[Turn] = field(default_factory=list)
    server_network: dict[str, Any] | None = None  # the last response.done's latency.network
    client: dict[str, int] = field(default_factory=dict)
    relay: dict[str, dict[str, int]] = field(default_factory=dict)


def answer_timeline(frames: list[ReceivedFrame]) -> tuple[float, float] | None:
    """(share received intact %, longest run not received intact ms) of the answer's RTP timeline."""
    audible = [frame for frame in frames if frame.peak >= AUDIBLE_PEAK]
    if not audible:
        return None
    first, last = min(frame.pts for frame in audible), max(frame.pts for frame in audible)
    intact = {frame.pts for frame in frames if first <= frame.pts <= last and frame.origin in ("packet", "fec")}
    slots = range(first, last + FRAME, FRAME)
    longest = run = 0
    for slot in slots:
        run = 0 if slot in intact else run + 1
        longest = max(longest, run)
    return 100 * len(intact) / len(slots), longest * FRAME / 48


async def one_turn(client: RealtimeClient, name: str) -> Turn:
    first_event, first_frame = len(client.events), client.frames_received
    try:
        result = await client.speak(read_utterance(FIXTURES / name))
    except (ClientError, TimeoutError) as exc:
        return Turn(name, ok=False, error=str(exc))
    events = client.events[first_event:]
    arrivals = client.event_arrivals[first_event:]
    turn = Turn(name, ok=result.status in ("completed", "incomplete") and result.audible_seconds > 0)
    for event, arrived in zip(events, arrivals, strict=True):
        if event["type"] == "input_audio_buffer.committed" and turn.commit_ms is None:
            turn.commit_ms = (arrived - result.spoken_at) * 1000
    turn.spoken_from_ms = result.spoken_from_ms
    turn.heard_from_ms = next(
        (e["audio_start_ms"] for e in events if e["type"] == "input_audio_buffer.speech_started"), None
    )
    timeline = answer_timeline(client.frames_since(first_frame))
    if timeline is not None:
        turn.answer_intact_pct, turn.answer_gap_ms = timeline
    return turn


async def one_condition(url: str, label: str, name: str, turns: int, seed: int) -> Condition:
    impairment = CONDITIONS[name]
    condition = Condition(label, name, impairment.describe())
    async with ImpairedRelay(up=impairment, down=impairment, seed=seed) as relay:
        client = RealtimeClient(
            url, session=SESSION, ice_loopback=True, offer_candidates=False, answer_filter=relay.route_answer,
            jitter_buffer=label != "before", timeout_s=TURN_TIMEOUT_S,
        )
        async with client:
            for index in range(turns):
                turn = await one_turn(client, UTTERANCES[index % len(UTTERANCES)])
                condition.turns.append(turn)
                print(f"  {label} {name:>4} turn {index + 1}: {turn}", flush=True)
            done = [event for event in client.events if event["type"] == "response.done"]
            if done:
                condition.server_network = (done[-1].get("latency") or {}).get("network")
            if client.receive_stats is not None:
                stats = client.receive_stats
                condition.client = {"lost": stats.packets_lost, "late": stats.packets_late,
                                    "fec": stats.frames_recovered, "plc": stats.frames_concealed}
        condition.relay = {"up": asdict(relay.up.counts), "down": asdict(relay.down.counts)}
    return condition


def summarise(conditions: list[Condition]) -> dict[tuple[str, str], dict[str, Any]]:
    reference: dict[tuple[str, str], dict[str, float]] = {}  # (label, utterance) -> medians at 0 %
    for condition in conditions:
        if condition.condition != "0":
            continue
        for utterance in UTTERANCES:
            turns = [t for t in condition.turns if t.utterance == utterance and t.commit_ms is not None]
            if turns:
                reference[(condition.label, utterance)] = {
                    "commit_ms": statistics.median(t.commit_ms for t in turns),  # type: ignore[misc]
                }
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for condition in conditions:
        turns = condition.turns
        late = []
        for turn in turns:
            ref = reference.get((condition.label, turn.utterance))
            if ref is not None and turn.commit_ms is not None:
                late.append(turn.commit_ms - ref["commit_ms"])
        # From the second utterance on (the first one's audio_start_ms can be clamped at 0 by the
        # prefix padding, the call's first 300 ms) to the last: over the whole span, so that where
        # the VAD places one onset (a concealed first syllable can move it by a window or more)
        # counts once, at an end, not for and against two neighbouring intervals.
        heard_pct = None
        starts = [(t.spoken_from_ms, t.heard_from_ms) for t in turns[1:]]
        if len(starts) >= 2 and None not in (*starts[0], *starts[-1]):
            (first_sent, first_heard), (last_sent, last_heard) = starts[0], starts[-1]
            heard_pct = 100 * (last_heard - first_heard) / (last_sent - first_sent)  # type: ignore[operator]
        network = condition.server_network or {}
        commits = [t.commit_ms for t in turns if t.commit_ms is not None]
        intact = [t.answer_intact_pct for t in turns if t.answer_intact_pct is not None]
        gaps = [t.answer_gap_ms for t in turns if t.answer_gap_ms is not None]
        rows[(condition.label, condition.condition)] = {
            "ok": f"{sum(t.ok for t in turns)}/{len(turns)}",
            "commit_ms": round(statistics.median(commits)) if commits else None,
            "late_commit_ms": round(max(late)) if late else None,
            "heard_pct": None if heard_pct is None else round(heard_pct, 1),
            "srv_fec": network.get("inbound_frames_recovered"),
            "srv_plc": network.get("inbound_frames_concealed"),
            "srv_late": network.get("inbound_packets_late"),
            "ans_pct": round(min(intact), 1) if intact else None,
            "gap_ms": round(max(gaps)) if gaps else None,
            "cli_fec": condition.client.get("fec"),
            "cli_plc": condition.client.get("plc"),
        }
    return rows


def table(rows: dict[tuple[str, str], dict[str, Any]], labels: list[str], names: list[str]) -> str:
    lines = [f"{'loss':<6}{'label':<8}" + "".join(f"{column:>15}" for column in COLUMNS)]
    for name in names:
        for label in labels:
            row = rows.get((label, name))
            if row is None:
                continue
            cells = "".join(f"{'-' if row[c] is None else row[c]!s:>15}" for c in COLUMNS)
            lines.append(f"{name:<6}{label:<8}{cells}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> list[Condition]:
    conditions: list[Condition] = []
    for label in args.labels:
        serve_args = ["--media-workers", "1"] + (["--no-jitter-buffer"] if label == "before" else [])
        with dev_model_server(*serve_args) as url:
            for name in args.conditions:
                conditions.append(await one_condition(url, label, name, args.turns, args.seed))
    return conditions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=4, help="utterances per condition (default 4)")
    parser.add_argument("--seed", type=int, default=27, help="the relay's seed (default 27)")
    parser.add_argument("--labels", nargs="+", default=["before", "after"], choices=["before", "after"])
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if "0" not in args.conditions:
        parser.error("the 0 % condition is every other's reference: keep it in --conditions")
    started = time.monotonic()
    conditions = asyncio.run(run(args))
    rows = summarise(conditions)
    print(table(rows, args.labels, args.conditions))
    report = {
        "machine": machine(turns=args.turns, seed=args.seed, seconds=round(time.monotonic() - started)),
        "conditions": {name: CONDITIONS[name].describe() for name in args.conditions},
        "summary": {f"{label} {name}": row for (label, name), row in rows.items()},
        "runs": [asdict(condition) for condition in conditions],
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
