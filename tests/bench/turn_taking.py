"""Turn-taking over the labelled fixtures: server VAD (500 ms) beside semantic VAD at each eagerness.

Run: .venv/bin/python tests/bench/turn_taking.py [--out tests/bench/results/turn_taking.json]
     [--sweep]   (also prints a grid of candidate policies: how the eagerness table was chosen)

Each fixture of tests/fixtures/turns (manifest.json labels them) is fed as one session would hear
it: 500 ms of silence, the sentence, 2.5 s of silence, in 20 ms chunks through the real
VoiceActivityDetector (silero). An EndOfTurnCheck is scored by the real smart-turn model, and its
answer reaches the detector only after as much further audio as the model took to run (the
server runs it off the event loop while audio keeps arriving), so delays include the model's time.

Reported per policy: the commit delay after the end of speech on finished sentences (median,
p90: the commit's audio_end_ms minus where the speech ended), the share of paused sentences
committed before the pause ended (cut into two turns), and the model's cost: ms per decision and
per session, as % of one core (model time / audio time). Also measured: how late a 20 ms timer
on the event loop fires while decisions run off the loop with asyncio.to_thread, beside inline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from harness import machine, write_report  # this folder: a script's is first on sys.path

from app.realtime.session_config import END_OF_TURN_BY_EAGERNESS
from media.end_of_turn import SmartTurnModel, default_model_path
from media.rates import SPEECH_RATE
from media.turn_detection import (
    EndOfTurnCheck,
    EndOfTurnPolicy,
    TurnDetectionParams,
    UtteranceCommitted,
    VoiceActivityDetector,
)
from media.vad import SileroVad

TURNS = Path(__file__).resolve().parents[1] / "fixtures" / "turns"
CHUNK_SAMPLES = 320  # 20 ms, one inbound WebRTC frame after resampling
CHUNK_MS = 20
LEAD_MS = 500
TAIL_MS = 2_500
SERVER_VAD_SILENCE_MS = 500


@dataclass
class Fixture:
    name: str
    kind: str  # "finished" | "paused"
    pcm: np.ndarray
    speech_end_ms: int
    pause_end_ms: int | None


@dataclass
class Outcome:
    fixture: str
    kind: str
    commits_ms: list[int]  # audio_end_ms of each commit, in the fed stream
    speech_end_ms: int  # in the fed stream
    pause_end_ms: int | None
    decisions: int

    @property
    def delay_ms(self) -> int | None:
        return self.commits_ms[0] - self.speech_end_ms if self.commits_ms else None

    @property
    def cut(self) -> bool:
        return self.pause_end_ms is not None and bool(self.commits_ms) and self.commits_ms[0] < self.pause_end_ms


def load_fixtures() -> list[Fixture]:
    fixtures = []
    for entry in json.loads((TURNS / "manifest.json").read_text()):
        pcm, rate = sf.read(TURNS / entry["file"], dtype="float32")
        assert rate == SPEECH_RATE
        fixtures.append(Fixture(entry["file"], entry["kind"], pcm, entry["speech_end_ms"], entry.get("pause_end_ms")))
    return fixtures


class CachedScores:
    """The model's answer and cost per (fixture, utterance length): the policies share check points."""

    def __init__(self, model: SmartTurnModel) -> None:
        self._model = model
        self._scores: dict[tuple[str, int], tuple[float, float]] = {}

    def score(self, fixture: str, pcm: np.ndarray) -> tuple[float, float]:
        key = (fixture, pcm.size)
        if key not in self._scores:
            started = time.perf_counter()
            probability = self._model.probability(pcm)
            self._scores[key] = (probability, time.perf_counter() - started)
        return self._scores[key]


