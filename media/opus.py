"""Outbound Opus encoding in the track itself: aiortc's sender gets one packet per 20 ms frame.

aiortc's sender, given raw audio frames, does three things per 20 ms frame that a voice
server does not need (profiled at 12 calls on one core, issue 16):

- computes the RFC 6465 audio level in a pure-Python loop over the 960 samples (~45 µs a frame);
- hands every frame to a thread pool to encode and awaits the result (a future chained across
  threads, two loop wake-ups and lock traffic per frame);
- upmixes our mono to stereo and encodes stereo at 96 kbit/s (~100 µs a frame for speech).

Given pre-encoded packets (``av.Packet``) instead, it only packs them: no audio level (the
header extension is optional; SFUs use it, a browser peer does not), no thread hop. Encoding
mono inline costs ~50 µs a frame for speech, ~30 µs for silence: under 0.3 % of a core per
call, on the loop that already waits for the frame. Opus packets say their channel count
themselves, so a peer that negotiated ``opus/48000/2`` decodes mono packets as it always does.
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.rates import WIRE_RATE

# Mono speech at 48 kbit/s is transparent for Code2Wav's 24 kHz voice (content below 12 kHz);
# aiortc's own encoder spends 96 kbit/s on a stereo copy of the same signal.
OPUS_BITRATE = 48_000
_TIME_BASE = Fraction(1, WIRE_RATE)


class OpusTrack(MediaStreamTrack):
    """Wraps a paced 48 kHz mono s16 audio track; ``recv()`` returns its frames Opus-encoded.

    Stopping this track stops the source (aiortc's sender stops the track it was given).
    """

    kind = "audio"

    def __init__(self, source: MediaStreamTrack, *, bitrate: int = OPUS_BITRATE) -> None:
        super().__init__()
        self._source = source
        self._encoder = av.CodecContext.create("libopus", "w")
        self._encoder.bit_rate = bitrate
        self._encoder.format = "s16"
        self._encoder.layout = "mono"
        self._encoder.sample_rate = WIRE_RATE
        self._encoder.time_base = _TIME_BASE
        self._encoder.options = {"application": "voip"}  # as aiortc's encoder: tuned for speech
        self._pending: deque[av.Packet] = deque()

    async def recv(self) -> av.Packet:  # aiortc's sender takes packets as well as frames
        if self.readyState != "live":
            raise MediaStreamError
        while not self._pending:
            frame = await self._source.recv()
            assert isinstance(frame, av.AudioFrame)  # an audio track yields audio frames
            # libopus returns one packet per 960-sample frame; each is stamped with its frame's
            # pts, so RTP timestamps follow the source's clock (pts = samples sent).
            for packet in self._encoder.encode(frame):
                packet.pts = frame.pts
                packet.time_base = _TIME_BASE
                self._pending.append(packet)
        return self._pending.popleft()

    def stop(self) -> None:
        super().stop()
        self._source.stop()
