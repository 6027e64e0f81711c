from __future__ import annotations

import numpy as np
import pytest

from media.vad import WINDOW_SAMPLES, SileroVad, VadStream, silero_model_path
from tests.speech import load_fixture, silence


def probabilities(stream: VadStream, pcm: np.ndarray) -> np.ndarray:
    windows = pcm[: pcm.size - pcm.size % WINDOW_SAMPLES].reshape(-1, WINDOW_SAMPLES)
    return np.array([stream.probability(window) for window in windows])


def test_speech_gets_high_probabilities(silero: SileroVad) -> None:
    # 512 ms of silence (16 windows) lead in, then "Hello, can you hear me?".
    probs = probabilities(silero.new_stream(), np.concatenate([silence(512), load_fixture("hello")]))
    speech = probs[16:]
    assert speech.max() > 0.95
    assert np.mean(speech > 0.5) > 0.7  # the rest is the pause at the comma and word edges


def test_silence_gets_low_probabilities(silero: SileroVad) -> None:
    probs = probabilities(silero.new_stream(), silence(2000))
    assert probs.max() < 0.1


def test_cough_is_not_speech(silero: SileroVad) -> None:
    probs = probabilities(silero.new_stream(), np.concatenate([load_fixture("short_cough"), silence(500)]))
    assert probs.max() < 0.5


def test_interleaved_streams_equal_separate_streams(silero: SileroVad) -> None:
    hello, weather = load_fixture("hello"), load_fixture("weather")
    n = min(hello.size, weather.size) // WINDOW_SAMPLES
    separate_a = probabilities(silero.new_stream(), hello)[:n]
    separate_b = probabilities(silero.new_stream(), weather)[:n]

    stream_a, stream_b = silero.new_stream(), silero.new_stream()
    interleaved_a, interleaved_b = [], []
    for i in range(n):
        interleaved_a.append(stream_a.probability(hello[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES]))
        interleaved_b.append(stream_b.probability(weather[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES]))

    np.testing.assert_array_equal(interleaved_a, separate_a)
    np.testing.assert_array_equal(interleaved_b, separate_b)


def test_reset_starts_the_stream_afresh(silero: SileroVad) -> None:
    hello = load_fixture("hello")
    stream = silero.new_stream()
    probabilities(stream, load_fixture("weather"))
    stream.reset()
    np.testing.assert_array_equal(probabilities(stream, hello), probabilities(silero.new_stream(), hello))


def test_matches_silero_reference_wrapper(silero: SileroVad) -> None:
    """Same probabilities as silero-vad's own OnnxWrapper (context + state handling)."""
    import torch  # silero's wrapper runs on torch tensors
    from silero_vad.utils_vad import OnnxWrapper

    torch.set_num_threads(1)

    reference = OnnxWrapper(str(silero_model_path()), force_onnx_cpu=True)
    pcm = np.concatenate([silence(300), load_fixture("weather"), silence(300)])
    windows = pcm[: pcm.size - pcm.size % WINDOW_SAMPLES].reshape(-1, WINDOW_SAMPLES)
    expected = [float(reference(torch.from_numpy(window.copy()), 16_000)) for window in windows]
    np.testing.assert_allclose(probabilities(silero.new_stream(), pcm), expected, atol=1e-6)


def test_wrong_window_size_is_rejected(silero: SileroVad) -> None:
    with pytest.raises(ValueError, match="512"):
        silero.new_stream().probability(np.zeros(320, dtype=np.float32))
