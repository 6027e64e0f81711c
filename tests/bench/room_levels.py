"""Other voices in the room: the detector with and without the level gate, offline, on recorded voices.

Run: .venv/bin/python tests/bench/room_levels.py [--seconds 60] [--out tests/bench/results/room_levels.json]

The server's detector (silero VAD → ``media.speech_level.SpeechLevelGate`` → the commit buffer,
server VAD 500 ms) is fed 20 ms chunks of mixed audio as a call would, faster than real time.
Voices are the repository's recordings (CMU ARCTIC, CMU Sphinx, LibriVox, JFK; the 16 users are
the Flite ARCTIC-voice and recorded sentences of tests/fixtures/turns). Levels are RMS over the
whole signal. Rows:

- noise only, ``--seconds`` each, nobody at the microphone: one distant talker at -45 dBFS
  (sentences with 0.2-0.8 s pauses), babble of six such talkers at -35 and -45 dBFS, brown noise at
  -35 dBFS. ``starts``: speech_started; ``open s``: seconds the detector was inside an utterance.
- 16 sentences at the user's level (``--user-dbfs``, default -25 active level) with 1.5 s between
  them, clean and at 10 dB SNR over brown noise and babble. ``once``: sentences committed exactly
  once, ending within 1.45 s after the sentence; ``end ms``: the median of commit - sentence end
  (server VAD's 500 ms wait included); ``candidates``: candidate ends of turn (silences' first
  quiet windows), each the start of a speculative answer, thrown away when the speech resumes.
- a 68 s monologue (the recordings end to end, no pauses added) at -25 and -33 dBFS: ``starts``,
  how many turns it was cut into.

Each row with the rules off (silero alone) and on (the defaults of ``media.speech_level``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import soundfile as sf
from harness import machine, write_report  # this folder: a script's is first on sys.path

from media.detector_events import SilenceStarted, SpeechStarted, UtteranceCommitted
from media.detector_params import TurnDetectionParams
from media.rates import SPEECH_RATE
from media.speech_level import LevelRules
from media.vad import SileroVad
from media.voice_activity_detector import VoiceActivityDetector

TURNS = Path(__file__).resolve().parents[1] / "fixtures" / "turns"
CHUNK = 320  # 20 ms
OTHERS = sorted([*TURNS.glob("arctic/*.wav"), *TURNS.glob("cmu-sphinx/*.wav"), *TURNS.glob("librivox/*.wav"),
                 *TURNS.glob("jfk/*.wav"), *TURNS.glob("paused_*.wav")])
USERS = sorted(TURNS.glob("finished_*.wav"))[:16]
RULES = {"off": LevelRules(None, None, None), "on": LevelRules()}


def load(path: Path) -> np.ndarray:
    pcm, rate = sf.read(path, dtype="float32")
    assert rate == SPEECH_RATE, path
    return pcm


def rms_at(pcm: np.ndarray, dbfs: float) -> np.ndarray:
    return (pcm / np.sqrt(np.mean(np.square(pcm, dtype=np.float64))) * 10 ** (dbfs / 20)).astype(np.float32)


def active_at(pcm: np.ndarray, dbfs: float) -> np.ndarray:
    """Scaled so that its windows within 30 dB of its loudest have an RMS of ``dbfs``."""
    windows = pcm[: pcm.size // 512 * 512].reshape(-1, 512)
    levels = np.sqrt(np.mean(np.square(windows, dtype=np.float64), axis=1))
    active = levels[levels > levels.max() * 10 ** (-30 / 20)]
    return (pcm / np.sqrt(np.mean(np.square(active))) * 10 ** (dbfs / 20)).astype(np.float32)


def talker(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    while sum(part.size for part in parts) < seconds * SPEECH_RATE:
        parts.append(load(OTHERS[rng.integers(len(OTHERS))]))
        parts.append(np.zeros(int(rng.uniform(0.2, 0.8) * SPEECH_RATE), np.float32))
    return np.concatenate(parts)[: int(seconds * SPEECH_RATE)]


def babble(seconds: float) -> np.ndarray:
    return np.sum([talker(seconds, 10 + voice) for voice in range(6)], axis=0)


def brown(samples: int, seed: int = 0) -> np.ndarray:
    walk = np.cumsum(np.random.default_rng(seed).standard_normal(samples))
    walk -= np.convolve(walk, np.ones(1601) / 1601, mode="same")
    return (walk / np.std(walk)).astype(np.float32)


def detect(vad: SileroVad, pcm: np.ndarray, rules: LevelRules) -> tuple[int, float, list[int], int]:
    """speech_started count, seconds inside an utterance, each commit's end (samples), and the
    candidate ends of turn (each one a speculative answer's start)."""
    detector = VoiceActivityDetector(vad, TurnDetectionParams(levels=rules, candidates=True))
    starts, inside, ends, candidates = 0, 0, [], 0
    for start in range(0, pcm.size, CHUNK):
        for event in detector.push(pcm[start : start + CHUNK]):
            starts += isinstance(event, SpeechStarted)
            candidates += isinstance(event, SilenceStarted)
            if isinstance(event, UtteranceCommitted):
                ends.append(event.audio_end_ms * SPEECH_RATE // 1000)
        inside += detector.in_speech
    return starts, inside * CHUNK / SPEECH_RATE, ends, candidates


def sentences(user_dbfs: float) -> tuple[np.ndarray, list[tuple[int, int]]]:
    pieces, bounds, position = [np.zeros(SPEECH_RATE, np.float32)], [], SPEECH_RATE
    for path in USERS:
        sentence = active_at(load(path), user_dbfs)
        pieces += [sentence, np.zeros(int(1.5 * SPEECH_RATE), np.float32)]
        bounds.append((position, position + sentence.size))
        position += sentence.size + int(1.5 * SPEECH_RATE)
    return np.concatenate(pieces), bounds


def committed_once(ends: list[int], bounds: list[tuple[int, int]]) -> tuple[int, float | None]:
    once, delays = 0, []
    for start, end in bounds:
        inside = [commit for commit in ends if start < commit <= end + int(1.45 * SPEECH_RATE)]
        if len(inside) == 1:
            once += 1
            delays.append((inside[0] - end) * 1000 / SPEECH_RATE)
    return once, statistics.median(delays) if delays else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--user-dbfs", type=float, default=-25.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "room_levels.json")
    args = parser.parse_args()
    vad = SileroVad.load()
    rows: list[dict[str, object]] = []

    noises = {
        "distant talker -45 dBFS": rms_at(talker(args.seconds, 3), -45),
        "babble -35 dBFS": rms_at(babble(args.seconds), -35),
        "babble -45 dBFS": rms_at(babble(args.seconds), -45),
        "brown noise -35 dBFS": rms_at(brown(int(args.seconds * SPEECH_RATE)), -35),
    }
    for name, pcm in noises.items():
        for label, rules in RULES.items():
            starts, open_s, _, _ = detect(vad, pcm, rules)
            rows.append({"scenario": name, "rules": label, "starts": starts, "open_s": round(open_s, 1)})

    clean, bounds = sentences(args.user_dbfs)
    beds = {"clean": None, "brown 10 dB SNR": brown(clean.size, 1), "babble 10 dB SNR": babble(clean.size / SPEECH_RATE + 1)}
    for name, bed in beds.items():
        mix = clean if bed is None else clean + rms_at(bed[: clean.size], args.user_dbfs - 10)
        for label, rules in RULES.items():
            starts, _, ends, candidates = detect(vad, mix, rules)
            once, end_ms = committed_once(ends, bounds)
            rows.append({"scenario": f"16 sentences, {name}", "rules": label, "once": once, "starts": starts,
                         "end_ms": None if end_ms is None else round(end_ms), "candidates": candidates})

    monologue = np.concatenate([load(path) for path in OTHERS if "paused_" not in path.name])
    for level in (-25, -33):
        pcm = np.concatenate([np.zeros(SPEECH_RATE, np.float32), active_at(monologue, level),
                              np.zeros(SPEECH_RATE, np.float32)])
        for label, rules in RULES.items():
            starts, open_s, _, _ = detect(vad, pcm, rules)
            rows.append({"scenario": f"monologue {monologue.size / SPEECH_RATE:.0f} s at {level} dBFS", "rules": label,
                         "starts": starts, "open_s": round(open_s, 1)})

    print(f"{'scenario':40} {'rules':5} {'starts':>6} {'open s':>7} {'once':>5} {'end ms':>7} {'candidates':>10}")
    for row in rows:
        end_ms = row.get("end_ms", "")
        print(f"{row['scenario']:40} {row['rules']:5} {row.get('starts', ''):>6} {row.get('open_s', ''):>7} "
              f"{row.get('once', ''):>5} {'-' if end_ms is None else end_ms:>7} {row.get('candidates', ''):>10}")
    defaults = LevelRules()
    write_report(args.out, {"machine": machine(), "rules": {"floor_dbfs": defaults.floor_dbfs,
                 "over_background_db": defaults.over_background_db, "under_user_db": defaults.under_user_db},
                 "seconds": args.seconds, "user_dbfs": args.user_dbfs, "rows": rows})


if __name__ == "__main__":
    main()
