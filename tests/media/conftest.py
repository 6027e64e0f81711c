from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from media.vad import SileroVad

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def load_fixture(name: str) -> np.ndarray:
    """A speech fixture as float32 16 kHz mono."""
    pcm, rate = sf.read(FIXTURES / f"{name}.wav", dtype="float32")
    assert rate == 16_000 and pcm.ndim == 1
    return pcm


def silence(ms: int) -> np.ndarray:
    return np.zeros(16 * ms, dtype=np.float32)


@pytest.fixture(scope="session")
def silero() -> SileroVad:
    return SileroVad.load()
