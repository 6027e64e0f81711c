"""The peer's video track, sampled: a few still frames a second at most, scaled and JPEG-encoded.

A camera sends 15-30 frames a second; a voice turn needs a handful of them (the session says
how often, ``FramePlan``: 1 fps while the user speaks, 0.25 fps otherwise by default).
:class:`VideoSampler` reads every frame the track delivers (aiortc decodes VP8 and H.264 in
its own decoder thread, and queues the decoded frames without bound for whoever reads them),
keeps one per ``interval_s`` of arrival time, and hands it on as a :class:`SampledFrame`:
scaled to the size the plan asks for and JPEG-encoded. Scaling and encoding take milliseconds
per frame (tests/bench/README.md, "video frames"), so they run in a worker thread, never on
the event loop that paces the call's audio; frames arriving meanwhile wait in the track's queue.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Callable

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from media.frames import FramePlan, SampledFrame

logger = logging.getLogger(__name__)

# Visually lossless for a vision model; a 512x384 frame is ~30-50 KB instead of 590 KB of RGB.
JPEG_QUALITY = 90


def encode_frame(frame: av.VideoFrame, size: Callable[[int, int], tuple[int, int]]) -> SampledFrame:
    """``frame`` scaled (swscale, bicubic) to ``size(width, height)`` and JPEG-encoded. Blocking."""
    width, height = size(frame.width, frame.height)
    image = frame.to_image(width=width, height=height, interpolation="BICUBIC")
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=JPEG_QUALITY)
    return SampledFrame(out.getvalue(), width, height)


class VideoSampler:
    """Reads ``track`` until it ends; every ``plan().interval_s`` of arrival time one frame goes to
    ``on_frame``, encoded off the event loop. ``plan()`` returning None skips frames (not wanted now).

    Whoever starts it owns it: ``close()`` cancels and awaits its task, and is safe twice.
    """

    def __init__(
        self,
        track: MediaStreamTrack,
        *,
        plan: Callable[[], FramePlan | None],
        on_frame: Callable[[SampledFrame], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._track = track
        self._plan = plan
        self._on_frame = on_frame
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.frames_received = 0
        self.frames_sampled = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="video sampler")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        sampled_at: float | None = None
        while True:
            try:
                frame = await self._track.recv()
            except MediaStreamError:
                return  # the peer's track ended
            self.frames_received += 1
            plan = self._plan()
            now = self._clock()
            if plan is None or (sampled_at is not None and now - sampled_at < plan.interval_s):
                continue
            if not isinstance(frame, av.VideoFrame):
                logger.warning("video sampler: ignoring a %s on a video track", type(frame).__name__)
                continue
            sampled_at = now
            self._on_frame(await asyncio.to_thread(encode_frame, frame, plan.size))
            self.frames_sampled += 1
