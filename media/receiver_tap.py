"""The one place omni-rtc reaches into aiortc's audio receiver: its packets go to our jitter buffer.

Why: aiortc's ``RTCRtpReceiver`` keeps its jitter buffer private and decodes in a thread of its
own; that buffer releases contiguous packets only, so a lost packet stalls the audio for 320 ms
and is then skipped, never concealed (media/jitter_buffer.py). aiortc has no option or hook for
another buffer, so this replaces the private attribute with a *tap*: an object with the buffer's
``add(packet)`` signature that hands each depacketized packet (sequence number, timestamp, Opus
payload) on, arrival-stamped, and releases nothing to aiortc's decoder. Everything else the
receiver does stays: RTCP receiver reports and their loss and jitter figures (fed before the
buffer), SSRC bookkeeping, and the end of its track when the peer or the connection goes.

The private name and the ``add`` contract were read in aiortc 1.16 (``media.aiortc_version``; pyproject.toml
pins the same range): another version is refused with a message that says so, rather than poked
blindly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import aiortc
from aiortc import RTCRtpReceiver
from aiortc.rtp import RtpPacket

from media.aiortc_version import check_aiortc

_ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"


class PacketSink(Protocol):
    def __call__(self, sequence_number: int, timestamp: int, payload: bytes, arrival: float) -> None: ...


class _Tap:
    """Stands where aiortc's ``JitterBuffer`` stood; ``add`` returns (no PLI, no frame), as a buffer
    still waiting would."""

    def __init__(self, sink: PacketSink, clock: Callable[[], float]) -> None:
        self._sink = sink
        self._clock = clock

    def add(self, packet: RtpPacket) -> tuple[bool, None]:
        payload = getattr(packet, "_data", b"")  # the receiver's depacketized payload (Opus: the payload itself)
        self._sink(packet.sequence_number, packet.timestamp, bytes(payload), self._clock())
        return False, None


def check_receiver_tap(version: str = aiortc.__version__) -> None:
    """Raises ``UnsupportedAiortc`` unless ``version`` is one the tap was checked against."""
    check_aiortc(
        "omni-rtc's jitter buffer (media/receiver_tap.py, in aiortc's audio receiver)",
        version,
        way_out="run with OMNI_RTC_JITTER_BUFFER=false to use aiortc's own receive path",
    )


def tap_audio_receiver(
    receiver: RTCRtpReceiver, sink: PacketSink, *, clock: Callable[[], float] = time.monotonic
) -> None:
    """Route ``receiver``'s packets to ``sink`` instead of aiortc's jitter buffer and decoder.

    Call before media flows (after ``setRemoteDescription``, or when the transceiver is made).
    The receiver's track then yields no frames; it still ends when the receiver stops.
    """
    check_receiver_tap()
    if getattr(receiver, "_RTCRtpReceiver__kind", None) != "audio" or not hasattr(receiver, _ATTRIBUTE):
        raise TypeError(f"expected an aiortc audio RTCRtpReceiver with a jitter buffer, got {receiver!r}")
    setattr(receiver, _ATTRIBUTE, _Tap(sink, clock))
