"""A camera for the headless client: a video file (Y4M, or anything PyAV reads) or one still image
(PNG, JPEG), played as a video track in real time, over and over.

aiortc's ``MediaPlayer`` plays files too, but with ``loop=True`` it stops pacing after the
first pass (its clock is not restarted when the file is): it then sends as fast as it can
encode. This track decodes the file lazily, one frame per ``1 / fps`` on one monotonic clock
started at its first ``recv()``, with ``pts`` counted at 90 kHz (RTP's video clock). A still
image is sent at ``STILL_IMAGE_FPS``: the server samples at most a few frames a second.
"""

from __future__ import annotations

import asyncio
import fractions
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

VIDEO_CLOCK_RATE = 90_000
STILL_IMAGE_FPS = 5.0


class VideoFileTrack(MediaStreamTrack):
    """Plays ``path`` (a video, or one image) in a loop at its own frame rate (``fps`` overrides)."""

    kind = "video"

    def __init__(self, path: str | Path, *, fps: float | None = None) -> None:
        super().__init__()
        self._path = str(path)
        with av.open(self._path) as container:
            stream = container.streams.video[0]
            first_two = list(itertools.islice(container.decode(stream), 2))
            rate = stream.average_rate
        if not first_two:
            raise ValueError(f"{path} holds no video frame")
        self.still = len(first_two) == 1
        default_fps = STILL_IMAGE_FPS if self.still or not rate else float(rate)
        self.fps = fps or default_fps
        self._frames = self._decode_forever()
        self._started_at: float | None = None
        self._sent = 0

    def _decode_forever(self) -> Iterator[av.VideoFrame]:
        while True:
            with av.open(self._path) as container:
                yield from container.decode(video=0)

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._started_at is None:
            self._started_at = now
        due = self._started_at + self._sent / self.fps
        if due > now:
            await asyncio.sleep(due - now)
        frame = next(self._frames)
        frame.pts = round(self._sent * VIDEO_CLOCK_RATE / self.fps)
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK_RATE)
        self._sent += 1
        return frame
