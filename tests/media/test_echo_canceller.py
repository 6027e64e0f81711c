"""The echo canceller: the answer's echo out of the microphone, the user's speech kept."""

from __future__ import annotations

import numpy as np
import soundfile
import soxr

from media.echo_canceller import EchoCanceller
from media.pacing import FRAME_SAMPLES
from media.rates import WIRE_RATE
from media.vad import SileroVad
from tests.speech import FIXTURES, RATE, load_fixture

FRAME_MS = 20
INPUT_FRAME = RATE * FRAME_MS // 1000


def _recorded(name: str) -> np.ndarray:
    pcm, rate = soundfile.read(FIXTURES / "turns" / "arctic" / f"{name}.wav", dtype="float32")
    assert rate == RATE
    return pcm


def _answer() -> np.ndarray:
    """About 11 s of speech at 16 kHz: the espeak-ng stories, twice."""
    story = np.concatenate([load_fixture("five_second_story"), load_fixture("long_story")])
    return np.concatenate([story, story])


def _room(seconds: float) -> np.ndarray:
    """A speakerphone: 150 ms of acoustic path, -12 dB, a 200 ms exponential reverb."""
    rng = np.random.default_rng(5)
    taps = int(0.2 * RATE)
    tail = rng.standard_normal(taps) * np.exp(-np.arange(taps) / (0.2 * RATE / 6.9))
    response = np.zeros(int(0.15 * RATE) + taps)
    response[int(0.15 * RATE)] = 1.0
    response[int(0.15 * RATE):] += 0.3 * tail / np.sqrt(np.sum(tail ** 2))
    return (response / np.sqrt(np.sum(response ** 2)) * 10 ** (-12 / 20))[: int(seconds * RATE)]


def _call(answer16: np.ndarray, user: np.ndarray | None, user_at_s: float,
          network_ms: int) -> tuple[np.ndarray, np.ndarray, EchoCanceller]:
    """The microphone as the server receives it and as the canceller leaves it, frame by frame:
    each 20 ms the track sends a frame of the answer and the input of ``network_ms`` ago arrives."""
    echo = np.convolve(answer16, _room(0.4))[: answer16.size]
    network = network_ms * RATE // 1000
    mic = np.concatenate([np.zeros(network, np.float32), echo.astype(np.float32)])[: answer16.size]
    if user is not None:
        at = int(user_at_s * RATE)
        mic[at : at + user.size] += user[: mic.size - at]
    cleaned, canceller = _through_canceller(answer16, mic)
    return mic, cleaned, canceller


def _through_canceller(answer16: np.ndarray, mic: np.ndarray) -> tuple[np.ndarray, EchoCanceller]:
    """Each 20 ms: the track sends a frame of the answer, a frame of the microphone arrives."""
    answer48 = soxr.resample(answer16, RATE, WIRE_RATE)
    canceller = EchoCanceller()
    cleaned = []
    for index in range(answer16.size // INPUT_FRAME):
        sent = answer48[index * FRAME_SAMPLES : (index + 1) * FRAME_SAMPLES]
        canceller.played(np.clip(np.rint(sent * 32767), -32768, 32767).astype(np.int16), audio=True)
        cleaned.append(canceller.captured(mic[index * INPUT_FRAME : (index + 1) * INPUT_FRAME]))
    return np.concatenate(cleaned), canceller


def _speech_windows(vad: SileroVad, pcm: np.ndarray) -> np.ndarray:
    stream = vad.new_stream()
    return np.array([stream.probability(pcm[start : start + 512]) >= 0.5 for start in range(0, pcm.size - 511, 512)])


FOUND_BY_S = 3.0  # 2 s of the input's level against the played one, then three estimates agreeing


def test_the_answers_echo_is_found_and_is_then_not_speech_to_the_vad(silero):
    mic, cleaned, canceller = _call(_answer(), None, 0.0, network_ms=100)

    assert canceller.detector.present
    found = int(FOUND_BY_S * RATE) // 512
    assert _speech_windows(silero, mic)[found:].mean() > 0.5  # what the VAD heard without the canceller
    assert _speech_windows(silero, cleaned)[found:].mean() < 0.05
    assert canceller.removed_seconds > 0.5 * (mic.size / RATE - FOUND_BY_S)  # counted as echo suppressed


def test_without_an_echo_the_input_is_left_as_it_came(silero):
    answer = _answer()
    user = _recorded("finished_a0007") * 2.0
    mic = np.zeros(answer.size, np.float32)
    mic[6 * RATE : 6 * RATE + user.size] += user
    mic += np.random.default_rng(2).standard_normal(mic.size).astype(np.float32) * 10 ** (-60 / 20)  # a quiet room
    heard, canceller = _through_canceller(answer, mic)

    assert not canceller.detector.present
    as_sent = np.clip(np.rint(mic[: heard.size] * 32767), -32768, 32767) / 32767.0
    assert np.array_equal(heard, as_sent.astype(np.float32))  # the user's speech untouched


def test_the_user_talking_over_the_echo_is_still_heard(silero):
    user = _recorded("finished_a0007") * 2.0  # at about the answer's level before the echo path
    at_s = 6.0
    mic, cleaned, _ = _call(_answer(), user, at_s, network_ms=200)

    first, last = int(at_s * RATE) // 512, int(at_s * RATE + user.size) // 512
    alone = _speech_windows(silero, np.concatenate([np.zeros(int(at_s * RATE), np.float32), user]))[first:last]
    heard = _speech_windows(silero, cleaned)[first:last]
    assert heard[alone].mean() >= 0.7
    found = int(FOUND_BY_S * RATE) // 512
    assert _speech_windows(silero, cleaned)[found : first - 8].mean() < 0.05  # the echo before the user spoke


def test_input_comes_out_in_whole_frames():
    canceller = EchoCanceller()
    assert canceller.captured(np.zeros(100, np.float32)).size == 0
    assert canceller.captured(np.zeros(300, np.float32)).size == 320  # two 10 ms frames, 80 samples wait
    assert canceller.removed_seconds == 0.0  # nothing played, nothing counted
