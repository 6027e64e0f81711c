"""What the video sampler and the session agree on: how to sample, and what a kept frame is.

Kept apart from ``media.video`` (which reads aiortc tracks) so that the session core, which
asks for frames and keeps them, imports no WebRTC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FramePlan:
    """How to sample now: one frame per ``interval_s`` seconds, scaled to ``size(width, height)``."""

    interval_s: float
    size: Callable[[int, int], tuple[int, int]]


@dataclass(frozen=True)
class SampledFrame:
    """One kept frame: JPEG bytes and their size in pixels."""

    data: bytes
    width: int
    height: int
