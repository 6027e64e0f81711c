"""End-of-turn model: has the speaker finished, judging by the sound of the utterance?

The model is smart-turn v3.2 (Daily, BSD-2-Clause), an 8.7 MB ONNX classifier on a Whisper-tiny
encoder. It ships inside the ``pipecat-ai`` 1.14.0 wheel on PyPI; ``scripts/fetch_turn_model.py``
copies it out at install time into the cache directory (``TURN_MODEL_FILE``), checked against
``TURN_MODEL_SHA256``. Nothing is downloaded at run time.

Input format, learned from pipecat's ``local_smart_turn_v3.py`` and ``_whisper_features.py``
(our own code below): the utterance's last 8 s of 16 kHz mono float audio, zero-padded *at the
front* to exactly 8 s (128,000 samples); the padded waveform normalised to zero mean and unit
variance; Whisper's log-mel spectrogram of it (25 ms Hann window, 10 ms hop, 80 Slaney mel
bands from 0 to 8 kHz, log10 floored 8 below the maximum, then (x + 4) / 4), 80 x 800 frames;
input ``input_features`` [1, 80, 800]; output the probability [1, 1] that the turn is complete.

One ``SmartTurnModel`` per process, shared by every session: it holds no per-stream state, and
onnxruntime's ``run`` may be called from several threads at once.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from media.rates import SPEECH_RATE

if TYPE_CHECKING:
    import onnxruntime

logger = logging.getLogger(__name__)

TURN_MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
TURN_MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
# Where the file sits inside the pipecat-ai wheel, and which wheel: the install script reads these.
TURN_MODEL_WHEEL = "pipecat-ai==1.14.0"
TURN_MODEL_WHEEL_PATH = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"

WINDOW_SECONDS = 8  # the model sees the last 8 s of the utterance
WINDOW_SAMPLES = WINDOW_SECONDS * SPEECH_RATE
_N_FFT = 400  # 25 ms at 16 kHz
_HOP = 160  # 10 ms
_N_MELS = 80
_LOG_FLOOR_SPAN = 8.0  # Whisper keeps 8 decades (80 dB) below the loudest bin
_VARIANCE_EPS = 1e-7
# One decision runs at load: the first one paid numpy's FFT import and plans and onnxruntime's
# first-run set-up, ~12 ms of CPU over the ~70 ms a decision takes (one thread, this 2-core box).
_WARM_UP_SECONDS = 1


class EndOfTurnModel(Protocol):
    """What turn detection needs of an end-of-turn model; the session core takes this, no ONNX."""

    def probability(self, pcm: np.ndarray) -> float:
        """P(the speaker has finished) for an utterance: 16 kHz mono float32, trailing silence included."""
        ...


def default_turn_model_path(cache_dir: Path) -> Path:
    return cache_dir / TURN_MODEL_FILE


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa's default, Whisper's): linear to 1 kHz, logarithmic above."""
    mel = 3.0 * hz / 200.0
    above = hz >= 1000.0
    mel[above] = 15.0 + np.log(hz[above] / 1000.0) * (27.0 / np.log(6.4))
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    above = mel >= 15.0
    hz[above] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[above] - 15.0))
    return hz


def _mel_filterbank() -> np.ndarray:
    """[80, 201] triangular filters, area-normalised (Slaney), over the rFFT bins of a 400-point FFT."""
    fft_hz = np.linspace(0.0, SPEECH_RATE / 2, _N_FFT // 2 + 1)
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([SPEECH_RATE / 2]))[0],
                                      _N_MELS + 2))
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (fft_hz[None, :] - lower) / (centre - lower)
    falling = (upper - fft_hz[None, :]) / (upper - centre)
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (upper - lower))


_MEL_FILTERS = _mel_filterbank()
_HANN = np.hanning(_N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def log_mel_features(window: np.ndarray) -> np.ndarray:
    """Whisper log-mel features [80, 800] of exactly 8 s of 16 kHz audio (see the module docstring)."""
    if window.shape != (WINDOW_SAMPLES,):
        raise ValueError(f"expected {WINDOW_SAMPLES} samples, got shape {window.shape}")
    x = window.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + _VARIANCE_EPS)
    padded = np.pad(x.astype(np.float64), _N_FFT // 2, mode="reflect")  # centred frames
    frames = np.lib.stride_tricks.sliding_window_view(padded, _N_FFT)[::_HOP]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # [801, 201]
    mel = np.log10(np.maximum(_MEL_FILTERS @ power.T, 1e-10))[:, :-1]  # Whisper drops the last frame
    mel = np.maximum(mel, mel.max() - _LOG_FLOOR_SPAN)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def last_window(pcm: np.ndarray) -> np.ndarray:
    """The last 8 s of ``pcm``, zero-padded at the front when shorter (silence before the speech)."""
    pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
    if pcm.size >= WINDOW_SAMPLES:
        return pcm[-WINDOW_SAMPLES:]
    return np.concatenate([np.zeros(WINDOW_SAMPLES - pcm.size, dtype=np.float32), pcm])


class SmartTurnModel:
    """smart-turn v3.2 through onnxruntime; load once per process and share. Loading runs one
    decision, so that the first session's first check pays no first-call costs."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self._session = session

    @classmethod
    def load(cls, path: Path) -> SmartTurnModel:
        """Load and verify the model file; raises ``FileNotFoundError`` or ``ValueError`` (wrong checksum)."""
        if not path.is_file():
            raise FileNotFoundError(f"end-of-turn model {path} is missing (make install fetches it from {TURN_MODEL_WHEEL})")
        digest = file_sha256(path)
        if digest != TURN_MODEL_SHA256:
            raise ValueError(f"end-of-turn model {path} has sha256 {digest}, expected {TURN_MODEL_SHA256}")
        import onnxruntime  # here, not at module level: the session core imports this module's protocol

        options = onnxruntime.SessionOptions()
        # One decision is ~10^8 FLOPs; a single thread keeps it off the engine's cores and the
        # latency measured in tests/bench/turn_taking.py.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        model = cls(session)
        model.warm_up()
        return model

    def warm_up(self) -> None:
        """One decision on a second of quiet noise, thrown away (``load`` does)."""
        self.probability(np.random.default_rng(0).standard_normal(_WARM_UP_SECONDS * SPEECH_RATE).astype(np.float32) * 0.01)

    def probability(self, pcm: np.ndarray) -> float:
        features = log_mel_features(last_window(pcm))[np.newaxis]
        (output,) = self._session.run(None, {"input_features": features})
        return float(np.asarray(output).reshape(-1)[0])
