"""What input audio transcription costs the answer: its time to first audio, on and off.

Run: .venv/bin/python tests/bench/transcription.py [--rounds 8] [--answer-tokens 16] [--threads 1]
     [--model DIR] [--device cpu] [--out tests/bench/results/transcription.json]

Three RealtimeSessions (real silero VAD, a virtual speaker) share one TransformersEngine process.
Each round, each session says ``hello.wav`` and then ``weather.wav``, whose answer is measured;
the history is bounded to one past turn, so every measured answer has the same prompt. Modes:

- off: no transcription (the baseline).
- on_after_transcript: transcription on; "weather" is said once the transcript of "hello" has
  come. This is a conversation: the user listens to the answer, which plays in real time for
  far longer than transcribing a few seconds of speech takes, so the engine is idle again when
  the user speaks next.
- on_at_once: transcription on; "weather" is said as soon as the answer to "hello" has been
  generated, while the transcription of "hello" is still queued (worst case on the FIFO
  engine: the answer waits for that transcription).

Per measured answer: commit → first audio chunk handed to the output (``response.done``
latency less the VAD's silence wait) and the engine's queue wait; per transcription: commit →
``.completed`` (on the FIFO engine it runs after the answer). Answers are forced to
``--answer-tokens`` Thinker tokens (random weights rarely stop, ``force_output_tokens``, which
also holds back a transcription's EOS that long) with 3 codec frames per token; transcriptions
are bounded by 16 + 10 tokens per second of audio, greedy. Rounds rotate the order of the modes
so that load from other jobs falls on all alike; the first round warms up and is not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from harness import machine, write_report
from ttfa import add_model_options, checkpoint, model_name

from app.realtime.session_config import InputTranscription, SessionConfig
from app.realtime.turn_taking import ECHO_TAIL_MS
from media.vad import SileroVad
from pipeline.conversation import HistoryLimits
from pipeline.local.transformers_engine import TransformersEngine
from tests.fakes import SessionHarness
from tests.speech import load_fixture, silence

REPO = Path(__file__).resolve().parents[2]
COMPLETED = "conversation.item.input_audio_transcription.completed"
TURN_GUARD_S = 600  # against hangs only
MODES = ("off", "on_after_transcript", "on_at_once")
FIXTURES = ("hello", "weather")


class TimedHarness(SessionHarness):
    """Notes when each commit and each completed transcription left the session (the loop's clock)."""

    def __init__(self, *args: Any) -> None:
        self.committed_at: dict[str, float] = {}
        self.completed_at: dict[str, float] = {}
        super().__init__(*args)

    def _record(self, event: dict[str, Any]) -> None:
        if event["type"] == "input_audio_buffer.committed":
            self.committed_at[event["item_id"]] = time.monotonic()
        elif event["type"] == COMPLETED:
            self.completed_at[event["item_id"]] = time.monotonic()
        super()._record(event)


class BenchSession:
    """One session on the shared engine, its turns said one by one."""

    def __init__(self, engine: TransformersEngine, vad: SileroVad, transcribe: bool, answer_tokens: int) -> None:
        config = SessionConfig(max_output_tokens=answer_tokens, history=HistoryLimits(max_turns=1))
        if transcribe:
            config = dataclasses.replace(config, transcription=InputTranscription(model="bench"))
        self.h = TimedHarness(engine, vad, config)
        self.turns = 0
        self.measured: list[int] = []  # indexes of the answers that count

    async def say(self, *, measured: bool) -> None:
        """One utterance; returns once its answer has been generated and played out."""
        self.h.push(load_fixture(FIXTURES[self.turns % 2]))
        self.h.push(silence(800))
        self.turns += 1
        await self.h.turn_done(self.turns, timeout_s=TURN_GUARD_S)
        self.h.push(silence(ECHO_TAIL_MS + 200))
        if measured:
            self.measured.append(self.turns - 1)

    async def transcribed(self) -> None:
        """Waits until every utterance so far has its transcript: the engine is idle again."""
        await self.h.until(COMPLETED, self.turns, timeout_s=TURN_GUARD_S)

    def summary(self, mode: str) -> dict:
        h = self.h
        answers = []
        for done in h.of_type("response.done"):
            latency = done["latency"]
            answers.append({
                "commit_to_first_audio_ms": latency["end_of_speech_to_first_audio_ms"] - latency["silence_wait_ms"],
                "queue_wait_ms": latency["queue_wait_ms"],
                "engine_first_audio_ms": latency["engine_first_audio_ms"],
                "input_tokens": done["response"]["usage"]["input_tokens"],
            })
        transcriptions = [
            {
                "commit_to_completed_ms": (h.completed_at[e["item_id"]] - h.committed_at[e["item_id"]]) * 1000,
                "output_tokens": e["usage"]["output_tokens"],
            }
            for e in h.of_type(COMPLETED)
        ]
        measured = [answers[index] for index in self.measured]
        return {
            "mode": mode,
            "answers": answers,
            "measured_answers": self.measured,
            "transcriptions": transcriptions,
            "median_commit_to_first_audio_ms": statistics.median(a["commit_to_first_audio_ms"] for a in measured),
            "median_queue_wait_ms": statistics.median(a["queue_wait_ms"] for a in measured),
            "median_transcription_ms": statistics.median(t["commit_to_completed_ms"] for t in transcriptions)
            if transcriptions else None,
        }


async def run(args: argparse.Namespace) -> dict:
    engine = TransformersEngine(
        checkpoint(args), device=args.device, seed=0, threads=args.threads,
        generation={"force_output_tokens": args.answer_tokens, "max_audio_frames": 3 * args.answer_tokens},
    )
    await engine.start()
    vad = SileroVad.load()
    sessions = {
        "off": BenchSession(engine, vad, False, args.answer_tokens),
        "on_after_transcript": BenchSession(engine, vad, True, args.answer_tokens),
        "on_at_once": BenchSession(engine, vad, True, args.answer_tokens),
    }
    try:
        for conversation in sessions.values():
            await conversation.h.session.start()
        # Each round, in each session: "hello", then the measured "weather". The history is
        # bounded to one past turn, so every measured answer has the same prompt (hello, its
        # answer, weather) in every mode. Rounds rotate the order of the modes, so load from
        # other jobs and the engine's state after the previous turn fall on all alike; every
        # mode starts with the engine idle. The first round warms up and is not measured.
        for round_number in range(args.rounds):
            measured = round_number > 0
            for offset in range(len(MODES)):
                mode = MODES[(round_number + offset) % len(MODES)]
                conversation = sessions[mode]
                await conversation.say(measured=False)
                if mode == "on_after_transcript":
                    await conversation.transcribed()
                # on_at_once: said while the first transcription is still queued.
                await conversation.say(measured=measured)
                if mode != "off":
                    await conversation.transcribed()
        return {mode: conversation.summary(mode) for mode, conversation in sessions.items()}
    finally:
        for conversation in sessions.values():
            await conversation.h.session.close()
        await engine.close()


def measured_ttfa(summary: dict) -> list[float]:
    """Commit → first audio of the measured answers, in round order."""
    return [summary["answers"][index]["commit_to_first_audio_ms"] for index in summary["measured_answers"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of turns; the first warms up")
    parser.add_argument("--answer-tokens", type=int, default=16)
    add_model_options(parser, "transcription.json")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first round warms up)")

    results = asyncio.run(run(args))
    print(f"\n{args.rounds - 1} measured rounds (after one warm-up), answers of {args.answer_tokens} tokens; "
          f"{args.device}, {args.threads} thread(s); medians in ms; paired: per round, against off's answer")
    header = (f"{'mode':>20} {'commit→first audio':>19} {'paired Δ ms':>12} {'paired ×':>9} {'queue wait':>11} "
              f"{'transcription':>14}")
    print(header)
    print("-" * len(header))
    ttfa = {mode: measured_ttfa(results[mode]) for mode in MODES}
    ratios = {}
    for mode in MODES:
        row = results[mode]
        # Same round, same prompt: the pairs cancel most of the load that other jobs put on the machine.
        delta = statistics.median(on - off for on, off in zip(ttfa[mode], ttfa["off"], strict=True))
        ratio = statistics.median(on / off for on, off in zip(ttfa[mode], ttfa["off"], strict=True))
        row["paired_median_delta_ms"], row["paired_median_ratio"] = delta, ratio
        ratios[f"ttfa_{mode}_over_off_paired_median"] = ratio
        transcription = "-" if row["median_transcription_ms"] is None else f"{row['median_transcription_ms']:.0f}"
        print(f"{mode:>20} {row['median_commit_to_first_audio_ms']:>19.0f} {delta:>12.0f} {ratio:>9.2f} "
              f"{row['median_queue_wait_ms']:>11.0f} {transcription:>14}")

    report = {
        "benchmark": "transcription",
        "command": " ".join([".venv/bin/python", "tests/bench/transcription.py", *sys.argv[1:]]),
        "model": model_name(args),
        "machine": machine(torch=torch.__version__, threads=args.threads, device=args.device),
        "settings": {"rounds": args.rounds, "answer_tokens": args.answer_tokens, "frames_per_token": 3},
        "sessions": results,
        "ratios": ratios,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
