"""The detector on real audio through the real VAD (silero), in 20 ms chunks like inbound WebRTC frames."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from media.detector_events import SpeechStarted, SpeechStopped, UtteranceCommitted
from media.detector_params import TurnDetectionParams
from media.vad import SileroVad
from media.voice_activity_detector import VoiceActivityDetector
from tests.speech import load_fixture, silence

TURNS = Path(__file__).resolve().parents[1] / "fixtures" / "turns"
MANIFEST = {entry["file"]: entry for entry in json.loads((TURNS / "manifest.json").read_text())}


def detect(silero: SileroVad, pcm: np.ndarray, params: TurnDetectionParams | None = None) -> list:
    detector = VoiceActivityDetector(silero, params or TurnDetectionParams())
    events = []
    for start in range(0, pcm.size, 320):
        events.extend(detector.push(pcm[start : start + 320]))
    return events


def test_utterance_then_silence_commits_once(silero: SileroVad) -> None:
    pcm = np.concatenate([silence(500), load_fixture("hello"), silence(1000)])
    events = detect(silero, pcm)
    assert [type(event) for event in events] == [SpeechStarted, SpeechStopped, UtteranceCommitted]
    commit = events[2]
    assert 150 <= commit.audio_start_ms <= 250  # onset near 500 ms, minus the 300 ms prefix
    assert commit.audio_end_ms > 500 + 1400  # after the 1.4 s of speech
    np.testing.assert_array_equal(commit.pcm, pcm[commit.audio_start_ms * 16 : commit.audio_end_ms * 16])


def test_cough_never_becomes_a_turn(silero: SileroVad) -> None:
    pcm = np.concatenate([silence(500), load_fixture("short_cough"), silence(1000)])
    assert detect(silero, pcm) == []


def test_a_short_phrase_said_in_bursts_after_a_turn_becomes_a_turn(silero: SileroVad) -> None:
    # "My address is twelve | Oak Street." in espeak-ng's en-gb-x-rp voice: server VAD commits in
    # the 900 ms pause, and the VAD, still in the state the first words left it, hears "Oak
    # Street." as three bursts of 100-220 ms with 32-64 ms stops between them.
    fixture = "espeak-ng/paused_07_en-gb-x-rp.wav"
    pcm, _ = sf.read(TURNS / fixture, dtype="float32")
    events = detect(silero, np.concatenate([silence(500), pcm, silence(1000)]))
    first, second = [event for event in events if isinstance(event, UtteranceCommitted)]
    pause_start, pause_end = (500 + MANIFEST[fixture][key] for key in ("pause_start_ms", "pause_end_ms"))
    assert pause_start < first.audio_end_ms < pause_end  # "My address is twelve" in the pause
    assert second.audio_start_ms < pause_end and second.audio_end_ms > 500 + MANIFEST[fixture]["speech_end_ms"]


def test_two_utterances_commit_twice(silero: SileroVad) -> None:
    pcm = np.concatenate([silence(300), load_fixture("hello"), silence(1000), load_fixture("weather"), silence(1000)])
    committed = [event for event in detect(silero, pcm) if isinstance(event, UtteranceCommitted)]
    assert len(committed) == 2
    assert committed[0].audio_end_ms <= committed[1].audio_start_ms


def test_long_silence_wait_holds_the_commit(silero: SileroVad) -> None:
    pcm = np.concatenate([silence(300), load_fixture("hello"), silence(1000)])
    events = detect(silero, pcm, TurnDetectionParams(silence_duration_ms=1500))
    assert [type(event) for event in events] == [SpeechStarted]


def test_detector_rejects_integer_pcm(silero: SileroVad) -> None:
    detector = VoiceActivityDetector(silero, TurnDetectionParams())
    with pytest.raises(ValueError, match="float"):
        detector.push(np.zeros(320, dtype=np.int16))


def test_chunk_sizes_do_not_change_the_result(silero: SileroVad) -> None:
    pcm = np.concatenate([silence(300), load_fixture("weather"), silence(800)])
    in_frames = detect(silero, pcm)
    detector = VoiceActivityDetector(silero, TurnDetectionParams())
    in_odd_chunks, start = [], 0
    for size in np.random.default_rng(0).integers(1, 2000, size=pcm.size):
        in_odd_chunks.extend(detector.push(pcm[start : start + size]))
        start += size
        if start >= pcm.size:
            break
    assert [type(event) for event in in_odd_chunks] == [SpeechStarted, SpeechStopped, UtteranceCommitted]
    assert in_odd_chunks[:2] == in_frames[:2]
    np.testing.assert_array_equal(in_odd_chunks[2].pcm, in_frames[2].pcm)
