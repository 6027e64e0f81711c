"""Turn-taking over the labelled fixtures: server VAD (500 ms) beside semantic VAD at each eagerness.

Run: .venv/bin/python tests/bench/turn_taking.py [--out tests/bench/results/turn_taking.json]
     [--sweep]   (also prints a grid of candidate policies: how the eagerness table was chosen)

Each fixture of tests/fixtures/turns (manifest.json labels them) is fed as one session would hear
it: 500 ms of silence, the sentence, then silence 1 s past the longest wait, in 20 ms chunks through the real
VoiceActivityDetector (silero). An EndOfTurnCheck is scored by the real smart-turn model, and its
answer reaches the detector only after as much further audio as the model took to run (the
server runs it off the event loop while audio keeps arriving), so delays include the model's time.

Reported per policy: the commit delay after the end of speech on finished sentences (median,
p90: the commit's audio_end_ms minus where the speech ended), the share of paused sentences
committed before their speech ended (cut into two turns), and the model's cost: ms per decision and
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
import psutil
import soundfile as sf
from harness import machine, write_report  # this folder: a script's is first on sys.path

from app.realtime.turn_taking import END_OF_TURN_BY_EAGERNESS, EngineTextJudge
from media.detector_events import EndOfTurnCheck, UtteranceCommitted
from media.detector_params import EndOfTurnPolicy, TurnDetectionParams
from media.end_of_turn_model import SmartTurnModel, default_turn_model_path
from media.rates import SPEECH_RATE
from media.vad import SileroVad, SpeechModel, SpeechStream
from media.voice_activity_detector import VoiceActivityDetector
from pipeline.local.devmodel import ensure_dev_model
from pipeline.local.transformers_engine import TransformersEngine
from tests.words import complete_probability

TURNS = Path(__file__).resolve().parents[1] / "fixtures" / "turns"
CHUNK_SAMPLES = 320  # 20 ms, one inbound WebRTC frame after resampling
CHUNK_MS = 20
LEAD_MS = 500
SERVER_VAD_SILENCE_MS = 500
# The single-wait eagerness table (one wait, whatever the model's confidence), for comparison:
# "before <eagerness>" runs it in the same run as today's.
BEFORE_BY_EAGERNESS: dict[str, EndOfTurnPolicy] = {
    "low": EndOfTurnPolicy(candidate_ms=128, rescore_ms=0, threshold=0.8, max_wait_ms=2000),
    "medium": EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=0.75, max_wait_ms=1200),
    "high": EndOfTurnPolicy(candidate_ms=96, rescore_ms=320, threshold=0.5, max_wait_ms=800),
}
EAGERNESS = ("low", "medium", "high")
FAMILIES = ("flite", "festival", "espeak-ng", "recorded")
JUDGED_TRANSCRIPT_TOKENS = 16


@dataclass(frozen=True)
class Policy:
    name: str
    end_of_turn: EndOfTurnPolicy | None  # None: server VAD
    words: bool = False  # the stand-in text judge answers too


@dataclass
class Fixture:
    name: str
    family: str
    kind: str  # "finished" | "paused"
    pcm: np.ndarray
    text: str  # the whole sentence
    speech_end_ms: int
    pause_end_ms: int | None
    # Each word's end in the clip (ms), so that a check knows the words said by then: aligned for
    # the recordings (the manifest's), estimated for synthesized speech (``spread_words``).
    word_ends_ms: list[int]


@dataclass
class Outcome:
    fixture: str
    family: str
    kind: str
    commits_ms: list[int]  # audio_end_ms of each commit, in the fed stream
    speech_end_ms: int  # in the fed stream
    pause_end_ms: int | None
    decisions: int  # sound checks
    word_checks: int  # text-judge checks
    model_s: float  # the sound model's time over this fixture's decisions

    @property
    def delay_ms(self) -> int | None:
        """From the end of speech to the commit that ended the sentence: the last one (a commit
        before it split the sentence, ``split``, and is no answer to it)."""
        return self.commits_ms[-1] - self.speech_end_ms if self.commits_ms else None

    @property
    def split(self) -> bool:
        """Committed more than once: a sentence cut at a pause of its own ("Thanks, | that was
        really helpful.")."""
        return len(self.commits_ms) > 1

    @property
    def cut(self) -> bool:
        """A paused sentence committed before its speech ended: at the labelled pause, or at
        another the speaker made (the recordings have their own)."""
        return self.pause_end_ms is not None and bool(self.commits_ms) and self.commits_ms[0] < self.speech_end_ms


def load_fixtures() -> list[Fixture]:
    fixtures = []
    for entry in json.loads((TURNS / "manifest.json").read_text()):
        pcm, rate = sf.read(TURNS / entry["file"], dtype="float32")
        assert rate == SPEECH_RATE
        before, _, after = entry["text"].partition(" … ")
        if "word_ends_ms" in entry:
            word_ends = entry["word_ends_ms"]
        elif after:
            word_ends = (spread_words(before.split(), 0, entry["pause_start_ms"])
                         + spread_words(after.split(), entry["pause_end_ms"], entry["speech_end_ms"]))
        else:
            word_ends = spread_words(before.split(), 0, entry["speech_end_ms"])
        fixtures.append(Fixture(entry["file"], entry["family"], entry["kind"], pcm, f"{before} {after}".strip(),
                                entry["speech_end_ms"], entry.get("pause_end_ms"), word_ends))
    return fixtures


def spread_words(words: list[str], start_ms: int, end_ms: int) -> list[int]:
    """Where each word of a synthesized stretch of speech ends, estimated: the stretch shared out
    by the words' letters (the synthesizers' own word times are not kept in the manifest). The last
    word ends with the stretch, so during a pause every word before it has been said."""
    letters = np.cumsum([len(word) for word in words])
    return [start_ms + round((end_ms - start_ms) * count / letters[-1]) for count in letters]


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


class _Replay:
    """One fixture's silero probabilities: computed on its first run, replayed on the others."""

    def __init__(self, stream: SpeechStream, recorded: list[float]) -> None:
        self._stream = stream
        self._recorded = recorded
        self._index = 0

    def probability(self, window: np.ndarray) -> float:
        if self._index == len(self._recorded):
            self._recorded.append(self._stream.probability(window))
        self._index += 1
        return self._recorded[self._index - 1]

    def reset(self) -> None:
        raise NotImplementedError("the bench never resets a stream")


class RecordedVad:
    """Every policy hears a fixture's windows alike (the same audio, the same tail), so silero
    runs once per fixture and the grid costs only the policies."""

    def __init__(self, vad: SileroVad) -> None:
        self._vad = vad
        self._recorded: dict[str, list[float]] = {}

    def for_fixture(self, name: str) -> SpeechModel:
        recorded = self._recorded.setdefault(name, [])
        vad = self._vad

        class _Model:
            def new_stream(self) -> SpeechStream:
                return _Replay(vad.new_stream(), recorded)

        return _Model()


def load_turn_inputs(cache_dir: Path) -> tuple[RecordedVad, SmartTurnModel, list[Fixture], CachedScores]:
    """Silero (recorded per fixture), the end-of-turn model from ``cache_dir`` (warmed up), the
    fixtures, and the model's scores cached: what a turn-taking bench hears the fixtures with."""
    vad = RecordedVad(SileroVad.load())
    model = SmartTurnModel.load(default_turn_model_path(cache_dir))
    fixtures = load_fixtures()
    model.probability(fixtures[0].pcm)  # warm-up: onnxruntime allocates on the first run
    return vad, model, fixtures, CachedScores(model)


def words_said(fixture: Fixture, check_ms: int) -> str:
    """What an ASR would have written by ``check_ms`` (in the fed stream): the words ended by then,
    the whole sentence once all are. Pessimistic about a pause: the ASR closes the words it heard
    as a sentence ("We went to the park."), as ASR models punctuate what they get."""
    said = sum(end <= check_ms - LEAD_MS for end in fixture.word_ends_ms)
    if said == len(fixture.word_ends_ms):
        return fixture.text
    return " ".join(fixture.text.split()[:said]).rstrip(",;:") + "." if said else ""  # no word yet: unsure


def tail_ms(policies: list[Policy]) -> int:
    """Silence fed after each sentence: past the longest wait, so every turn ends inside it."""
    waits = [p.end_of_turn.longest_wait_ms for p in policies if p.end_of_turn is not None]
    return max([SERVER_VAD_SILENCE_MS, *waits]) + 1_000


def run_one(vad: RecordedVad, scores: CachedScores, policy: Policy, fixture: Fixture, model_times: list[float],
            *, tail: int, words_latency_ms: int, model_latency: bool = True) -> Outcome:
    lead = np.zeros(LEAD_MS * SPEECH_RATE // 1000, dtype=np.float32)
    stream = np.concatenate([lead, fixture.pcm, np.zeros(tail * SPEECH_RATE // 1000, dtype=np.float32)])
    detector = VoiceActivityDetector(vad.for_fixture(fixture.name), params_for(policy))
    commits: list[int] = []
    # Answers on their way: (chunks until applied, check id, probability, words?).
    pending: list[tuple[int, int, float | None, bool]] = []
    decisions = word_checks = 0
    model_s = 0.0
    for start in range(0, stream.size, CHUNK_SAMPLES):
        events = detector.push(stream[start : start + CHUNK_SAMPLES])
        due = [answer for answer in pending if answer[0] <= 1]
        pending = [(chunks - 1, *rest) for chunks, *rest in pending if chunks > 1]  # type: ignore[misc]
        for _, check_id, probability, words in due:
            events += (detector.decide_words(check_id, probability) if words
                       else detector.decide(check_id, probability or 0.0))
        position_ms = (start + CHUNK_SAMPLES) * 1000 // SPEECH_RATE
        for event in events:
            if isinstance(event, EndOfTurnCheck):
                answers: list[tuple[float, float, bool]] = []
                if event.sound:
                    probability, elapsed = scores.score(fixture.name, event.pcm)
                    model_times.append(elapsed)
                    model_s += elapsed
                    decisions += 1
                    answers.append((elapsed * 1000 if model_latency else 0.0, probability, False))
                if event.words:
                    word_checks += 1
                    answers.append((words_latency_ms if model_latency else 0.0,
                                    complete_probability(words_said(fixture, position_ms)), True))
                for latency_ms, answer, words in answers:
                    if latency_ms == 0:
                        applied = (detector.decide_words(event.check_id, answer) if words
                                   else detector.decide(event.check_id, answer))
                        commits += [e.audio_end_ms for e in applied if isinstance(e, UtteranceCommitted)]
                    else:
                        # Applied after the audio that arrives while it is computed (>= 1 chunk).
                        pending.append((max(1, math.ceil(latency_ms / CHUNK_MS)), event.check_id, answer, words))
            elif isinstance(event, UtteranceCommitted):
                commits.append(event.audio_end_ms)
    pause_end = None if fixture.pause_end_ms is None else LEAD_MS + fixture.pause_end_ms
    return Outcome(fixture.name, fixture.family, fixture.kind, commits, LEAD_MS + fixture.speech_end_ms, pause_end,
                   decisions, word_checks, model_s)


def summarise(outcomes: list[Outcome], model_times: list[float], audio_s: float) -> dict[str, object]:
    """``model_times``: seconds per sound decision, over the whole run (the cost of one decision
    does not depend on the family)."""
    delays = [o.delay_ms for o in outcomes if o.kind == "finished" and o.delay_ms is not None]
    paused = [o for o in outcomes if o.kind == "paused"]
    finished_missed = sum(1 for o in outcomes if o.kind == "finished" and not o.commits_ms)
    times_ms = np.array(model_times) * 1000 if model_times else np.zeros(1)
    decisions = sum(o.decisions for o in outcomes)
    return {
        "finished": len(delays) + finished_missed,
        "paused": len(paused),
        "finished_delay_p50_ms": float(np.percentile(delays, 50)),
        "finished_delay_p90_ms": float(np.percentile(delays, 90)),
        "finished_not_committed": finished_missed,
        "finished_split": sum(o.split for o in outcomes if o.kind == "finished"),
        "paused_cut_share": round(sum(o.cut for o in paused) / len(paused), 3),
        "paused_whole_share": round(1 - sum(o.cut for o in paused) / len(paused), 3),
        "decisions": decisions,
        "decisions_per_utterance": round(decisions / len(outcomes), 2),
        "word_checks_per_utterance": round(sum(o.word_checks for o in outcomes) / len(outcomes), 2),
        "decision_ms_p50": round(float(np.percentile(times_ms, 50)), 1) if model_times else 0.0,
        "decision_ms_p90": round(float(np.percentile(times_ms, 90)), 1) if model_times else 0.0,
        "model_core_percent": round(100 * sum(o.model_s for o in outcomes) / audio_s, 2),
    }


def evaluate(vad: RecordedVad, scores: CachedScores, policy: Policy, fixtures: list[Fixture], *, tail: int,
             words_latency_ms: int, timing: bool = True) -> tuple[dict[str, dict[str, object]], list[Outcome]]:
    """Per family (and "all"): the summary. ``timing`` False applies every answer at once and
    runs once (the decisions' accuracy, for tuning; with timing, answers land as late as the
    model and the text judge take, which can move a commit past a pause's end or into it)."""
    model_times: list[float] = []
    outcomes = [run_one(vad, scores, policy, fixture, model_times, tail=tail, words_latency_ms=words_latency_ms,
                        model_latency=timing) for fixture in fixtures]
    # The same decisions applied the moment they are asked for: the policy's own delay, which a
    # machine whose model answers in ~10 ms (pipecat's figure for a modern CPU) approaches.
    instant = outcomes if not timing else [
        run_one(vad, scores, policy, fixture, [], tail=tail, words_latency_ms=0, model_latency=False)
        for fixture in fixtures]
    summaries: dict[str, dict[str, object]] = {}
    for family in ("all", *FAMILIES):
        chosen = [i for i, f in enumerate(fixtures) if family in ("all", f.family)]
        if not chosen:
            continue
        audio_s = sum((LEAD_MS + tail) / 1000 + fixtures[i].pcm.size / SPEECH_RATE for i in chosen)
        summary = summarise([outcomes[i] for i in chosen], model_times, audio_s)
        instant_delays = [instant[i].delay_ms for i in chosen
                          if instant[i].kind == "finished" and instant[i].delay_ms is not None]
        summary["finished_delay_p50_ms_instant_model"] = float(np.percentile(instant_delays, 50))
        summary["finished_delay_p90_ms_instant_model"] = float(np.percentile(instant_delays, 90))
        summaries[family] = summary
    return summaries, outcomes


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


async def engine_judge_cost(model_dir: Path, utterances: list[np.ndarray], audio_s: float) -> dict[str, object]:
    """The real text judge (``EngineTextJudge``: Qwen3-Omni's ASR, then P(``<|im_end|>``)) on the
    dev model in its engine process (CPU, one thread, as tests run it): wall time and the engine
    process's CPU time per check. Its verdicts are noise; only the cost means anything."""
    # The dev Thinker stops at random, often after 2-3 tokens; a real transcript of these sentences
    # is ~10-15 tokens, so every transcript runs to 16 (the scoring pass generates nothing).
    engine = TransformersEngine(model_dir, device="cpu", seed=0, threads=1,
                                generation={"force_output_tokens": JUDGED_TRANSCRIPT_TOKENS})
    await engine.start()
    try:
        judge = EngineTextJudge(engine)
        await judge.judge(utterances[0])  # warm-up: first-call allocations
        process = psutil.Process(engine.pid)
        walls, cpus = [], []
        for pcm in utterances:
            before = process.cpu_times()
            started = time.perf_counter()
            await judge.judge(pcm)
            walls.append(time.perf_counter() - started)
            after = process.cpu_times()
            cpus.append(after.user + after.system - before.user - before.system)
    finally:
        await engine.close()
    wall_ms, cpu_ms = np.array(walls) * 1000, np.array(cpus) * 1000
    return {
        "checks": len(utterances),
        "wall_ms_p50": round(float(np.percentile(wall_ms, 50)), 1),
        "wall_ms_p90": round(float(np.percentile(wall_ms, 90)), 1),
        "engine_cpu_ms_p50": round(float(np.percentile(cpu_ms, 50)), 1),
        # The checks' engine CPU over the audio they judged (one check per utterance here).
        "engine_core_percent": round(100 * float(np.sum(cpus)) / audio_s, 2),
    }


def params_for(policy: Policy) -> TurnDetectionParams:
    return TurnDetectionParams(silence_duration_ms=SERVER_VAD_SILENCE_MS, end_of_turn=policy.end_of_turn,
                               judge_words=policy.words)


def policies() -> list[Policy]:
    """Server VAD; the single-wait table; today's table on the sound alone; and with the words."""
    chosen = [Policy(f"server_vad {SERVER_VAD_SILENCE_MS} ms", None)]
    chosen += [Policy(f"before {name}", BEFORE_BY_EAGERNESS[name]) for name in EAGERNESS]
    chosen += [Policy(f"sound {name}", END_OF_TURN_BY_EAGERNESS[name]) for name in EAGERNESS]
    chosen += [Policy(f"sound+words {name}", END_OF_TURN_BY_EAGERNESS[name], words=True) for name in EAGERNESS]
    return chosen


TUNING_FAMILIES = ("flite", "espeak-ng")  # the sweep sees only these; festival and the recordings are held out


def sweep(vad: RecordedVad, scores: CachedScores, fixtures: list[Fixture], tail: int) -> list[dict[str, object]]:
    """The grid today's table was chosen from, on the tuning families only, answers applied at once."""
    tuning = [f for f in fixtures if f.family in TUNING_FAMILIES]
    rows = []
    grid = [(threshold, confident_below, max_wait_ms, words, complete_at)
            for threshold in (0.5, 0.6, 0.7, 0.75, 0.8, 0.9)
            for confident_below in (0.0, 0.05, 0.1, 0.2, 0.3)
            for max_wait_ms in (800, 1200)
            for words, complete_at in ((False, None), (True, None), (True, 0.8))]
    for threshold, confident_below, max_wait_ms, words, complete_at in grid:
        end_of_turn = EndOfTurnPolicy(candidate_ms=96, rescore_ms=0, threshold=threshold,
                                      max_wait_ms=max_wait_ms, confident_below=confident_below,
                                      confident_wait_ms=3_000, words_complete_at=complete_at)
        policy = Policy("sweep", end_of_turn, words)
        summaries, _ = evaluate(vad, scores, policy, tuning, tail=tail, words_latency_ms=0, timing=False)
        rows.append({"policy": asdict(end_of_turn), "words": words, **summaries})
        print(f"threshold {threshold:.2f} confident<{confident_below:.2f} wait {max_wait_ms:5d} "
              f"words {words!s:5} commit>={complete_at}: " + "  ".join(
                  f"{family} p50 {summaries[family]['finished_delay_p50_ms']:5.0f} "
                  f"split {summaries[family]['finished_split']} "
                  f"p90 {summaries[family]['finished_delay_p90_ms']:5.0f} "
                  f"whole {summaries[family]['paused_whole_share']:.2f}" for family in TUNING_FAMILIES),
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "turn_taking.json")
    parser.add_argument("--sweep", action="store_true",
                        help="also print the grid the eagerness table was chosen from (tuning families only)")
    parser.add_argument("--accuracy-only", action="store_true",
                        help="apply every answer at once and skip the pacing figures: the decisions alone, fast")
    parser.add_argument("--words-latency-ms", type=int, default=0,
                        help="how long the text judge takes to answer (the stand-in: 0; see the README's estimate)")
    parser.add_argument("--engine-judge", type=int, metavar="N", default=0,
                        help="also time the real text judge on the dev model over N utterances (its engine process)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "omni-rtc")
    args = parser.parse_args()

    vad, model, fixtures, scores = load_turn_inputs(args.cache_dir)

    chosen = policies()
    tail = tail_ms(chosen)
    results: dict[str, object] = {}
    per_fixture: dict[str, object] = {}
    header = (f"{'policy':<22} {'family':<10} {'n':>5} {'p50 ms':>7} {'p90 ms':>7} {'p50 ms*':>8} {'split':>5} "
              f"{'paused whole':>12} "
              f"{'checks/utt':>10} {'words/utt':>9} {'ms/decision':>11} {'% core':>7}")
    rows = []
    for policy in chosen:
        summaries, outcomes = evaluate(vad, scores, policy, fixtures, tail=tail,
                                       words_latency_ms=args.words_latency_ms, timing=not args.accuracy_only)
        results[policy.name] = {
            "policy": asdict(policy.end_of_turn) if policy.end_of_turn else {"silence_duration_ms": SERVER_VAD_SILENCE_MS},
            "words": policy.words, "per_family": summaries,
        }
        per_fixture[policy.name] = [{"fixture": o.fixture, "delay_ms": o.delay_ms, "cut": o.cut, "split": o.split,
                                     "commits_ms": o.commits_ms} for o in outcomes]
        for family, summary in summaries.items():
            rows.append(f"{policy.name:<22} {family:<10} {summary['finished']:>2}+{summary['paused']:<2} "
                        f"{summary['finished_delay_p50_ms']:>7.0f} {summary['finished_delay_p90_ms']:>7.0f} "
                        f"{summary['finished_delay_p50_ms_instant_model']:>8.0f} {summary['finished_split']:>5} "
                        f"{summary['paused_whole_share']:>12.0%} {summary['decisions_per_utterance']:>10.2f} "
                        f"{summary['word_checks_per_utterance']:>9.2f} "
                        f"{summary['decision_ms_p50']:>11.1f} {summary['model_core_percent']:>7.2f}")

    pacing = None
    if not args.accuracy_only:
        long_utterance = np.concatenate([f.pcm for f in fixtures[:4]])
        pacing = {
            "none": asyncio.run(pacing_lateness(None, long_utterance, off_loop=True)),
            "off_loop": asyncio.run(pacing_lateness(model, long_utterance, off_loop=True)),
            "inline": asyncio.run(pacing_lateness(model, long_utterance, off_loop=False)),
        }
    grid = sweep(vad, scores, fixtures, tail) if args.sweep else None
    judge_cost = None
    if args.engine_judge:
        # Each utterance as its first check sees it: the whole sentence and 96 ms of silence.
        judged = fixtures[:: max(1, len(fixtures) // args.engine_judge)][: args.engine_judge]
        utterances = [np.concatenate([f.pcm, np.zeros(96 * SPEECH_RATE // 1000, np.float32)]) for f in judged]
        judge_cost = asyncio.run(engine_judge_cost(ensure_dev_model(args.cache_dir), utterances,
                                                   sum(u.size for u in utterances) / SPEECH_RATE))

    counts = {family: sum(f.family == family for f in fixtures) for family in FAMILIES}
    print(f"{len(fixtures)} fixtures ({', '.join(f'{family} {n}' for family, n in counts.items())}); "
          f"n = finished+paused; delays after the end of speech, finished sentences; text judge: the stand-in "
          f"(tests/words.py) on the words said so far, answering after {args.words_latency_ms} ms")
    print(header)
    for row in rows:
        print(row)
    print("* the same decisions applied at once: the policy's own delay, without this machine's model time"
          + ("  (--accuracy-only: every column is that)" if args.accuracy_only else ""))
    for mode, figures in (pacing or {}).items():
        print(f"20 ms timer lateness, model {mode:<8}: p50 {figures['p50_ms']:.2f} ms  p99 {figures['p99_ms']:.2f} ms"
              f"  max {figures['max_ms']:.2f} ms")
    if judge_cost is not None:
        print(f"text judge on the dev model (ASR + P(<|im_end|>), engine process, 1 thread), {judge_cost['checks']} "
              f"checks: wall p50 {judge_cost['wall_ms_p50']} ms, p90 {judge_cost['wall_ms_p90']} ms; engine CPU p50 "
              f"{judge_cost['engine_cpu_ms_p50']} ms per check, {judge_cost['engine_core_percent']}% of a core over "
              f"the audio judged")

    flags = [flag for flag, on in (("--sweep", args.sweep), ("--accuracy-only", args.accuracy_only)) if on]
    if args.engine_judge:
        flags.append(f"--engine-judge {args.engine_judge}")
    if args.words_latency_ms:
        flags.append(f"--words-latency-ms {args.words_latency_ms}")
    report = {
        "bench": "turn_taking",
        "command": " ".join(["python tests/bench/turn_taking.py", *flags]),
        "machine": machine(),
        "fixtures": counts,
        "words_latency_ms": args.words_latency_ms,
        "results": results,
        "pacing_lateness_ms": pacing,
        "engine_judge": judge_cost,
        "per_fixture": per_fixture,
        **({"sweep": grid} if grid is not None else {}),
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
