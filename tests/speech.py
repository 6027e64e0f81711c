"""The speech fixtures as tests feed them: float32 mono PCM at 16 kHz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RATE = 16_000


def load_fixture(name: str) -> np.ndarray:
    """``tests/fixtures/{name}.wav`` (espeak-ng speech, made by make_fixtures.py)."""
    pcm, rate = soundfile.read(FIXTURES / f"{name}.wav", dtype="float32")
    assert rate == RATE and pcm.ndim == 1
    return pcm


def silence(ms: int) -> np.ndarray:
    return np.zeros(ms * RATE // 1000, dtype=np.float32)


def tone(ms: int, amplitude: float = 0.3) -> np.ndarray:
    """A 220 Hz tone: what the energy VAD of the session tests hears as speech."""
    t = np.arange(ms * RATE // 1000) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
