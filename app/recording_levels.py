"""Each side's level on the session's clock, as a recording's ``timeline.json`` holds it (``levels``).

A :class:`LevelTrack` takes one side's audio chunk by chunk, each where ``AudioPlacement`` put it,
and forgets what a cut removed; :func:`levels_json` gives both sides' level (RMS, dBFS, whole dB)
per :data:`STEP_MS` step from the session's start, a step with nothing placed in it at
:data:`FLOOR_DB`. Only the recording's writer thread uses them.

Size: a step a side per 50 ms, an hour 72,000 integers a side (about 290 KB of JSON each); a
longer session's step widens by 50 ms at a time so that a side never holds more than
:data:`MAX_STEPS`. In memory a track keeps a sum per :data:`GRAIN_MS`: 800 bytes a second, an
hour 2.9 MB a side.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

STEP_MS = 50
# Silence, and anything quieter: below what the lanes draw (-70 dBFS and up) and below a quiet
# room after noise suppression (about -60), so that a step at the floor reads as nothing heard.
FLOOR_DB = -90
MAX_STEPS = 72_000  # an hour of 50 ms steps
# Energy is summed per 10 ms on the session's clock: five to a step, and fine enough that a cut
# inside a grain keeps its share of that grain's energy before the cut (at most 10 ms misplaced).
GRAIN_MS = 10
_GRAINS_PER_STEP = STEP_MS // GRAIN_MS


class LevelTrack:
    """One side's energy per :data:`GRAIN_MS` on the session's clock, at ``rate`` samples a second."""

    def __init__(self, rate: int) -> None:
        if rate * GRAIN_MS % 1000:
            raise ValueError(f"a {GRAIN_MS} ms grain is not whole samples at {rate} Hz")
        self.rate = rate
        self._grain = rate * GRAIN_MS // 1000  # samples
        self._energy = np.zeros(0, dtype=np.float64)  # per grain: the sum of its samples' squares
        self._grains = 0  # those in use

    def add(self, start_s: float, pcm: np.ndarray) -> None:
        """``pcm`` plays from ``start_s`` on the session's clock; what falls before 0 is not counted."""
        first = round(start_s * self.rate)
        grains = (first + np.arange(pcm.size, dtype=np.int64)) // self._grain
        heard = grains >= 0
        if not heard.any():
            return
        grains = grains[heard]
        squares = np.square(pcm[heard], dtype=np.float64)
        low, high = int(grains[0]), int(grains[-1]) + 1
        self._reserve(high)
        self._energy[low:high] += np.bincount(grains - low, weights=squares, minlength=high - low)
        self._grains = max(self._grains, high)

    def cut(self, at_s: float) -> None:
        """Nothing placed from ``at_s`` on plays: its energy goes (the grain holding ``at_s`` keeps
        its share before it)."""
        sample = max(0, round(at_s * self.rate))  # as AudioPlacement.cut counts it
        grain, into = divmod(sample, self._grain)
        if grain >= self._grains:
            return
        self._energy[grain] *= into / self._grain
        self._energy[grain + 1:self._grains] = 0.0

    @property
    def extent_ms(self) -> int:
        """Where the last grain holding audio ends."""
        return self._grains * GRAIN_MS

    def levels(self, steps: int, grains_per_step: int) -> list[int]:
        """The level of each of ``steps`` steps of ``grains_per_step`` grains, in whole dBFS."""
        energy = np.zeros(steps * grains_per_step, dtype=np.float64)
        kept = min(energy.size, self._grains)
        energy[:kept] = self._energy[:kept]
        mean = energy.reshape(steps, grains_per_step).sum(axis=1) / (grains_per_step * self._grain)
        with np.errstate(divide="ignore"):
            db = 10 * np.log10(mean)
        return np.clip(np.round(db), FLOOR_DB, 0).astype(int).tolist()

    def _reserve(self, grains: int) -> None:
        if grains > self._energy.size:
            grown = np.zeros(max(grains, 2 * self._energy.size), dtype=np.float64)
            grown[:self._energy.size] = self._energy
            self._energy = grown


def levels_json(heard: LevelTrack, answered: LevelTrack, until_ms: float) -> dict[str, Any]:
    """Both sides' levels to ``until_ms`` (the session's close) or to the last audio placed, if
    later: ``{"step_ms", "floor_db", "input": [dB, …], "output": [dB, …]}``, the same length."""
    length_ms = max(until_ms, heard.extent_ms, answered.extent_ms, 0.0)
    grains_per_step = _GRAINS_PER_STEP * max(1, math.ceil(length_ms / STEP_MS / MAX_STEPS))
    steps = math.ceil(length_ms / (grains_per_step * GRAIN_MS))
    return {
        "step_ms": grains_per_step * GRAIN_MS, "floor_db": FLOOR_DB,
        "input": heard.levels(steps, grains_per_step), "output": answered.levels(steps, grains_per_step),
    }
