"""How far the heard-text rule is from the words really spoken by the time an answer is cut.

Run: .venv/bin/python tests/bench/heard_text.py [--out tests/bench/results/heard_text.json]

Real weights cannot run here, so a real voice stands in for the Talker: espeak-ng speaks each
sentence below (spoken answers as Qwen3-Omni's system prompt asks for them: short, plain), and
each of its word prefixes; a prefix's audio length, less the silence espeak-ng ends every
utterance with, is when its last word ends in the whole sentence. At cuts of 10%..90% of the
sentence's audio, the tokens really heard (whole words spoken by then, counted in Qwen tokens)
are compared with:

- ``app.realtime.history.tokens_heard`` on a complete answer (the text's share of the audio);
- the same rule on an answer cut while generating (3.5 tokens a second);
- the rule before it: one token per 80 ms codec frame played.

Errors are in tokens (rule - truth): the table gives the mean absolute error, the worst, and
how often the rule is within 2 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from harness import machine, read_wav, write_report  # this folder: a script's is first on sys.path

from app.realtime.history import tokens_heard
from media.rates import VOICE_RATE
from pipeline.local.tokenizer import build_tokenizer

RESULTS = Path(__file__).resolve().parent / "results" / "heard_text.json"
SENTENCES = (
    "Sure, the weather in Paris is mild today, with a light breeze and some sun in the afternoon.",
    "I can help with that. Turn the oven to two hundred degrees and bake the bread for forty minutes.",
    "The train leaves at half past seven from platform three, so you have plenty of time for coffee.",
    "That is a great question! Plants turn sunlight, water and air into sugar, and they give off oxygen.",
    "Your meeting with Anna moved to Thursday at ten, and the room is on the second floor.",
    "Honestly, I would start with a short walk every morning, then add a little more each week.",
    "The capital of Australia is Canberra, not Sydney, which surprises a lot of people.",
    "Okay, I set a timer for fifteen minutes. I will let you know when it is done.",
    "Mount Everest is about eight thousand eight hundred and forty nine meters tall.",
    "If you mix blue and yellow paint you get green, and adding white makes it lighter.",
)
CUTS = tuple(fraction / 10 for fraction in range(1, 10))
CODEC_FRAME_SAMPLES = 1920
SILENCE = 1e-3  # below this a 16-bit sample of espeak-ng's output is its trailing silence


def spoken_samples(text: str, folder: Path) -> int:
    """espeak-ng's audio of ``text`` up to its last audible sample, at 24 kHz."""
    wav = folder / "say.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
    raw = folder / "say24.wav"
    subprocess.run(["sox", str(wav), "-r", str(VOICE_RATE), "-b", "16", "-c", "1", str(raw)], check=True)
    pcm = read_wav(raw)
    loud = np.flatnonzero(np.abs(pcm) > SILENCE)
    return int(loud[-1]) + 1 if loud.size else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    errors: dict[str, list[int]] = {"complete": [], "cut while generating": [], "one token per frame": []}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for sentence in SENTENCES:
            words = sentence.split(" ")
            total_tokens = len(tokenizer.encode(sentence))
            # (end of word k in samples, tokens of the first k words)
            ends = [(spoken_samples(" ".join(words[: k + 1]), folder), len(tokenizer.encode(" ".join(words[: k + 1]))))
                    for k in range(len(words))]
            total = ends[-1][0]
            for cut in CUTS:
                played = int(cut * total)
                truth = max((tokens for end, tokens in ends if end <= played), default=0)
                rules = {
                    "complete": tokens_heard(played, audio_samples=total, tokens=total_tokens, complete=True),
                    "cut while generating": tokens_heard(played, audio_samples=total, tokens=total_tokens, complete=False),
                    "one token per frame": min(played // CODEC_FRAME_SAMPLES, total_tokens),
                }
                for name, heard in rules.items():
                    errors[name].append(heard - truth)
    summary = {
        name: {
            "mean_abs_tokens": statistics.fmean(abs(error) for error in values),
            "worst_tokens": max(values, key=abs),
            "within_2_tokens": sum(abs(error) <= 2 for error in values) / len(values),
            "mean_tokens": statistics.fmean(values),
        }
        for name, values in errors.items()
    }
    print(f"{len(SENTENCES)} sentences x {len(CUTS)} cuts; errors in tokens (rule - words really spoken)")
    print(f"{'rule':<22} {'mean |error|':>12} {'mean':>6} {'worst':>6} {'within 2':>9}")
    for name, row in summary.items():
        print(f"{name:<22} {row['mean_abs_tokens']:>12.2f} {row['mean_tokens']:>6.2f} {row['worst_tokens']:>6d} "
              f"{row['within_2_tokens']:>9.0%}")
    write_report(args.out, {"machine": machine(), "sentences": len(SENTENCES), "cuts": list(CUTS), "rules": summary})


if __name__ == "__main__":
    main()
