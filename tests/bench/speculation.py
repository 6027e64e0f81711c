"""Where to start a speculative answer: hit rate and engine time thrown away, per candidate rule.

Run: .venv/bin/python tests/bench/speculation.py [--answer-engine-ms 1500] [--first-audio-ms 200 400]
     [--out tests/bench/results/speculation.json]

Each fixture of tests/fixtures/turns is fed as tests/bench/turn_taking.py feeds it (500 ms of
silence, the sentence, a long tail of silence, 20 ms chunks through the real silero VAD; semantic
VAD's checks scored by the real smart-turn model, each answer applied after as much audio as the
model took), for server VAD 500 ms and semantic VAD medium (the default table, no text judge), the latter also
with the model's answers applied at once (``semantic medium*``: its commits on a fast machine).
The detector reports every trailing silence (``SilenceStarted`` ... ``SpeechResumed`` or the
commit) and semantic VAD's checks; each candidate rule then says where a speculation would have
started in each silence, and the session's rules decide its fate: speech resuming discards it,
the commit uses it, at most ``MAX_PER_UTTERANCE`` start per utterance.

Rules: ``onset`` (the silence's first quiet 32 ms window: what the session does), ``silence N ms``
(the silence has lasted N ms), and for semantic VAD ``first check`` (the end-of-turn model's
first check, at 96 ms, once answered).

Per rule and mode, over finished and paused sentences apart:
- ``started``, ``used``, ``hit rate`` = used / started;
- ``discarded engine ms``: each discarded speculation ran from its start to the resumption, at most
  a whole answer's engine time (``--answer-engine-ms``: the dev model's ~1.5 s turn on this box);
  its ``share`` is of the engine time of the used answers (used x answer-engine-ms);
- ``>bound``: candidates not started because their utterance had had ``MAX_PER_UTTERANCE``;
- ``hidden ms`` (median over used ones): commit - start, the head start the model gets; the time
  to first audio it takes off the user's wait is min(hidden, the model's first audio), shown for
  each ``--first-audio-ms`` (200: the dev model; 400: the issue's emulated real model).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from harness import machine, write_report  # this folder: a script's is first on sys.path
from turn_taking import (
    CHUNK_MS,
    CHUNK_SAMPLES,
    LEAD_MS,
    SERVER_VAD_SILENCE_MS,
    CachedScores,
    Fixture,
    RecordedVad,
    load_turn_inputs,
)

from app.realtime.speculation import MAX_PER_UTTERANCE
from app.realtime.turn_taking import END_OF_TURN_BY_EAGERNESS
from media.detector_events import EndOfTurnCheck, SilenceStarted, SpeechResumed, SpeechStarted, UtteranceCommitted
from media.detector_params import EndOfTurnPolicy, TurnDetectionParams
from media.rates import SPEECH_RATE
from media.voice_activity_detector import VoiceActivityDetector

TAIL_MS = 4_000  # past medium's longest wait (3 s): every turn ends inside it
WINDOW_MS = 32


@dataclass
class Silence:
    start_ms: int  # the end of its first quiet window (where an onset speculation starts)
    end_ms: int | None = None
    committed: bool = False  # ended by the commit (else by resumed speech)
    first_check_ms: int | None = None  # semantic VAD: when its first check was answered


@dataclass
class Heard:
    """One fixture's utterances as the detector heard them: each a list of its silences."""

    fixture: Fixture
    utterances: list[list[Silence]] = field(default_factory=list)


