"""Real-time pacing of an outbound 48 kHz audio track, 20 ms per frame.

``FramePacer`` sends frame *n* at ``start + n * 20 ms`` on one monotonic clock, skips the slots
a stall took (its timeline jumps over them) instead of bursting, and sends a new answer's first frame at once
(``wake()``), never two frames closer than ``MIN_FRAME_GAP_S``. Every pacer of a process may
report to one :class:`PacingStats`: each frame's lateness, frames late, slots skipped, whether the
process is overloaded (one warning per window). The rules and why: docs/NETWORK.md, "Outbound:
pacing"; overload: docs/HARDENING.md, "Faults".
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Callable
from fractions import Fraction
from typing import Any

import av
import numpy as np

from media.rates import WIRE_RATE

logger = logging.getLogger(__name__)

FRAME_SAMPLES = 960  # 20 ms at 48 kHz, one Opus frame
TIME_BASE = Fraction(1, WIRE_RATE)
# A woken frame (a new answer after silence) goes no sooner than this after the frame before it.
MIN_FRAME_GAP_S = 0.01
# Lateness beyond which the slots missed are skipped instead of caught up: 3 frames.
# Ordinary event-loop jitter is a few ms; a stall this long is worth a gap, not a burst.
MAX_LATENESS_S = 0.06
FRAME_S = FRAME_SAMPLES / WIRE_RATE
# Upper bounds (seconds) of the lateness histogram: loop jitter is 0-5 ms; from one frame (20 ms)
# on the peer's jitter buffer sees a hole; past 60 ms the missed slots are skipped.
LATENESS_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.2, 0.5, 1.0)
# A frame handed out a whole frame period after it was due is "late": the listener hears a gap.
LATE_S = FRAME_S
# Overloaded: in the last window, at least this share of frames was late or skipped. 1 % is one
# audible hole every 2 s per call, well past what loop jitter causes (p99 lateness ~5 ms when not
# overloaded, measured with tests/bench/media_capacity.py).
OVERLOAD_WINDOW_S = 10.0
OVERLOAD_SHARE = 0.01
# The share is taken of at least this many frames (one call's window), so that a young or quiet
# window needs 5 bad frames, not one hiccup, to count as overloaded.
OVERLOAD_MIN_FRAMES = 500


class PacingStats:
    """Lateness of the outbound frames of every track in one process (one media worker)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.bucket_counts = [0] * (len(LATENESS_BUCKETS_S) + 1)  # the last: above every bound
        self.lateness_sum_s = 0.0
        self.frames = 0
        self.late_frames = 0  # handed out LATE_S or more after they were due
        self.skipped_frames = 0  # frame slots skipped after a stall
        self._window_start = clock()
        self._window = (0, 0)  # frames, and late or skipped frames, since _window_start
        self._last_window: tuple[int, int] = (0, 0)

    def record(self, lateness_s: float, skipped: int = 0) -> None:
        """One frame handed out ``lateness_s`` after it was due, after ``skipped`` lost slots."""
        self.bucket_counts[bisect.bisect_left(LATENESS_BUCKETS_S, lateness_s)] += 1
        self.lateness_sum_s += lateness_s
        self.frames += 1
        bad = skipped + (lateness_s >= LATE_S)
        self.late_frames += lateness_s >= LATE_S
        self.skipped_frames += skipped
        frames, late = self._window
        self._window = (frames + 1, late + bad)
        now = self._clock()
        if now - self._window_start >= OVERLOAD_WINDOW_S:
            self._close_window(now)

    def snapshot(self) -> dict[str, Any]:
        """The counts as plain data (for /metrics and /healthz, and to send between processes)."""
        return {
            "bucket_counts": list(self.bucket_counts),
            "lateness_sum_s": self.lateness_sum_s,
            "frames": self.frames,
            "late_frames": self.late_frames,
            "skipped_frames": self.skipped_frames,
            "overloaded": self.overloaded,
        }

    @property
    def overloaded(self) -> bool:
        """Whether the last full window (or the current one, once it is as bad) missed frames."""
        self._expire(self._clock())
        return any(_over(window) for window in (self._last_window, self._window))

    def _expire(self, now: float) -> None:
        if now - self._window_start >= 2 * OVERLOAD_WINDOW_S:  # idle: nothing recent to judge
            self._window_start, self._window, self._last_window = now, (0, 0), (0, 0)

    def _close_window(self, now: float) -> None:
        self._last_window, self._window, self._window_start = self._window, (0, 0), now
        if _over(self._last_window):
            frames, late = self._last_window
            logger.warning(
                "media worker falling behind: %d of %d outbound frames late or skipped in the last %.0f s "
                "(listeners hear holes); it carries more calls than its core can pace",
                late, frames, OVERLOAD_WINDOW_S,
            )


