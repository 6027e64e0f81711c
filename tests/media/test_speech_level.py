"""Other voices in the room: the level gate in front of the detector, on recorded voices."""

from __future__ import annotations

import numpy as np
import soundfile

from media.detector_events import SpeechStarted, UtteranceCommitted
from media.detector_params import TurnDetectionParams
from media.speech_level import LevelRules, SpeechLevelGate
from media.vad import SileroVad
from media.voice_activity_detector import VoiceActivityDetector
from tests.speech import FIXTURES, RATE

TURNS = FIXTURES / "turns"
OFF = LevelRules(None, None, None)


def _recorded(path: str) -> np.ndarray:
    pcm, rate = soundfile.read(TURNS / path, dtype="float32")
    assert rate == RATE
    return pcm


def _at_dbfs(pcm: np.ndarray, dbfs: float) -> np.ndarray:
    return (pcm / np.sqrt(np.mean(np.square(pcm))) * 10 ** (dbfs / 20)).astype(np.float32)


def _talker(seconds: float, seed: int) -> np.ndarray:
    """One voice reading on, recorded sentences with short pauses."""
    names = ["arctic/finished_a0001.wav", "arctic/finished_a0007.wav", "arctic/finished_a0009.wav",
             "cmu-sphinx/cards_001.wav", "cmu-sphinx/goforward.wav", "jfk/jfk.wav"]
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    while sum(part.size for part in parts) < seconds * RATE:
        parts.append(_recorded(names[rng.integers(len(names))]))
        parts.append(np.zeros(int(rng.uniform(0.2, 0.8) * RATE), np.float32))
    return np.concatenate(parts)[: int(seconds * RATE)]


def _babble(seconds: float) -> np.ndarray:
    return np.sum([_talker(seconds, seed) for seed in range(10, 16)], axis=0)


def _run(silero: SileroVad, pcm: np.ndarray, rules: LevelRules) -> tuple[int, int, float]:
    """Speech starts, commits, and the share of the time the detector was in an utterance."""
    detector = VoiceActivityDetector(silero, TurnDetectionParams(levels=rules))
    starts = commits = in_speech = 0
    for start in range(0, pcm.size, 320):
        for event in detector.push(pcm[start : start + 320]):
            starts += isinstance(event, SpeechStarted)
            commits += isinstance(event, UtteranceCommitted)
        in_speech += detector.in_speech
    return starts, commits, in_speech / (pcm.size / 320)


def test_a_distant_talker_starts_at_most_a_turn_a_minute_the_user_at_the_microphone_does(silero):
    talker = _talker(60.0, seed=3)
    assert _run(silero, _at_dbfs(talker, -45.0), OFF)[0] >= 10  # what silero alone hears
    assert _run(silero, _at_dbfs(talker, -45.0), LevelRules())[0] <= 1
    assert _run(silero, _at_dbfs(talker, -25.0), LevelRules())[0] >= 10


def test_babble_does_not_hold_the_detector_open(silero):
    babble = _at_dbfs(_babble(40.0), -35.0)
    assert _run(silero, babble, OFF)[2] > 0.9
    assert _run(silero, babble, LevelRules())[2] < 0.5


def test_a_sentence_over_babble_is_committed_as_its_own_turn(silero):
    babble = _at_dbfs(_babble(24.0), -35.0)
    mix = babble.copy()
    sentence = _at_dbfs(_recorded("arctic/finished_a0007.wav"), -25.0)
    at = 12 * RATE  # once the room's level is known
    mix[at : at + sentence.size] += sentence

    def sentence_committed(rules: LevelRules) -> bool:
        detector = VoiceActivityDetector(silero, TurnDetectionParams(levels=rules))
        ends = []
        for start in range(0, mix.size, 320):
            ends += [event.audio_end_ms for event in detector.push(mix[start : start + 320])
                     if isinstance(event, UtteranceCommitted)]
        sentence_end_ms = (at + sentence.size) * 1000 // RATE
        return any(sentence_end_ms <= end <= sentence_end_ms + 1000 for end in ends)

    assert sentence_committed(LevelRules())


def test_a_voice_well_below_the_users_own_is_not_theirs():
    gate = SpeechLevelGate()
    rules = LevelRules(floor_dbfs=None, over_background_db=None, under_user_db=15.0)
    rng = np.random.default_rng(1)
    user = _at_dbfs(rng.standard_normal(512), -20.0)
    quiet = _at_dbfs(rng.standard_normal(512), -38.0)
    assert gate.admit(quiet, 0.9, rules, threshold=0.5, in_speech=False) == 0.9  # the user's level unknown yet
    for _ in range(40):  # a second and more of the user's speech
        gate.admit(user, 0.9, rules, threshold=0.5, in_speech=True)
        gate.heard_user(user)
    assert gate.user_dbfs is not None and abs(gate.user_dbfs + 20.0) < 0.5
    for _ in range(3):  # past the level's hold
        admitted = gate.admit(quiet, 0.9, rules, threshold=0.5, in_speech=False)
    assert admitted == 0.0
    assert gate.admit(quiet, 0.3, rules, threshold=0.5, in_speech=False) == 0.3  # not speech: left as it is


def _brown(seconds: float, seed: int) -> np.ndarray:
    """Brown noise (amplitude 1/f, high-passed at 20 Hz): steady, and no speech to the VAD."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    spectrum = rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1)
    f = np.maximum(np.fft.rfftfreq(n, 1 / RATE), 1.0)
    return np.fft.irfft(spectrum / f / (1 + (20 / f) ** 4), n).astype(np.float32)


def _at_active_dbfs(pcm: np.ndarray, dbfs: float) -> np.ndarray:
    """Scaled so that its 20 ms frames within 30 dB of the loudest average ``dbfs``."""
    frames = pcm[: pcm.size // 320 * 320].reshape(-1, 320)
    power = np.mean(np.square(frames, dtype=np.float64), axis=1)
    active = power[power >= power.max() * 1e-3]
    return (pcm / np.sqrt(np.mean(active)) * 10 ** (dbfs / 20)).astype(np.float32)


def test_short_sentences_10_db_over_steady_noise_are_each_committed_once(silero):
    names = ["cmu-sphinx/goforward.wav", "cmu-sphinx/cards_001.wav", "cmu-sphinx/cards_005.wav",
             "arctic/finished_a0001.wav"]
    gap, lead = int(2.2 * RATE), 9 * RATE  # the noise alone first: the room's level is known
    pieces, ends, position = [np.zeros(lead, np.float32)], [], lead
    for name in names:
        sentence = _at_active_dbfs(_recorded(name), -20.0)
        pieces += [sentence, np.zeros(gap, np.float32)]
        position += sentence.size
        ends.append(position * 1000 // RATE)
        position += gap
    speech = np.concatenate(pieces)
    mix = speech + _at_dbfs(_brown(speech.size / RATE, seed=1), -30.0)
    detector = VoiceActivityDetector(silero, TurnDetectionParams(levels=LevelRules()))
    commits = []
    for start in range(0, mix.size, 320):
        commits += [event.audio_end_ms for event in detector.push(mix[start : start + 320])
                    if isinstance(event, UtteranceCommitted)]
    per_sentence = [sum(end - 200 <= commit <= end + 1450 for commit in commits) for end in ends]
    assert per_sentence == [1] * len(names), (commits, ends)