def hear(vad: RecordedVad, scores: CachedScores, fixture: Fixture, policy: EndOfTurnPolicy | None,
         *, instant: bool = False) -> Heard:
    """Feed one fixture; the silences of each utterance, with how each ended. ``instant``: the
    end-of-turn model's answers apply at once (its own time not counted: a fast machine)."""
    stream = np.concatenate([np.zeros(LEAD_MS * SPEECH_RATE // 1000, np.float32), fixture.pcm,
                             np.zeros(TAIL_MS * SPEECH_RATE // 1000, np.float32)])
    params = TurnDetectionParams(silence_duration_ms=SERVER_VAD_SILENCE_MS, end_of_turn=policy, candidates=True)
    detector = VoiceActivityDetector(vad.for_fixture(fixture.name), params)
    heard = Heard(fixture)
    pending: list[tuple[int, int, float]] = []  # (chunks until applied, check id, probability)
    first_check: dict[int, Silence] = {}
    for start in range(0, stream.size, CHUNK_SAMPLES):
        position_ms = (start + CHUNK_SAMPLES) * 1000 // SPEECH_RATE
        events = detector.push(stream[start : start + CHUNK_SAMPLES])
        due = [answer for answer in pending if answer[0] <= 1]
        pending = [(chunks - 1, check, p) for chunks, check, p in pending if chunks > 1]
        for _, check_id, probability in due:
            silence = first_check.pop(check_id, None)
            if silence is not None and silence.end_ms is None:
                silence.first_check_ms = position_ms
            events += detector.decide(check_id, probability)
        for event in events:
            current = heard.utterances[-1] if heard.utterances else None
            if isinstance(event, SpeechStarted):
                heard.utterances.append([])
            elif isinstance(event, SilenceStarted) and current is not None:
                current.append(Silence(event.audio_end_ms))
            elif isinstance(event, SpeechResumed) and current:
                current[-1].end_ms = event.audio_ms
            elif isinstance(event, UtteranceCommitted) and current:
                if current[-1].end_ms is None:
                    current[-1].end_ms, current[-1].committed = event.audio_end_ms, True
            elif isinstance(event, EndOfTurnCheck) and event.sound:
                probability, elapsed = scores.score(fixture.name, event.pcm)
                if current and current[-1].end_ms is None and current[-1].first_check_ms is None \
                        and current[-1] not in first_check.values():
                    first_check[event.check_id] = current[-1]
                chunks = 1 if instant else max(1, math.ceil(elapsed * 1000 / CHUNK_MS))
                pending.append((chunks, event.check_id, probability))
    return heard


@dataclass(frozen=True)
class Rule:
    name: str
    after_ms: int | None = None  # silence N ms (None with first_check False: the onset)
    first_check: bool = False

    def start_ms(self, silence: Silence) -> int | None:
        """Where this rule starts a speculation in ``silence``; None: it ends first."""
        if self.first_check:
            start = silence.first_check_ms
        else:
            start = silence.start_ms + (self.after_ms - WINDOW_MS if self.after_ms else 0)
        end = silence.end_ms if silence.end_ms is not None else math.inf
        return start if start is not None and start < end else None


@dataclass
class Tally:
    started: int = 0
    used: int = 0
    over_bound: int = 0  # candidates past MAX_PER_UTTERANCE in their utterance: not started
    discarded_ms: float = 0.0
    hidden_ms: list[float] = field(default_factory=list)


def tally(heard: list[Heard], rule: Rule, answer_engine_ms: float) -> Tally:
    result = Tally()
    for fixture in heard:
        for silences in fixture.utterances:
            started = 0
            for silence in silences:
                start = rule.start_ms(silence)
                if start is None:
                    continue
                if started >= MAX_PER_UTTERANCE:
                    result.over_bound += 1
                    continue
                started += 1
                result.started += 1
                assert silence.end_ms is not None
                if silence.committed:
                    result.used += 1
                    result.hidden_ms.append(silence.end_ms - start)
                else:
                    result.discarded_ms += min(silence.end_ms - start, answer_engine_ms)
    return result


def summarise(t: Tally, answer_engine_ms: float, first_audio_ms: list[int]) -> dict[str, object]:
    used_engine_ms = t.used * answer_engine_ms
    summary: dict[str, object] = {
        "started": t.started,
        "used": t.used,
        "over_bound": t.over_bound,
        "hit_rate": round(t.used / t.started, 3) if t.started else None,
        "discarded_engine_ms": round(t.discarded_ms),
        "discarded_share_of_used": round(t.discarded_ms / used_engine_ms, 3) if used_engine_ms else None,
        "hidden_ms_p50": round(statistics.median(t.hidden_ms)) if t.hidden_ms else None,
    }
    for first_audio in first_audio_ms:
        taken = [min(hidden, first_audio) for hidden in t.hidden_ms]
        summary[f"first_audio_taken_ms_p50@{first_audio}"] = round(statistics.median(taken)) if taken else None
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "speculation.json")
    parser.add_argument("--answer-engine-ms", type=float, default=1500.0,
                        help="a whole answer's engine time: the most a discarded speculation can cost")
    parser.add_argument("--first-audio-ms", type=int, nargs="+", default=[200, 400],
                        help="models' times to first audio, for the first audio each rule takes off the wait")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "omni-rtc")
    args = parser.parse_args()

    vad, _, fixtures, scores = load_turn_inputs(args.cache_dir)
    semantic_rules = [Rule("onset"), Rule("silence 96 ms", 96), Rule("first check", first_check=True)]
    medium = END_OF_TURN_BY_EAGERNESS["medium"]
    modes: dict[str, tuple[EndOfTurnPolicy | None, bool, list[Rule]]] = {
        f"server_vad {SERVER_VAD_SILENCE_MS} ms": (None, False, [Rule("onset"), Rule("silence 96 ms", 96),
                                                                Rule("silence 160 ms", 160)]),
        "semantic_vad medium": (medium, False, semantic_rules),
        # The same decisions applied the moment they are asked for (the model's ~10 ms on a fast CPU).
        "semantic medium*": (medium, True, semantic_rules),
    }
    results: dict[str, object] = {}
    print(f"{len(fixtures)} fixtures; a discarded speculation costs at most {args.answer_engine_ms:.0f} ms of engine "
          f"time; at most {MAX_PER_UTTERANCE} per utterance")
    print(f"{'mode':<22} {'rule':<15} {'kind':<9} {'started':>7} {'used':>5} {'hit':>6} {'discarded ms':>12} "
          f"{'share':>6} {'hidden p50':>10} {'>bound':>6} " + " ".join(f"{'taken@' + str(f):>10}" for f in args.first_audio_ms))
    for mode, (policy, instant, rules) in modes.items():
        heard = [hear(vad, scores, fixture, policy, instant=instant) for fixture in fixtures]
        results[mode] = {}
        for rule in rules:
            per_kind = {}
            for kind in ("finished", "paused", "all"):
                chosen = [h for h in heard if kind in ("all", h.fixture.kind)]
                summary = summarise(tally(chosen, rule, args.answer_engine_ms), args.answer_engine_ms,
                                    args.first_audio_ms)
                per_kind[kind] = summary
                print(f"{mode:<22} {rule.name:<15} {kind:<9} {summary['started']:>7} {summary['used']:>5} "
                      f"{_cell(summary['hit_rate'], '.0%'):>6} {summary['discarded_engine_ms']:>12} "
                      f"{_cell(summary['discarded_share_of_used'], '.0%'):>6} {_cell(summary['hidden_ms_p50']):>10} {summary['over_bound']:>6} "
                      + " ".join(f"{_cell(summary[f'first_audio_taken_ms_p50@{f}']):>10}" for f in args.first_audio_ms),
                      flush=True)
            results[mode][rule.name] = per_kind
    print("* semantic VAD's decisions applied at once: its commits without this machine's model time")
    write_report(args.out, {
        "bench": "speculation",
        "command": "python tests/bench/speculation.py"
                   + (f" --answer-engine-ms {args.answer_engine_ms:g}" if args.answer_engine_ms != 1500 else ""),
        "machine": machine(),
        "answer_engine_ms": args.answer_engine_ms,
        "max_per_utterance": MAX_PER_UTTERANCE,
        "results": results,
    })


def _cell(value: object, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    main()