def _over(window: tuple[int, int]) -> bool:
    frames, late = window
    return late > 0 and late >= OVERLOAD_SHARE * max(frames, OVERLOAD_MIN_FRAMES)


class FramePacer:
    """Hands out 20 ms mono frames when they are due; ``pts`` is the stream's timeline in samples:
    those sent, and the slots a stall skipped.

    ``sleep`` (tests: a fake clock's) replaces the loop's timer; either way ``wake()`` cuts the
    wait for the next frame short.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        stats: PacingStats | None = None,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._stats = stats
        self._start: float | None = None  # clock time of pts 0
        self._sent_at = float("-inf")  # when the last frame was handed out
        self._waiting: asyncio.Future[bool] | None = None  # the wait for the next frame's slot
        self._woken = False  # wake() came while no wait was going on: the next one is cut short
        self.pts = 0  # 48 kHz samples sent so far

    def wake(self) -> None:
        """Send the next frame now instead of at its slot (no sooner than ``MIN_FRAME_GAP_S``
        after the last), moving the schedule earlier with it; a no-op before the first frame."""
        if self._start is None:
            return
        if self._waiting is not None:
            if not self._waiting.done():
                self._waiting.set_result(True)
        else:
            self._woken = True

    async def wait_until_due(self) -> None:
        """Returns when the next frame is due (at once for the first one, which starts the clock)."""
        now = self._clock()
        if self._start is None:
            self._start = self._sent_at = now
            return
        due = self._start + self.pts / WIRE_RATE
        if now < due:
            woken = self._woken or await self._pause(due - now)
            self._woken = False
            if woken:
                await self._send_early(due)
            elif self._stats is not None:
                self._stats.record(max(self._clock() - due, 0.0))  # the sleep may overshoot: a busy loop
        elif now - due > MAX_LATENESS_S:
            # The slots the stall took are skipped: the timeline (pts, hence the RTP timestamps) jumps
            # over them, so the peer sees a gap in time, no packet lost, and the packets after it on
            # time. With pts continuous every later packet would reach the peer's jitter buffer late
            # by the stall, to be concealed and dropped while it remembers the earlier ones (2 s).
            skipped = int((now - due) / FRAME_S + 1e-9)  # whole periods lost
            logger.debug("outbound audio %.0f ms late: %d slots skipped instead of a burst", (now - due) * 1e3, skipped)
            self.pts += skipped * FRAME_SAMPLES
            if self._stats is not None:
                self._stats.record(now - due, skipped=skipped)
        elif self._stats is not None:
            self._stats.record(now - due)
        self._woken = False
        self._sent_at = self._clock()

    async def _send_early(self, due: float) -> None:
        """Woken before ``due``: this frame goes now (half a frame after the last at the soonest)
        and the schedule moves earlier by what it gained."""
        now = self._clock()
        send_at = max(now, self._sent_at + MIN_FRAME_GAP_S)
        if send_at >= due:  # nothing to gain: the slot comes first
            await self._pause(due - now, wakeable=False)
            send_at = due
        elif send_at > now:
            await self._pause(send_at - now, wakeable=False)
        assert self._start is not None
        self._start -= due - send_at
        if self._stats is not None:
            self._stats.record(0.0)

    async def _pause(self, seconds: float, *, wakeable: bool = True) -> bool:
        """Sleep ``seconds``; True when ``wake()`` cut it short. The loop's own timer (a future and
        ``call_later``, as ``asyncio.sleep`` is made), or the given ``sleep`` raced with the wake."""
        if seconds <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiting: asyncio.Future[bool] = loop.create_future()
        if wakeable:
            self._waiting = waiting
        try:
            if self._sleep is None:
                timer = loop.call_later(seconds, _resolve, waiting)
                try:
                    return await waiting
                finally:
                    timer.cancel()
            sleeper = asyncio.ensure_future(self._sleep(seconds))
            sleeper.add_done_callback(lambda _: _resolve(waiting))
            try:
                return await waiting
            finally:
                sleeper.cancel()
                await asyncio.gather(sleeper, return_exceptions=True)
        finally:
            if wakeable:
                self._waiting = None

    def frame(self, pcm16: np.ndarray) -> av.AudioFrame:
        """The next frame holding ``FRAME_SAMPLES`` int16 samples, stamped with the next pts."""
        frame = av.AudioFrame.from_ndarray(pcm16.reshape(1, FRAME_SAMPLES), format="s16", layout="mono")
        frame.sample_rate = WIRE_RATE
        frame.pts = self.pts
        frame.time_base = TIME_BASE
        self.pts += FRAME_SAMPLES
        return frame


def _resolve(waiting: asyncio.Future[bool]) -> None:
    """The slot came (not a wake)."""
    if not waiting.done():
        waiting.set_result(False)
