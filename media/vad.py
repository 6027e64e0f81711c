"""Silero VAD (v6) through onnxruntime: one loaded model, one small state per stream.

The ONNX file ships inside the ``silero-vad`` wheel. It is located without importing
the ``silero_vad`` package, whose ``__init__`` imports torch (seconds and hundreds of
MB we do not need: the model runs on onnxruntime and numpy only).

Silero v5/v6 is stateful: each call takes 512 new samples at 16 kHz *preceded by the
last 64 samples of the previous call* (its context) plus an LSTM state of shape
[2, 1, 128], and returns a speech probability and the next state. ``VadStream`` keeps
that context and state for one audio stream, exactly like silero's own ``OnnxWrapper``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from media.rates import SPEECH_RATE

if TYPE_CHECKING:
    import onnxruntime

WINDOW_SAMPLES = 512  # 32 ms at 16 kHz: the only window size silero v5+ accepts at 16 kHz
CONTEXT_SAMPLES = 64  # samples of the previous window the model sees before each window
_STATE_SHAPE = (2, 1, 128)
# Windows run once at load: onnxruntime's first runs allocate and set up its kernels (the first
# window ~1 ms of CPU, later ones ~0.2 ms, one thread), which the first call's windows paid.
WARM_UP_WINDOWS = 4


class SpeechStream(Protocol):
    """Speech probabilities for one continuous 16 kHz stream, one window at a time."""

    def probability(self, window: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class SpeechModel(Protocol):
    """A loaded VAD model shared by every stream; what turn detection and the session need of it.

    The session core takes this, not :class:`SileroVad`, so that importing it loads no ONNX runtime.
    """

    def new_stream(self) -> SpeechStream: ...


def silero_model_path() -> Path:
    """The ``silero_vad.onnx`` (opset 16) shipped in the installed silero-vad wheel."""
    spec = importlib.util.find_spec("silero_vad")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise RuntimeError(f"silero-vad is installed but {path} is missing")
    return path


class SileroVad:
    """The loaded model; share one per process between all streams (it holds no stream state).
    Loading runs a few windows, so that the first call's first windows pay no first-run costs."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self._session = session
        self._sample_rate = np.array(SPEECH_RATE, dtype=np.int64)

    @classmethod
    def load(cls, model_path: str | Path | None = None) -> SileroVad:
        # Imported here: the session core and turn detection import this module for its
        # protocol and constants and must not load onnxruntime (~60 MB) by doing so.
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # One window costs well under a millisecond single-threaded; more threads only
        # add wake-up overhead and compete with the engine for cores.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            str(model_path or silero_model_path()),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        vad = cls(session)
        vad.warm_up()
        return vad

    def warm_up(self) -> None:
        """Run a few windows of quiet noise through a throwaway stream (``load`` does)."""
        stream = self.new_stream()
        noise = np.random.default_rng(0).standard_normal(WARM_UP_WINDOWS * WINDOW_SAMPLES).astype(np.float32) * 0.01
        for window in noise.reshape(WARM_UP_WINDOWS, WINDOW_SAMPLES):
            stream.probability(window)

    def new_stream(self) -> VadStream:
        return VadStream(self)

    def _run(self, samples: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        probability, next_state = self._session.run(
            None, {"input": samples[np.newaxis, :], "state": state, "sr": self._sample_rate}
        )
        return float(probability[0, 0]), next_state


class VadStream:
    """Speech probabilities for one continuous 16 kHz stream, one 512-sample window at a time."""

    def __init__(self, vad: SileroVad) -> None:
        self._vad = vad
        self._input = np.zeros(CONTEXT_SAMPLES + WINDOW_SAMPLES, dtype=np.float32)
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)

    def probability(self, window: np.ndarray) -> float:
        """Probability in [0, 1] that ``window`` (512 float32 samples in [-1, 1]) is speech."""
        if window.shape != (WINDOW_SAMPLES,):
            raise ValueError(f"a VAD window is {WINDOW_SAMPLES} mono samples, got shape {window.shape}")
        # _input[:64] already holds the last 64 samples of the previous window (zeros at first).
        self._input[CONTEXT_SAMPLES:] = window
        probability, self._state = self._vad._run(self._input, self._state)
        self._input[:CONTEXT_SAMPLES] = self._input[-CONTEXT_SAMPLES:]
        return probability

    def reset(self) -> None:
        """Forget the stream's history, as if the next window started a new stream."""
        self._input[:] = 0.0
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
