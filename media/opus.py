"""Outbound Opus encoding in the track itself: aiortc's sender gets one packet per 20 ms frame.

aiortc's sender, given raw audio frames, does three things per 20 ms frame that a voice
server does not need (profiled at 12 calls on one core):

- computes the RFC 6465 audio level in a pure-Python loop over the 960 samples (~45 µs a frame);
- hands every frame to a thread pool to encode and awaits the result (a future chained across
  threads, two loop wake-ups and lock traffic per frame);
- upmixes our mono to stereo and encodes stereo at 96 kbit/s (~100 µs a frame for speech).

Given pre-encoded packets (``av.Packet``) instead, it only packs them: no audio level (the
header extension is optional; SFUs use it, a browser peer does not), no thread hop. Encoding
mono inline costs ~50 µs a frame for speech, ~30 µs for silence: under 0.3 % of a core per
call, on the loop that already waits for the frame. Opus packets say their channel count
themselves, so a peer that negotiated ``opus/48000/2`` decodes mono packets as it always does.

The encoder is libopus itself (``media.libopus``), not PyAV's: FFmpeg's encoder fixes its expected
packet loss when it is opened, and in-band FEC is worth its bits only in proportion to the loss the
peer reports. ``set_expected_loss`` (the call's RTCP receiver reports, ``app/transports/webrtc/network.py``)
retunes it between two packets; at 0 % libopus sends no FEC at all. Pacing is unchanged: one
packet per source frame, stamped with the frame's pts.
"""

from __future__ import annotations

from fractions import Fraction

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.libopus import OpusEncoder
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
        self._encoder = OpusEncoder(bitrate=bitrate, rate=WIRE_RATE)  # VoIP: tuned for speech, as aiortc's

    @property
    def expected_loss_percent(self) -> int:
        return self._encoder.expected_loss_percent

    def set_expected_loss(self, percent: int) -> None:
        """The share of packets the peer reports lost, 0-100: the strength of the in-band FEC."""
        self._encoder.set_expected_loss(percent)

    async def recv(self) -> av.Packet:  # aiortc's sender takes packets as well as frames
        if self.readyState != "live":
            raise MediaStreamError
        frame = await self._source.recv()
        assert isinstance(frame, av.AudioFrame)  # an audio track yields audio frames
        if self.readyState != "live":  # stopped while waiting for the frame: the encoder is gone
            raise MediaStreamError
        # One packet per 20 ms frame, stamped with the frame's pts, so RTP timestamps follow the
        # source's clock (pts = samples sent).
        packet = av.Packet(self._encoder.encode(frame.to_ndarray().reshape(-1)))
        packet.pts = frame.pts
        packet.time_base = _TIME_BASE
        return packet

    def stop(self) -> None:
        super().stop()
        self._source.stop()
        self._encoder.close()
