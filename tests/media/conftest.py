from __future__ import annotations

import pytest

from media.vad import SileroVad


@pytest.fixture(scope="session")
def silero() -> SileroVad:
    return SileroVad.load()
