"""Real-time pacing of an outbound 48 kHz audio track, 20 ms per frame.

Pacing follows aiortc's own ``AudioStreamTrack``: frame *n* is due at ``start + n * 20 ms`` on
one monotonic clock started by the first ``recv()``, so scheduling jitter never accumulates into
drift (a frame that is a little late is followed by a shorter sleep). Unlike aiortc's track it
does not catch up after a real stall (the event loop blocked longer than ``MAX_LATENESS_S``):
sending the missed frames back to back would burst them into the peer's jitter buffer. Instead
the schedule moves forward by the stall; pts stays continuous (pts = samples sent, time base
1/48000), so the peer simply sees the packets arrive late once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction

import av
import numpy as np

from media.rates import WIRE_RATE

logger = logging.getLogger(__name__)

FRAME_SAMPLES = 960  # 20 ms at 48 kHz, one Opus frame
TIME_BASE = Fraction(1, WIRE_RATE)
# Lateness beyond which the schedule moves forward instead of catching up: 3 frames.
# Ordinary event-loop jitter is a few ms; a stall this long is worth a late packet, not a burst.
MAX_LATENESS_S = 0.06


class FramePacer:
    """Hands out 20 ms mono frames when they are due; ``pts`` counts the samples sent."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None  # clock time of pts 0
        self.pts = 0  # 48 kHz samples sent so far

    async def wait_until_due(self) -> None:
        """Returns when the next frame is due (at once for the first one, which starts the clock)."""
        now = self._clock()
        if self._start is None:
            self._start = now
            return
        due = self._start + self.pts / WIRE_RATE
        if now < due:
            await self._sleep(due - now)
        elif now - due > MAX_LATENESS_S:
            logger.debug("outbound audio %.0f ms late: moving the schedule instead of bursting", (now - due) * 1e3)
            self._start += now - due

    def frame(self, pcm16: np.ndarray) -> av.AudioFrame:
        """The next frame holding ``FRAME_SAMPLES`` int16 samples, stamped with the next pts."""
        frame = av.AudioFrame.from_ndarray(pcm16.reshape(1, FRAME_SAMPLES), format="s16", layout="mono")
        frame.sample_rate = WIRE_RATE
        frame.pts = self.pts
        frame.time_base = TIME_BASE
        self.pts += FRAME_SAMPLES
        return frame
