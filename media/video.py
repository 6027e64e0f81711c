"""The peer's video track, sampled: a few still frames a second at most, scaled and JPEG-encoded.

A camera sends 15-30 frames a second; a voice turn needs a handful of them (the session says
how often, ``FramePlan``: 1 fps while the user speaks, 0.25 fps otherwise by default).
:class:`VideoSampler` gates the receiver's decoder (``media.video_gate``: nothing is decoded
while the session wants no frame, nor past ``max_pixels``, and the track keeps at most two
decoded frames), reads every frame the track delivers (aiortc decodes VP8 and H.264 in its own
decoder thread), keeps one per ``interval_s`` of arrival time, and hands it on as a
:class:`SampledFrame`: scaled to the size the plan asks for and JPEG-encoded. Scaling and
encoding take milliseconds per frame (tests/bench/README.md, "video frames"), so they run in a
worker thread, never on the event loop that paces the call's audio; the track is read on
meanwhile, and a frame due while one is being encoded is skipped (the next one after is kept),
so a slow encoder holds one frame, not a queue of them.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Callable

import av
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError

from media.frames import FramePlan, SampledFrame
from media.video_gate import MAX_DECODED_PIXELS, VideoGate, gate_video_receiver

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
    """Reads ``receiver``'s track until it ends; every ``plan().interval_s`` of arrival time one
    frame goes to ``on_frame``, encoded off the event loop. ``plan()`` returning None: no frame
    is wanted now, and none is decoded.

    Make it on the receiver's track event, before media flows (it gates the decoder). Whoever
    starts it owns it: ``close()`` cancels and awaits its tasks, and is safe twice.
    """

    def __init__(
        self,
        receiver: RTCRtpReceiver,
        *,
        plan: Callable[[], FramePlan | None],
        on_frame: Callable[[SampledFrame], None],
        max_pixels: int = MAX_DECODED_PIXELS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._track = receiver.track
        self._plan = plan
        self._on_frame = on_frame
        self._clock = clock
        self.gate: VideoGate = gate_video_receiver(receiver, wanted=lambda: plan() is not None, max_pixels=max_pixels)
        self._task: asyncio.Task[None] | None = None
        self._encoding: asyncio.Task[None] | None = None
        self.frames_received = 0
        self.frames_sampled = 0
        self.frames_skipped = 0  # due while the previous one was still being encoded

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="video sampler")

    async def close(self) -> None:
        for task in (self._task, self._encoding):
            if task is not None:
                task.cancel()
        for task in (self._task, self._encoding):
            if task is not None:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._task = self._encoding = None

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
            if self._encoding is not None and not self._encoding.done():
                self.frames_skipped += 1
                continue
            sampled_at = now
            self._encoding = asyncio.create_task(self._keep(frame, plan), name="video frame encoding")

    async def _keep(self, frame: av.VideoFrame, plan: FramePlan) -> None:
        try:
            sampled = await asyncio.to_thread(encode_frame, frame, plan.size)
            self.frames_sampled += 1
            self._on_frame(sampled)
        except Exception:
            # Nothing awaits this task until close(): a frame that fails (swscale, Pillow, the
            # session refusing it) is logged here and lost; the camera goes on.
            logger.exception("video sampler: a %dx%d frame could not be kept", frame.width, frame.height)
