"""The labelled turn-taking fixtures (tests/fixtures/turns/manifest.json) agree with their audio.

The labels give the turn-taking figures (tests/bench/turn_taking.py): the end of speech, the pauses
and the words said by a time. They are checked against each other and against the audio itself:
its energy in 10 ms frames, against the loudest frame of the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

TURNS = Path(__file__).resolve().parent / "fixtures" / "turns"
MANIFEST = json.loads((TURNS / "manifest.json").read_text())
FRAME_MS = 10
# A frame is speech above 5% of the loudest frame's RMS (-26 dB), the level make_turns.py finds the
# recordings' speech by: their room noise, JFK's own pause included, stays under 4%; the pauses
# inserted in synthesized speech are digital zero.
SPEECH_LEVEL = 0.05
# How far a label may lie from the speech it bounds: quiet consonants at a sentence's or a pause's
# edge ("What", "half") are under SPEECH_LEVEL for up to 230 ms, and Festival speaks a phrase break
# of its own, 220-230 ms, before "and" in festival/paused_08 (the pause is longer than labelled).
EDGE_TOLERANCE_MS = 250
# Speech each aligned word holds in its own span; the shortest ("a" in librivox_0920) holds 40 ms.
WORD_SPEECH_MS = 30
# Labels are whole ms, rounded down from the sample where a pause starts (festival/paused_06_kal's
# words end 0.3 ms into the 10 ms frame its label starts).
LABEL_ROUNDING_MS = 1
PAUSED = [entry for entry in MANIFEST if entry["kind"] == "paused"]
ALIGNED = [entry for entry in MANIFEST if "word_ends_ms" in entry]


def label_errors(entry: dict) -> list[str]:
    """What is wrong with one fixture's labels: its length, its pause, its words' end times."""
    info = sf.info(TURNS / entry["file"])
    errors = []
    if (info.samplerate, info.channels) != (16_000, 1):
        errors.append(f"{info.samplerate} Hz, {info.channels} channels")
    if abs(info.frames * 1000 // info.samplerate - entry["speech_end_ms"]) > 1:
        errors.append(f"speech_end_ms {entry['speech_end_ms']} for {info.frames} samples")
    paused = entry["kind"] == "paused"
    if paused and not 0 < entry["pause_start_ms"] < entry["pause_end_ms"] < entry["speech_end_ms"]:
        errors.append("the pause does not lie inside the speech")
    if not paused and "pause_start_ms" in entry:
        errors.append("a finished sentence with a pause")
    ends = entry.get("word_ends_ms")
    if ends is not None:
        if len(ends) != len(entry["text"].replace(" … ", " ").split()):
            errors.append("one end time per word of the text")
        if ends != sorted(ends) or ends[-1] != entry["speech_end_ms"]:
            errors.append("word ends out of order or not ending the speech")
        if paused and any(entry["pause_start_ms"] < end <= entry["pause_end_ms"] for end in ends):
            errors.append("a word ends inside the pause")
    return errors


def speech_frames(entry: dict) -> np.ndarray:
    """Whether each 10 ms frame of the fixture is speech (frame i spans i*10 to i*10+10 ms)."""
    pcm, rate = sf.read(TURNS / entry["file"], dtype="float32")
    frame = rate * FRAME_MS // 1000
    rms = np.sqrt(np.mean(pcm[: pcm.size // frame * frame].reshape(-1, frame) ** 2, axis=1))
    return rms > SPEECH_LEVEL * rms.max()


def speech_ms(speech: np.ndarray, start_ms: int, end_ms: int) -> int:
    """The speech in the frames that lie wholly between the two times (ms from the file's start)."""
    first_frame = max(0, -(-start_ms // FRAME_MS))
    return int(speech[first_frame : end_ms // FRAME_MS].sum()) * FRAME_MS


def test_every_fixture_is_as_long_as_labelled_with_its_pause_and_word_times_inside() -> None:
    errors = {entry["file"]: label_errors(entry) for entry in MANIFEST}
    assert {file: found for file, found in errors.items() if found} == {}


def test_every_labelled_pause_is_silence_throughout() -> None:
    loud = {
        entry["file"]: speech_ms(speech_frames(entry), entry["pause_start_ms"] + LABEL_ROUNDING_MS, entry["pause_end_ms"])
        for entry in PAUSED
    }
    assert {file: ms for file, ms in loud.items() if ms} == {}


def test_speech_stops_and_resumes_within_250_ms_of_every_labelled_pause() -> None:
    unbounded = {}
    for entry in PAUSED:
        speech = speech_frames(entry)
        start, end = entry["pause_start_ms"], entry["pause_end_ms"]
        before = speech_ms(speech, start - EDGE_TOLERANCE_MS, start)
        after = speech_ms(speech, end, end + EDGE_TOLERANCE_MS)
        if not before or not after:
            unbounded[entry["file"]] = (before, after)
    assert unbounded == {}


def test_every_fixture_speaks_within_250_ms_of_its_start_and_its_labelled_end() -> None:
    unbounded = {}
    for entry in MANIFEST:
        speech = speech_frames(entry)
        first = speech_ms(speech, 0, EDGE_TOLERANCE_MS)
        last = speech_ms(speech, entry["speech_end_ms"] - EDGE_TOLERANCE_MS, entry["speech_end_ms"])
        if not first or not last:
            unbounded[entry["file"]] = (first, last)
    assert unbounded == {}


def test_every_aligned_word_is_speech_before_its_labelled_end() -> None:
    """Each word's span, from the word before's end to its own, holds speech: a word end moved
    into a pause (a pause's length not added to the words after it) leaves a word with none."""
    silent_words = {}
    for entry in ALIGNED:
        speech = speech_frames(entry)
        starts = [0, *entry["word_ends_ms"][:-1]]
        for index, (start, end) in enumerate(zip(starts, entry["word_ends_ms"], strict=True)):
            heard = speech_ms(speech, start, end)
            if heard < WORD_SPEECH_MS:
                silent_words[f"{entry['file']} word {index}"] = heard
    assert silent_words == {}


def test_every_family_has_finished_and_paused_sentences() -> None:
    kinds: dict[str, set[str]] = {}
    for entry in MANIFEST:
        kinds.setdefault(entry["family"], set()).add(entry["kind"])
    assert kinds == {family: {"finished", "paused"} for family in ("flite", "festival", "espeak-ng", "recorded")}
