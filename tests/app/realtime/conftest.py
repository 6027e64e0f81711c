"""What the session tests that hear real speech share."""

from __future__ import annotations

import pytest

from media.vad import SileroVad


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    """Silero, loaded once for each module that asks for it."""
    return SileroVad.load()
