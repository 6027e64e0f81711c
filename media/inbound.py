"""Inbound audio: every frame of a remote WebRTC audio track → 16 kHz mono float32 PCM.

The track is a call's ``media.playout.PlayoutTrack`` (decoded, FEC-recovered or concealed frames
on a playout deadline), or aiortc's own remote track with ``jitter_buffer`` off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import av
import numpy as np
from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.rates import SPEECH_RATE

logger = logging.getLogger(__name__)

# aiortc's own receive path (jitter_buffer=False; by default media/playout.py replaces it, see
# docs/NETWORK.md). Its audio receiver keeps each packet until 4 later ones have arrived (JitterBuffer
# prefetch=4): 80 ms before the VAD hears it (measured over loopback: 60-80 ms of the end of
# speech -> first answer audio latency). The prefetch buys nothing: released frames are decoded
# and queued at once, with no playout clock, and a lost packet stalls the buffer whatever the
# prefetch (it releases contiguous packets only). 1 is its least: a frame is complete when the
# next packet arrives, 20 ms.
AUDIO_JITTER_PREFETCH = 1
AUDIO_JITTER_CAPACITY = 16  # aiortc's own for audio: 320 ms of packets before it drops some


def release_audio_promptly(receiver: RTCRtpReceiver) -> None:
    """Make an audio receiver hand on each packet once the next one arrives (20 ms, not 80 ms).

    Call before media flows (after ``setRemoteDescription``). aiortc has no option for it, so
    this replaces the receiver's private jitter buffer; it fails loudly if aiortc renames it.
    """
    attribute = "_RTCRtpReceiver__jitter_buffer"
    if getattr(receiver, "_RTCRtpReceiver__kind", None) != "audio" or not hasattr(receiver, attribute):
        raise TypeError(f"expected an aiortc audio RTCRtpReceiver with a jitter buffer, got {receiver!r}")
    setattr(receiver, attribute, JitterBuffer(capacity=AUDIO_JITTER_CAPACITY, prefetch=AUDIO_JITTER_PREFETCH))


class InboundAudio:
    """Reads a remote audio track in a task it owns and hands each frame on as 16 kHz mono PCM.

    aiortc queues decoded frames of a remote track without bound until someone calls
    ``recv()``, so the track is read continuously whether or not anyone wants the
    audio. Opus arrives decoded as 48 kHz s16 (aiortc decodes to stereo; mono, packed
    or planar are handled too); one stateful ``av.AudioResampler`` per track converts
    it, so there are no seams between frames. swresample holds back a few samples
    (16 at 16 kHz with its default filter) until the next frame; they are flushed when
    the track ends, so the sample count is conserved exactly (in/3).
    """

    def __init__(
        self,
        track: MediaStreamTrack,
        on_audio: Callable[[np.ndarray], None],
        *,
        on_ended: Callable[[], None] | None = None,
    ) -> None:
        if track.kind != "audio":
            raise ValueError(f"expected an audio track, got kind {track.kind!r}")
        self._track = track
        self._on_audio = on_audio
        self._on_ended = on_ended
        self._resampler: av.AudioResampler | None = None
        self._input_format: tuple[str, str, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("InboundAudio already started")
        self._task = asyncio.create_task(self._read(), name=f"inbound-audio-{self._track.id}")

    async def close(self) -> None:
        """Stop reading (the track itself is left alone); safe to call twice."""
        task = self._task
        if task is None or task.done():
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # close() itself was cancelled, not just the reader

    async def _read(self) -> None:
        try:
            while True:
                try:
                    frame = await self._track.recv()
                except MediaStreamError:  # the track ended
                    break
                assert isinstance(frame, av.AudioFrame)  # an audio track yields audio frames
                self._convert(frame)
            self._flush()
        except Exception:
            # The session keeps running without input audio; the cause must be visible.
            logger.exception("inbound audio from track %s stopped", self._track.id)
            return
        logger.debug("inbound audio track %s ended", self._track.id)
        if self._on_ended is not None:
            self._on_ended()

    def _convert(self, frame: av.AudioFrame) -> None:
        input_format = (frame.format.name, frame.layout.name, frame.sample_rate)
        if input_format != self._input_format:
            # A new resampler is set up from its first frame; flush the old one's tail first.
            self._flush()
            if self._input_format is not None:
                logger.info("inbound audio format changed from %s to %s", self._input_format, input_format)
            self._input_format = input_format
            # Channels are kept through resampling and averaged below: swresample's own
            # stereo→mono downmix sums at -3 dB each, i.e. +3 dB for the identical channels
            # aiortc produces from mono Opus, which pushes loud speech past full scale.
            self._resampler = av.AudioResampler(format="fltp", rate=SPEECH_RATE)
        assert self._resampler is not None
        self._deliver(self._resampler.resample(frame))

    def _flush(self) -> None:
        if self._resampler is not None:
            self._deliver(self._resampler.resample(None))
            self._resampler = None

    def _deliver(self, frames: list[av.AudioFrame]) -> None:
        pcm = [frame.to_ndarray().mean(axis=0, dtype=np.float32) for frame in frames]  # planar: [channels, n]
        if not pcm:
            return
        samples = pcm[0] if len(pcm) == 1 else np.concatenate(pcm)  # one frame out per frame in, nearly always
        if samples.size:
            self._on_audio(samples)
