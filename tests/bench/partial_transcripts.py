"""Partial transcripts: when the first words show during a 5 s utterance, and what they cost the engine.

Run: .venv/bin/python tests/bench/partial_transcripts.py [--rounds 4] [--threads 1]
     [--model DIR] [--device cpu] [--out tests/bench/results/partial_transcripts.json]

One RealtimeSession per utterance (real silero VAD, server VAD with its 500 ms silence wait,
input transcription on, no answer: ``create_response`` false, so the engine does nothing else)
on one TransformersEngine process. Each says ``five_second_story.wav`` (5.00 s, espeak-ng) in
real time, 20 ms at a time as a WebRTC track delivers it, then silence until the transcription
has completed. Modes, alternated per round (the first round of each warms up and is not kept):

- on: partial transcripts on (the default).
- off: ``audio.input.transcription.partials`` false: the words come only after the commit.

Per utterance, from the moment its first sample was pushed (speech start): when the page first
shows words (the first transcription delta with a non-empty ``transcript``: a partial one, or
with partials off the final transcription's first), and its text; when a client that only
concatenates ``delta`` (LiveKit) first shows words; how many partial updates came before the
speech ended; the partials' outcomes and their engine seconds (``on_partial_transcript``: each
one's start to its end or cancel), beside the final transcription's (commit → ``.completed``:
the engine is otherwise idle). The dev model's words are random: they show when words come,
not what they say.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from harness import machine, write_report
from ttfa import add_model_options, checkpoint, model_name

from app.realtime.session_config import InputTranscription, SessionConfig, TurnDetection
from media.rates import SPEECH_RATE
from media.vad import SileroVad
from pipeline.local.transformers_engine import TransformersEngine
from tests.fakes import SessionHarness
from tests.speech import load_fixture, silence

REPO = Path(__file__).resolve().parents[2]
FIXTURE = "five_second_story"
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
MODES = ("on", "off")
PIECE_MS = 20  # what a WebRTC track delivers at a time
LEAD_SILENCE_MS = 300
TURN_GUARD_S = 600  # against hangs only


class TimedHarness(SessionHarness):
    """Notes when each event left the session (the loop's clock)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sent_at: list[float] = []
        super().__init__(*args, **kwargs)

    def _record(self, event: dict[str, Any]) -> None:
        self.sent_at.append(time.monotonic())
        super()._record(event)


async def say_in_real_time(h: SessionHarness, pcm: Any) -> tuple[float, float]:
    """Pushes ``pcm`` 20 ms at a time, each piece when its last sample would have been captured;
    returns when its first and its last piece were pushed."""
    loop = asyncio.get_running_loop()
    step = PIECE_MS * SPEECH_RATE // 1000
    started = loop.time()
    first_at = time.monotonic()
    for offset in range(0, pcm.size, step):
        await asyncio.sleep(max(0.0, started + (offset + step) / SPEECH_RATE - loop.time()))
        h.push(pcm[offset : offset + step])
    return first_at, time.monotonic()


async def utterance(engine: TransformersEngine, vad: SileroVad, partials: bool) -> dict[str, Any]:
    config = SessionConfig(
        turn_detection=TurnDetection(create_response=False),
        transcription=InputTranscription(model="bench", partials=partials),
    )
    h = TimedHarness(engine, vad, config)
    await h.session.start()
    try:
        h.push(silence(LEAD_SILENCE_MS))
        speech_start, speech_end = await say_in_real_time(h, load_fixture(FIXTURE))
        # Silence until the VAD commits (its 500 ms wait) and the transcription completes.
        async with asyncio.timeout(TURN_GUARD_S):
            while not h.of_type(COMPLETED):
                await say_in_real_time(h, silence(100))
    finally:
        await h.session.close()
    return summary(h, speech_start, speech_end)


def summary(h: TimedHarness, speech_start: float, speech_end: float) -> dict[str, Any]:
    def after_start_ms(at: float) -> float:
        return (at - speech_start) * 1000

    timed = list(zip(h.events, h.sent_at, strict=True))
    deltas = [(event, at) for event, at in timed if event["type"] == DELTA]
    shown = next(((event, at) for event, at in deltas if event["transcript"]), None)
    concatenated = next(((event, at) for event, at in deltas if event["delta"]), None)
    committed_at = next(at for event, at in timed if event["type"] == "input_audio_buffer.committed")
    completed_event, completed_at = next((event, at) for event, at in timed if event["type"] == COMPLETED)
    outcomes: dict[str, int] = {}
    for outcome, _ in h.partials:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return {
        "speech_ms": (speech_end - speech_start) * 1000,
        "first_words_shown_ms": None if shown is None else after_start_ms(shown[1]),
        "first_words_shown": None if shown is None else shown[0]["transcript"],
        "first_words_shown_partial": None if shown is None else shown[0]["partial"],
        "first_delta_text_ms": None if concatenated is None else after_start_ms(concatenated[1]),
        "partial_updates_before_speech_end": sum(1 for event, at in deltas if event["partial"] and at <= speech_end),
        "partial_updates": sum(1 for event, _ in deltas if event["partial"]),
        "partial_outcomes": outcomes,
        "partial_engine_s": sum(seconds for outcome, seconds in h.partials if outcome != "started"),
        "committed_ms": after_start_ms(committed_at),
        "final_transcription_s": completed_at - committed_at,
        "final_transcript": completed_event["transcript"],
    }


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engine = TransformersEngine(checkpoint(args), device=args.device, seed=0, threads=args.threads)
    await engine.start()
    vad = SileroVad.load()
    rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    try:
        for round_number in range(args.rounds + 1):
            for offset in range(len(MODES)):
                mode = MODES[(round_number + offset) % len(MODES)]
                row = await utterance(engine, vad, partials=mode == "on")
                if round_number > 0:  # the first round warms up
                    rows[mode].append(row)
                print(f"round {round_number} {mode}: first words at {row['first_words_shown_ms']:.0f} ms, "
                      f"{row['partial_updates_before_speech_end']} partial updates during the speech, "
                      f"partials {row['partial_engine_s']:.2f} engine s, final {row['final_transcription_s']:.2f} s",
                      flush=True)
    finally:
        await engine.close()
    result: dict[str, Any] = {}
    for mode, kept in rows.items():
        result[mode] = {
            "utterances": kept,
            "median_first_words_shown_ms": median(kept, "first_words_shown_ms"),
            "median_first_delta_text_ms": median(kept, "first_delta_text_ms"),
            "median_partial_updates_before_speech_end": median(kept, "partial_updates_before_speech_end"),
            "median_partial_engine_s": median(kept, "partial_engine_s"),
            "median_final_transcription_s": median(kept, "final_transcription_s"),
            "median_committed_ms": median(kept, "committed_ms"),
        }
    return result


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="kept utterances per mode (one more warms up)")
    add_model_options(parser, "partial_transcripts.json")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    results = asyncio.run(run(args))
    print(f"\n{FIXTURE}.wav (5.00 s) in real time, {args.rounds} utterances per mode after a warm-up; "
          f"{args.device}, {args.threads} thread(s); medians; times from the speech's start")
    header = (f"{'partials':>8} {'first words shown ms':>21} {'first delta text ms':>20} {'updates in speech':>18} "
              f"{'partials engine s':>18} {'final transcription s':>22} {'committed ms':>13}")
    print(header)
    print("-" * len(header))
    for mode in MODES:
        row = results[mode]
        print(f"{mode:>8} {ms(row['median_first_words_shown_ms']):>21} {ms(row['median_first_delta_text_ms']):>20} "
              f"{row['median_partial_updates_before_speech_end']:>18.0f} {row['median_partial_engine_s']:>18.2f} "
              f"{row['median_final_transcription_s']:>22.2f} {ms(row['median_committed_ms']):>13}")
    report = {
        "benchmark": "partial_transcripts",
        "command": " ".join([".venv/bin/python", "tests/bench/partial_transcripts.py", *sys.argv[1:]]),
        "model": model_name(args),
        "machine": machine(torch=torch.__version__, threads=args.threads, device=args.device),
        "settings": {"rounds": args.rounds, "fixture": FIXTURE, "piece_ms": PIECE_MS, "silence_duration_ms": 500},
        "modes": results,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
