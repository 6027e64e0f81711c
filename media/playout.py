"""A remote audio track rebuilt from its packets: decoded, FEC-recovered or concealed on a deadline.

:class:`PlayoutTrack` stands in for the track aiortc's receiver would have produced: it is fed
the receiver's packets (``media.receiver_tap``), keeps them in a
:class:`media.jitter_buffer.AudioJitterBuffer`, and ``recv()`` returns the next 48 kHz mono
s16 frame as soon as the buffer releases it: at once for a packet in order, at the slot's
deadline for a concealed one. Each frame's ``opaque`` says where its audio came from
(``"packet"``, ``"fec"`` or ``"plc"``); its ``pts`` is its RTP time from the stream's first
packet (time base 1/48000), as aiortc stamps its own frames. Frames released together (a gap
filled after an outage, a stalled loop's backlog) are handed out one loop iteration apart, so
their reader's work does not hold the loop's other calls. The track ends when the receiver's own
track ends (the peer or the connection went).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from fractions import Fraction

import av
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.inbound import release_audio_promptly
from media.jitter_buffer import AudioJitterBuffer, PlayoutFrame, ReceiveStats
from media.rates import WIRE_RATE
from media.receiver_tap import tap_audio_receiver

_TIME_BASE = Fraction(1, WIRE_RATE)


class PlayoutTrack(MediaStreamTrack):
    """Frames of one remote Opus stream on a playout deadline; feed it with :meth:`push`."""

    kind = "audio"

    def __init__(
        self,
        remote: MediaStreamTrack,
        *,
        clock: Callable[[], float] = time.monotonic,
        buffer: AudioJitterBuffer | None = None,
    ) -> None:
        """``remote``: the receiver's own track, watched only for its end."""
        super().__init__()
        self._remote = remote
        self._clock = clock
        self._buffer = buffer or AudioJitterBuffer()
        self._ready: deque[PlayoutFrame] = deque()
        self._changed = asyncio.Event()

    @property
    def stats(self) -> ReceiveStats:
        return self._buffer.stats

    def push(self, sequence_number: int, timestamp: int, payload: bytes, arrival: float) -> None:
        """One received packet (a ``media.receiver_tap.PacketSink``)."""
        if self.readyState != "live":
            return
        self._buffer.push(sequence_number, timestamp, payload, arrival)
        self._changed.set()

    async def recv(self) -> av.AudioFrame:
        if self._ready:
            # A burst (a gap filled after an outage, the backlog of a stalled loop): the reader
            # processes each frame before it asks for the next (resampling, the VAD: ~0.3 ms), so
            # without a yield here 4 s of audio held every other call on this loop for ~90 ms.
            await asyncio.sleep(0)
        while not self._ready:
            if self.readyState != "live":
                raise MediaStreamError
            self._ready.extend(self._buffer.pop(self._clock()))
            if self._ready:
                break
            await self._wait(self._buffer.next_deadline())
        return _frame(self._ready.popleft())

    def stop(self) -> None:
        if self.readyState == "live":
            self._buffer.close()
        super().stop()

    async def _wait(self, deadline: float | None) -> None:
        """Until a packet arrives, ``deadline`` passes or the remote track ends (then this track ends)."""
        self._changed.clear()
        timeout = None if deadline is None else max(deadline - self._clock(), 0.0)
        ended = asyncio.ensure_future(self._remote.recv())  # yields nothing but its end (the tap keeps its frames)
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait((ended, changed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ended, changed):
                task.cancel()
            # Their ends (cancelled, or the remote track's MediaStreamError) come back as values. A
            # cancellation of recv() itself while it waits here still raises: suppressing
            # CancelledError around each await swallowed one that landed there, and the track's
            # reader then ran until the connection died (a hang-up took 44 s).
            await asyncio.gather(ended, changed, return_exceptions=True)
        if ended.done() and not ended.cancelled() and isinstance(ended.exception(), MediaStreamError):
            self.stop()


def _frame(frame: PlayoutFrame) -> av.AudioFrame:
    audio = av.AudioFrame.from_ndarray(frame.pcm.reshape(1, -1), format="s16", layout="mono")
    audio.sample_rate = WIRE_RATE
    audio.pts = frame.timestamp
    audio.time_base = _TIME_BASE
    audio.opaque = frame.origin
    return audio


def receive_audio(receiver: RTCRtpReceiver, *, jitter_buffer: bool = True) -> MediaStreamTrack:
    """The track to read ``receiver``'s audio from; call from the peer connection's ``track`` event.

    ``jitter_buffer`` (the default): a :class:`PlayoutTrack` fed by the receiver's packets. Without
    it: aiortc's own track, each packet released once the next arrives
    (``media.inbound.release_audio_promptly``), with no concealment; kept as the fallback should an
    aiortc upgrade refuse the tap, and to measure against (tests/bench/network.py).
    """
    if not jitter_buffer:
        release_audio_promptly(receiver)
        return receiver.track
    playout = PlayoutTrack(receiver.track)
    tap_audio_receiver(receiver, playout.push)
    return playout
