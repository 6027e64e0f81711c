"""The labelled turn-taking fixtures (tests/fixtures/turns/manifest.json) agree with their audio."""

from __future__ import annotations

import json
from pathlib import Path

import soundfile as sf

TURNS = Path(__file__).resolve().parent / "fixtures" / "turns"
MANIFEST = json.loads((TURNS / "manifest.json").read_text())


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


def test_every_fixture_is_as_long_as_labelled_with_its_pause_and_word_times_inside() -> None:
    errors = {entry["file"]: label_errors(entry) for entry in MANIFEST}
    assert {file: found for file, found in errors.items() if found} == {}


def test_every_family_has_finished_and_paused_sentences() -> None:
    kinds: dict[str, set[str]] = {}
    for entry in MANIFEST:
        kinds.setdefault(entry["family"], set()).add(entry["kind"])
    assert kinds == {family: {"finished", "paused"} for family in ("flite", "festival", "espeak-ng", "recorded")}
