"""The noise suppressor: stationary noise lowered, speech kept, any chunking the same."""

from __future__ import annotations

import numpy as np
import pytest

from media.noise_suppression import FRAME_SAMPLES, NoiseSuppressor
from media.vad import SileroVad
from tests.speech import RATE, load_fixture


def _level_dbfs(pcm: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(np.square(pcm, dtype=np.float64)) + 1e-20))


def _brown_noise(seconds: float, level_dbfs: float) -> np.ndarray:
    rng = np.random.default_rng(7)
    walk = np.cumsum(rng.standard_normal(int(seconds * RATE)))
    walk -= np.convolve(walk, np.ones(801) / 801, mode="same")  # no drift: the rumble stays stationary
    return (walk / np.std(walk) * 10 ** (level_dbfs / 20)).astype(np.float32)


def _speech_probabilities(vad: SileroVad, pcm: np.ndarray) -> np.ndarray:
    stream = vad.new_stream()
    return np.array([stream.probability(pcm[start : start + 512]) for start in range(0, pcm.size - 511, 512)])


@pytest.mark.parametrize(("kind", "at_least_db"), [("near_field", 10.0), ("far_field", 15.0)])
def test_stationary_noise_comes_out_quieter(kind, at_least_db):
    noise = _brown_noise(3.0, -30.0)
    cleaned = NoiseSuppressor(kind).process(noise)

    settled = slice(RATE, None)  # the suppressor learns the noise in its first few hundred ms
    assert _level_dbfs(noise[settled]) - _level_dbfs(cleaned[settled]) >= at_least_db


def test_far_field_suppresses_more_than_near_field():
    noise = _brown_noise(3.0, -30.0)
    near = NoiseSuppressor("near_field").process(noise)[RATE:]
    far = NoiseSuppressor("far_field").process(noise)[RATE:]
    assert _level_dbfs(far) < _level_dbfs(near) - 3.0


def test_the_vad_hears_the_noise_removed_and_the_speech_kept(silero):
    speech = load_fixture("weather")
    noise = _brown_noise(1.0 + speech.size / RATE, -32.0)
    noisy = noise.copy()
    noisy[RATE:] += speech
    cleaned = NoiseSuppressor("near_field").process(noisy)

    before = _speech_probabilities(silero, noisy)
    after = _speech_probabilities(silero, cleaned)
    noise_windows = slice(8, RATE // 512)  # the second of noise before the speech, once settled
    speech_windows = _speech_probabilities(silero, np.concatenate([np.zeros(RATE, np.float32), speech])) >= 0.5
    assert after[noise_windows].mean() < before[noise_windows].mean()
    assert np.mean(after[speech_windows] >= 0.5) >= 0.9  # the words are still speech to the VAD
    assert abs(_level_dbfs(cleaned[RATE:]) - _level_dbfs(speech)) < 3.0


def test_any_chunking_gives_the_same_frames():
    noise = _brown_noise(1.0, -30.0)
    whole = NoiseSuppressor("near_field").process(noise)
    suppressor = NoiseSuppressor("near_field")
    pieces = [suppressor.process(chunk) for chunk in np.array_split(noise, [7, 320, 333, 1000, 5000])]

    chunked = np.concatenate(pieces)
    assert whole.size == chunked.size == noise.size - noise.size % FRAME_SAMPLES
    assert np.array_equal(whole, chunked)
    assert pieces[0].size == 0  # 7 samples: not a whole frame yet