def run_one(vad: SileroVad, scores: CachedScores, params: TurnDetectionParams, fixture: Fixture,
            model_times: list[float], *, model_latency: bool = True) -> Outcome:
    lead = np.zeros(LEAD_MS * SPEECH_RATE // 1000, dtype=np.float32)
    tail = np.zeros(TAIL_MS * SPEECH_RATE // 1000, dtype=np.float32)
    stream = np.concatenate([lead, fixture.pcm, tail])
    detector = VoiceActivityDetector(vad, params)
    commits: list[int] = []
    pending: tuple[int, float, int] | None = None  # (check id, probability, chunks until it is answered)
    decisions = 0
    for start in range(0, stream.size, CHUNK_SAMPLES):
        events = detector.push(stream[start : start + CHUNK_SAMPLES])
        if pending is not None:
            check_id, probability, chunks_left = pending
            if chunks_left <= 1:
                events += detector.decide(check_id, probability)
                pending = None
            else:
                pending = (check_id, probability, chunks_left - 1)
        for event in events:
            if isinstance(event, EndOfTurnCheck):
                probability, elapsed = scores.score(fixture.name, event.pcm)
                model_times.append(elapsed)
                decisions += 1
                if not model_latency:
                    events_now = detector.decide(event.check_id, probability)
                    commits += [e.audio_end_ms for e in events_now if isinstance(e, UtteranceCommitted)]
                    continue
                # The answer applies after the audio that arrives while the model runs (>= 1 chunk).
                pending = (event.check_id, probability, max(1, math.ceil(elapsed * 1000 / CHUNK_MS)))
            elif isinstance(event, UtteranceCommitted):
                commits.append(event.audio_end_ms)
    pause_end = None if fixture.pause_end_ms is None else LEAD_MS + fixture.pause_end_ms
    return Outcome(fixture.name, fixture.kind, commits, LEAD_MS + fixture.speech_end_ms, pause_end, decisions)


def summarise(outcomes: list[Outcome], model_times: list[float], audio_s: float) -> dict[str, object]:
    delays = [o.delay_ms for o in outcomes if o.kind == "finished" and o.delay_ms is not None]
    paused = [o for o in outcomes if o.kind == "paused"]
    finished_missed = sum(1 for o in outcomes if o.kind == "finished" and not o.commits_ms)
    times_ms = np.array(model_times) * 1000 if model_times else np.zeros(1)
    return {
        "finished_delay_p50_ms": float(np.percentile(delays, 50)),
        "finished_delay_p90_ms": float(np.percentile(delays, 90)),
        "finished_not_committed": finished_missed,
        "paused_cut_share": round(sum(o.cut for o in paused) / len(paused), 3),
        "paused_whole_share": round(1 - sum(o.cut for o in paused) / len(paused), 3),
        "decisions": len(model_times),
        "decision_ms_p50": round(float(np.percentile(times_ms, 50)), 1) if model_times else 0.0,
        "decision_ms_p90": round(float(np.percentile(times_ms, 90)), 1) if model_times else 0.0,
        "model_core_percent": round(100 * sum(model_times) / audio_s, 2),
    }


def evaluate(vad: SileroVad, scores: CachedScores, params: TurnDetectionParams,
             fixtures: list[Fixture]) -> tuple[dict[str, object], list[Outcome]]:
    model_times: list[float] = []
    outcomes = [run_one(vad, scores, params, fixture, model_times) for fixture in fixtures]
    audio_s = sum((LEAD_MS + TAIL_MS) / 1000 + f.pcm.size / SPEECH_RATE for f in fixtures)
    summary = summarise(outcomes, model_times, audio_s)
    # The same decisions applied the moment they are asked for: the policy's own delay, which a
    # machine whose model answers in ~10 ms (pipecat's figure for a modern CPU) approaches.
    instant = [run_one(vad, scores, params, fixture, [], model_latency=False) for fixture in fixtures]
    instant_delays = [o.delay_ms for o in instant if o.kind == "finished" and o.delay_ms is not None]
    summary["finished_delay_p50_ms_instant_model"] = float(np.percentile(instant_delays, 50))
    summary["finished_delay_p90_ms_instant_model"] = float(np.percentile(instant_delays, 90))
    return summary, outcomes


async def pacing_lateness(model: SmartTurnModel | None, pcm: np.ndarray, *, off_loop: bool,
                          decisions: int = 20) -> dict[str, float]:
    """How late a 20 ms timer fires while ``decisions`` model runs happen (off the loop, inline, or none)."""
    lateness: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while not done.is_set():
            deadline += CHUNK_MS / 1000
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            lateness.append(max(0.0, loop.time() - deadline) * 1000)

    async def decide() -> None:
        for _ in range(decisions):
            if model is None:
                await asyncio.sleep(0.2)  # the baseline: the timer alone, as long as a decision takes here
            elif off_loop:
                await asyncio.to_thread(model.probability, pcm)
            else:
                model.probability(pcm)
            await asyncio.sleep(0.1)
        done.set()

    await asyncio.gather(ticker(), decide())
    values = np.array(lateness)
    return {"p50_ms": round(float(np.percentile(values, 50)), 2), "p99_ms": round(float(np.percentile(values, 99)), 2),
            "max_ms": round(float(values.max()), 2)}


def params_for(policy: EndOfTurnPolicy | None) -> TurnDetectionParams:
    return TurnDetectionParams(silence_duration_ms=SERVER_VAD_SILENCE_MS, end_of_turn=policy)


def sweep(vad: SileroVad, scores: CachedScores, fixtures: list[Fixture]) -> list[dict[str, object]]:
    rows = []
    for candidate_ms in (96, 128, 160, 192):
        for threshold in (0.5, 0.6, 0.7, 0.75, 0.8, 0.9):
            for rescore_ms in (0, 320):
                policy = EndOfTurnPolicy(candidate_ms=candidate_ms, rescore_ms=rescore_ms, threshold=threshold,
                                         max_wait_ms=1_200)
                summary, _ = evaluate(vad, scores, params_for(policy), fixtures)
                rows.append({"policy": asdict(policy), **summary})
                print(f"candidate {candidate_ms:4d} threshold {threshold:.2f} rescore {rescore_ms:4d}: "
                      f"p50 {summary['finished_delay_p50_ms']:6.0f}  p90 {summary['finished_delay_p90_ms']:6.0f}  "
                      f"instant-model p50 {summary['finished_delay_p50_ms_instant_model']:6.0f}  "
                      f"paused whole {summary['paused_whole_share']:.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "turn_taking.json")
    parser.add_argument("--sweep", action="store_true", help="also print a grid of candidate policies")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "omni-rtc")
    args = parser.parse_args()

    vad = SileroVad.load()
    model = SmartTurnModel.load(default_model_path(args.cache_dir))
    fixtures = load_fixtures()
    model.probability(fixtures[0].pcm)  # warm-up: onnxruntime allocates on the first run
    scores = CachedScores(model)

    policies: dict[str, EndOfTurnPolicy | None] = {f"server_vad {SERVER_VAD_SILENCE_MS} ms": None}
    policies.update({f"semantic {name}": END_OF_TURN_BY_EAGERNESS[name] for name in ("low", "medium", "high")})
    results: dict[str, object] = {}
    per_fixture: dict[str, object] = {}
    header = (f"{'policy':<20} {'p50 ms':>7} {'p90 ms':>7} {'p50 ms*':>8} {'paused whole':>12} {'decisions':>9} "
              f"{'ms/decision':>11} {'% core':>7}")
    rows = []
    for name, policy in policies.items():
        summary, outcomes = evaluate(vad, scores, params_for(policy), fixtures)
        results[name] = {"policy": asdict(policy) if policy else {"silence_duration_ms": SERVER_VAD_SILENCE_MS},
                         **summary}
        per_fixture[name] = [{"fixture": o.fixture, "delay_ms": o.delay_ms, "cut": o.cut, "commits_ms": o.commits_ms}
                             for o in outcomes]
        rows.append(f"{name:<20} {summary['finished_delay_p50_ms']:>7.0f} {summary['finished_delay_p90_ms']:>7.0f} "
                    f"{summary['finished_delay_p50_ms_instant_model']:>8.0f} "
                    f"{summary['paused_whole_share']:>12.0%} {summary['decisions']:>9} "
                    f"{summary['decision_ms_p50']:>11.1f} {summary['model_core_percent']:>7.2f}")

    long_utterance = np.concatenate([f.pcm for f in fixtures[:4]])
    pacing = {
        "none": asyncio.run(pacing_lateness(None, long_utterance, off_loop=True)),
        "off_loop": asyncio.run(pacing_lateness(model, long_utterance, off_loop=True)),
        "inline": asyncio.run(pacing_lateness(model, long_utterance, off_loop=False)),
    }
    grid = sweep(vad, scores, fixtures) if args.sweep else None

    print(f"{len(fixtures)} fixtures ({sum(f.kind == 'finished' for f in fixtures)} finished, "
          f"{sum(f.kind == 'paused' for f in fixtures)} paused); delays after the end of speech, finished sentences")
    print(header)
    for row in rows:
        print(row)
    print("* the same decisions applied at once: the policy's own delay, without this machine's model time")
    for mode, figures in pacing.items():
        print(f"20 ms timer lateness, model {mode:<8}: p50 {figures['p50_ms']:.2f} ms  p99 {figures['p99_ms']:.2f} ms"
              f"  max {figures['max_ms']:.2f} ms")

    report = {
        "bench": "turn_taking",
        "command": "python tests/bench/turn_taking.py" + (" --sweep" if args.sweep else ""),
        "machine": machine(),
        "fixtures": len(fixtures),
        "results": results,
        "pacing_lateness_ms": pacing,
        "per_fixture": per_fixture,
        **({"sweep": grid} if grid is not None else {}),
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
