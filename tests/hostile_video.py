"""A camera a peer may send: coded frames of any size, made once here and sent as they are.

aiortc's sender encodes what its track yields, unless the track yields coded packets
(``av.Packet``), which it packetizes as they are: :class:`CodedVideoTrack` yields the same coded
frames over and over, in real time, so that a test or a bench sends a 4096x4096 stream at a few
KB/s without encoding it each time (libvpx takes seconds for one such frame). Used by
tests/media/test_video_gate.py, tests/e2e/test_peer_call.py, tests/e2e/test_abuse.py and
tests/bench/video_abuse.py.
"""

from __future__ import annotations

import asyncio
import fractions
import functools
import time

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

VIDEO_CLOCK_RATE = 90_000
# libvpx's and libx264's fastest settings: a flat grey 4096x4096 key frame takes ~5 s, not ~20.
_FAST = {"libvpx": {"deadline": "realtime", "cpu-used": "16"}, "libx264": {"preset": "ultrafast", "tune": "zerolatency"}}


@functools.cache
def coded_frames(encoder: str, width: int, height: int, count: int = 1) -> tuple[bytes, ...]:
    """``count`` frames of flat grey coded by ``encoder`` ("libvpx": VP8, "libx264": H.264 Annex B):
    a key frame, then inter frames. Made once per process."""
    context = av.CodecContext.create(encoder, "w")
    context.width, context.height = width, height
    context.pix_fmt = "yuv420p"
    context.time_base = fractions.Fraction(1, 30)
    context.options = dict(_FAST[encoder])
    frame = av.VideoFrame(width, height, "yuv420p")
    for plane in frame.planes:
        plane.update(bytes([128]) * plane.buffer_size)
    coded: list[bytes] = []
    for pts in range(count):
        frame.pts = pts
        coded += [bytes(packet) for packet in context.encode(frame)]
    coded += [bytes(packet) for packet in context.encode(None)]
    return tuple(coded)


class CodedVideoTrack(MediaStreamTrack):
    """Sends ``frames`` (coded) in a loop at ``fps``, each stamped on a 90 kHz clock."""

    kind = "video"

    def __init__(self, frames: tuple[bytes, ...], *, fps: float = 5.0) -> None:
        super().__init__()
        self._frames = frames
        self._fps = fps
        self.sent = 0
        self._at = 0  # the next of ``frames``
        self._started_at: float | None = None

    def replace(self, frames: tuple[bytes, ...]) -> None:
        """Send ``frames`` from now on (a new stream starts with its key frame)."""
        self._frames = frames
        self._at = 0

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._started_at is None:
            self._started_at = now
        due = self._started_at + self.sent / self._fps
        if due > now:
            await asyncio.sleep(due - now)
        packet = av.Packet(self._frames[self._at % len(self._frames)])
        packet.pts = round(self.sent * VIDEO_CLOCK_RATE / self._fps)
        packet.time_base = fractions.Fraction(1, VIDEO_CLOCK_RATE)
        self.sent += 1
        self._at += 1
        return packet
