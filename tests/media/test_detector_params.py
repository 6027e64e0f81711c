"""A turn detector's parameters and end-of-turn policy refuse nonsense."""

from __future__ import annotations

import pytest

from media.detector_params import EndOfTurnPolicy, TurnDetectionParams


@pytest.mark.parametrize(
    "kwargs",
    [{"threshold": 1.0}, {"threshold": 0.0}, {"silence_duration_ms": -1}, {"min_speech_ms": 500, "max_utterance_ms": 500}],
)
def test_invalid_params_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        TurnDetectionParams(**kwargs)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="candidate_ms"):
        EndOfTurnPolicy(candidate_ms=500, rescore_ms=0, threshold=0.5, max_wait_ms=300)
    with pytest.raises(ValueError, match="threshold"):
        EndOfTurnPolicy(candidate_ms=100, rescore_ms=0, threshold=0.0, max_wait_ms=300)
