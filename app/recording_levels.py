"""Each side's level on the session's clock, as a recording's ``timeline.json`` holds it (``levels``).

A :class:`LevelTrack` takes one side's audio chunk by chunk as its file grows; at the end
:func:`levels_json` places it by the side's final segments (``AudioPlacement``: a cut tail is in
none) and gives both sides' level (RMS, dBFS, whole dB) per :data:`STEP_MS` step from the
session's start, a step with nothing placed in it at :data:`FLOOR_DB`. Only the recording's writer
thread uses them.

Size: a step a side per 50 ms, an hour 72,000 integers a side (about 290 KB of JSON each); a
longer session's step widens by 50 ms at a time so that a side never holds more than
:data:`MAX_STEPS`. In memory a track keeps a sum per :data:`GRAIN_MS` of its file: 800 bytes a second of audio, an
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
# Energy is summed per 10 ms of the file: five to a step, and fine enough that a segment's edge
# inside a grain takes its share of that grain's energy (at most 5 ms misplaced).
GRAIN_MS = 10
_GRAINS_PER_STEP = STEP_MS // GRAIN_MS


class LevelTrack:
    """One side's energy per :data:`GRAIN_MS` of its file, in the order it was written, at ``rate``
    samples a second; :meth:`placed` puts it on the session's clock by the side's final segments
    (``AudioPlacement``), so that a run placed earlier once more of it has arrived, or cut short,
    shows where and as much as it is heard."""

    def __init__(self, rate: int) -> None:
        if rate * GRAIN_MS % 1000:
            raise ValueError(f"a {GRAIN_MS} ms grain is not whole samples at {rate} Hz")
        self.rate = rate
        self._grain = rate * GRAIN_MS // 1000  # samples
        self._energy = np.zeros(0, dtype=np.float64)  # per grain of the file: the sum of its samples' squares
        self._samples = 0  # the file's so far

    def add(self, pcm: np.ndarray) -> None:
        """The file's next samples."""
        if pcm.size == 0:
            return
        grains = (self._samples + np.arange(pcm.size, dtype=np.int64)) // self._grain
        low, high = int(grains[0]), int(grains[-1]) + 1
        self._reserve(high)
        self._energy[low:high] += np.bincount(grains - low, weights=np.square(pcm, dtype=np.float64),
                                              minlength=high - low)
        self._samples += pcm.size

    def placed(self, segments: list[list[float]]) -> np.ndarray:
        """Energy per grain of the session's clock: each segment ``[start_ms, first_sample, samples]``
        of the file where it plays (a grain the segment holds in part, in proportion; each grain
        within half a grain of its place). What falls before the session's start is not counted."""
        grain = self._grain
        targets: list[np.ndarray] = []
        weights: list[np.ndarray] = []
        for start_ms, first, count in segments:
            first, count = int(first), int(count)
            if count <= 0:
                continue
            file_grains = np.arange(first // grain, -(-(first + count) // grain), dtype=np.int64)
            inside = (np.minimum((file_grains + 1) * grain, first + count) - np.maximum(file_grains * grain, first)) / grain
            shift = round(start_ms / 1000 * self.rate) - first  # a file sample's place on the clock, less the sample
            target = np.rint((file_grains * grain + shift) / grain).astype(np.int64)
            kept = (target >= 0) & (file_grains < self._energy.size)
            targets.append(target[kept])
            weights.append(self._energy[file_grains[kept]] * inside[kept])
        if not targets or not any(target.size for target in targets):
            return np.zeros(0, dtype=np.float64)
        target = np.concatenate(targets)
        return np.bincount(target, weights=np.concatenate(weights), minlength=int(target.max()) + 1)

    def levels(self, energy: np.ndarray, steps: int, grains_per_step: int) -> list[int]:
        """The level of each of ``steps`` steps of ``grains_per_step`` grains of ``energy``
        (:meth:`placed`), in whole dBFS."""
        padded = np.zeros(steps * grains_per_step, dtype=np.float64)
        kept = min(padded.size, energy.size)
        padded[:kept] = energy[:kept]
        mean = padded.reshape(steps, grains_per_step).sum(axis=1) / (grains_per_step * self._grain)
        with np.errstate(divide="ignore"):
            db = 10 * np.log10(mean)
        return np.clip(np.round(db), FLOOR_DB, 0).astype(int).tolist()

    def _reserve(self, grains: int) -> None:
        if grains > self._energy.size:
            grown = np.zeros(max(grains, 2 * self._energy.size), dtype=np.float64)
            grown[:self._energy.size] = self._energy
            self._energy = grown


def levels_json(heard: LevelTrack, heard_segments: list[list[float]], answered: LevelTrack,
                answered_segments: list[list[float]], until_ms: float) -> dict[str, Any]:
    """Both sides' levels, each placed by its segments, to ``until_ms`` (the session's close) or to
    the last audio placed, if later: ``{"step_ms", "floor_db", "input": [dB, …], "output": [dB, …]}``,
    the same length."""
    heard_energy, answered_energy = heard.placed(heard_segments), answered.placed(answered_segments)
    length_ms = max(until_ms, heard_energy.size * GRAIN_MS, answered_energy.size * GRAIN_MS, 0.0)
    grains_per_step = _GRAINS_PER_STEP * max(1, math.ceil(length_ms / STEP_MS / MAX_STEPS))
    steps = math.ceil(length_ms / (grains_per_step * GRAIN_MS))
    return {
        "step_ms": grains_per_step * GRAIN_MS, "floor_db": FLOOR_DB,
        "input": heard.levels(heard_energy, steps, grains_per_step),
        "output": answered.levels(answered_energy, steps, grains_per_step),
    }
