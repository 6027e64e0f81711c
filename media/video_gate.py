"""The one place omni-rtc reaches into aiortc's video receiver: a coded frame reaches the decoder
only when a frame is wanted and its size is within the bound, and decoded frames wait in a
bounded queue.

Why. aiortc's ``RTCRtpReceiver`` reassembles each coded frame from the peer's packets on the
event loop, puts it on an unbounded ``queue.Queue`` read by its decoder thread, which decodes
every frame at whatever size the stream declares (VP8 up to 16383x16383) and puts the result on
its track's unbounded ``asyncio.Queue`` for whoever reads the track. A camera stream at 4096x4096
(a 25 MB frame) held 353 MB with 10 frames queued, at 30 KB/s; at 16000x16000 one frame is ~384
MB. And it decodes 15-30 frames a second while the session wants none.

aiortc has no option or hook for either, so, as ``media.receiver_tap`` does for audio, this
replaces two private attributes before the decoder thread starts (they are handed to it then):

- the decoder queue (``_RTCRtpReceiver__decoder_queue``) by a :class:`DecoderFeed`: the same
  ``put``/``get``, with :class:`VideoGate` judging each frame on the loop as it is put, from its
  header (``media.coded_video``): a key frame larger than ``max_pixels`` is refused and so is
  everything after it until a key frame within the bound (inter frames depend on it); nothing is
  decoded while ``wanted()`` is false; and at most ``MAX_PENDING_FRAMES`` wait for a decoder that
  falls behind (past that they are dropped). After a gap the decoder waits for a key frame and
  one is asked for (see below);
- the track's queue by one of ``MAX_DECODED_FRAMES`` that drops its oldest frame for a new one.

Asking for a key frame: the gate sets the receiver's ``_RTCRtpReceiver__decoder_error`` event,
which aiortc's own receiver reads on the next packet to send the peer a picture loss indication
(RFC 4585 §6.3.1; what it does when its decoder fails), at most once per
``KEY_FRAME_REQUEST_INTERVAL_S`` while waiting. Browsers answer with a key frame within a round trip.

*Decided*: the bound is a pixel count (``--max-video-pixels``, 1920x1080 by default: portrait and
landscape alike; the page asks its camera for 640x480, and the session scales every kept frame to
its own budget anyway, by default 100,352 pixels). A stream past it is not ended: its frames are
dropped undecoded and logged once per size, the call goes on with its audio, and a peer that
lowers its resolution (a new key frame) is decoded again.

The private names were read in aiortc 1.16 (``media.aiortc_version``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiortc import RTCRtpReceiver

from media.aiortc_version import check_aiortc
from media.coded_video import read_coded_frame

logger = logging.getLogger(__name__)

MAX_DECODED_PIXELS = 1920 * 1080
# Coded frames waiting for the decoder thread: a 640x480 VP8 frame decodes in ~1-3 ms, so a queue
# this long means the decoder is far behind (a starved process); half a second at 30 fps.
MAX_PENDING_FRAMES = 15
# Decoded frames waiting for their reader (the sampler reads each as it comes): two 1080p
# YUV 4:2:0 frames are ~6 MB.
MAX_DECODED_FRAMES = 2
KEY_FRAME_REQUEST_INTERVAL_S = 1.0
_DECODER_QUEUE = "_RTCRtpReceiver__decoder_queue"
_DECODER_THREAD = "_RTCRtpReceiver__decoder_thread"
_DECODER_ERROR = "_RTCRtpReceiver__decoder_error"
_CODECS = ("VP8", "H264")


class VideoGate:
    """Judges each coded frame of one video receiver before it is decoded (see the module docstring).

    Its counters: ``frames_passed`` (to the decoder), ``frames_refused`` (of a stream past the
    size bound), ``frames_skipped`` (none wanted), ``frames_dropped`` (waiting for a key frame,
    or the decoder behind), ``key_frames_asked``.
    """

    def __init__(
        self,
        *,
        wanted: Callable[[], bool],
        ask_key_frame: Callable[[], None],
        max_pixels: int = MAX_DECODED_PIXELS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wanted = wanted
        self._ask_key_frame = ask_key_frame
        self._max_pixels = max_pixels
        self._clock = clock
        self._decodable = False  # the decoder has the key frame the next inter frame depends on
        self._size: tuple[int, int] | None = None  # the stream's size, from its last key frame
        self._refused_size: tuple[int, int] | None = None
        self._refusing = False
        self._asked_at: float | None = None
        self.frames_passed = 0
        self.frames_refused = 0
        self.frames_skipped = 0
        self.frames_dropped = 0
        self.key_frames_asked = 0

    def admit(self, codec: str, data: bytes) -> bool:
        """Whether this coded frame goes to the decoder. Called on the event loop, in order."""
        frame = read_coded_frame(codec, data)
        if frame.size is not None or frame.key:
            size = frame.size or (self._size if codec.upper() == "H264" else None)
            if size is None or size[0] * size[1] > self._max_pixels:
                self._refuse(codec, size)
                return False
            if self._refusing:
                logger.info("video: the peer's %s stream is %dx%d now, within the bound: decoding again", codec, *size)
            self._refusing = False
            self._size = size
        elif self._refusing:
            self.frames_refused += 1  # an inter frame of the refused picture
            return False
        if not self._wanted():
            self._decodable = False
            self.frames_skipped += 1
            return False
        if frame.key:
            self._decodable = True
            self._asked_at = None
        if not self._decodable:
            self.frames_dropped += 1
            self._ask_for_key_frame()
            return False
        return True

    def decoder_behind(self) -> None:
        """The pending frames were dropped: decoding resumes at the next key frame."""
        self._decodable = False
        self._ask_for_key_frame()

    def _refuse(self, codec: str, size: tuple[int, int] | None) -> None:
        self.frames_refused += 1
        self._decodable = False
        self._refusing = True
        if size != self._refused_size:
            self._refused_size = size
            said = "of no readable size" if size is None else f"{size[0]}x{size[1]}"
            logger.warning(
                "video: the peer's %s key frame is %s, past the %d pixels decoded (--max-video-pixels): "
                "its frames are dropped undecoded until a key frame within the bound", codec, said, self._max_pixels,
            )

    def _ask_for_key_frame(self) -> None:
        now = self._clock()
        if self._asked_at is not None and now - self._asked_at < KEY_FRAME_REQUEST_INTERVAL_S:
            return
        self._asked_at = now
        self.key_frames_asked += 1
        self._ask_key_frame()


class DecoderFeed:
    """Stands where aiortc's decoder queue stood: ``put`` on the loop (a ``(codec, frame)`` or the
    ``None`` that stops the decoder thread), ``get`` in the decoder thread, blocking."""

    def __init__(self, gate: VideoGate, *, max_pending: int = MAX_PENDING_FRAMES) -> None:
        self._gate = gate
        self._max_pending = max_pending
        self._items: deque[Any] = deque()
        self._ready = threading.Condition()
        self._unread_codec_logged = False

    def put(self, item: Any) -> None:
        if item is not None:
            codec, encoded = item
            if codec.name not in _CODECS:
                if not self._unread_codec_logged:  # aiortc 1.16 negotiates no other video codec
                    logger.warning("video: no header reader for %s: its frames are dropped undecoded", codec.name)
                    self._unread_codec_logged = True
                return
            if not self._gate.admit(codec.name, encoded.data):
                return
        with self._ready:
            if item is not None and len(self._items) >= self._max_pending:
                # The decoder is far behind: the pending frames and this one go (inter frames
                # depend on each other, so one by one would not do), and decoding starts again
                # at a key frame.
                kept = deque(pending for pending in self._items if pending is None)
                self._gate.frames_dropped += len(self._items) - len(kept) + 1
                self._items = kept
                self._gate.decoder_behind()
                return
            self._items.append(item)
            self._ready.notify()
        if item is not None:
            self._gate.frames_passed += 1

    def get(self) -> Any:
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()


class NewestFrames(asyncio.Queue[Any]):
    """A track's frame queue of at most ``maxsize`` frames: a frame put when it is full pushes out the
    oldest (the track's end, ``None``, too: it is never the one pushed out)."""

    def __init__(self, maxsize: int = MAX_DECODED_FRAMES) -> None:
        super().__init__(maxsize)
        self.frames_dropped = 0

    def put_nowait(self, item: Any) -> None:
        if self.full():
            self.get_nowait()
            self.frames_dropped += 1
        super().put_nowait(item)

    async def put(self, item: Any) -> None:
        self.put_nowait(item)


def gate_video_receiver(
    receiver: RTCRtpReceiver,
    *,
    wanted: Callable[[], bool],
    max_pixels: int = MAX_DECODED_PIXELS,
    clock: Callable[[], float] = time.monotonic,
) -> VideoGate:
    """Put a :class:`VideoGate` before ``receiver``'s decoder and bound its track's queue.

    Call before media flows (on the track event, inside ``setRemoteDescription``): aiortc hands
    both queues to its decoder thread when the connection starts it.
    """
    check_aiortc("media/video_gate.py (the camera's decoder gate)")
    receiver_state: Any = receiver  # its private attributes
    if (
        getattr(receiver_state, "_RTCRtpReceiver__kind", None) != "video"
        or not hasattr(receiver_state, _DECODER_QUEUE)
        or not isinstance(getattr(receiver_state, _DECODER_ERROR, None), threading.Event)
        or not isinstance(getattr(receiver.track, "_queue", None), asyncio.Queue)
    ):
        raise TypeError(f"expected aiortc 1.16's video RTCRtpReceiver (decoder queue, error event, track queue), got {receiver!r}")
    if getattr(receiver_state, _DECODER_THREAD, None) is not None:
        raise RuntimeError("the receiver's decoder thread has started: gate it before media flows")
    decoder_error: threading.Event = getattr(receiver_state, _DECODER_ERROR)
    gate = VideoGate(wanted=wanted, ask_key_frame=decoder_error.set, max_pixels=max_pixels, clock=clock)
    setattr(receiver_state, _DECODER_QUEUE, DecoderFeed(gate))
    receiver_state.track._queue = NewestFrames()
    return gate
