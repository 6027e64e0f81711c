"""An Opus jitter buffer with a playout deadline: a lost packet costs 20 ms of concealed audio, not a stall.

``AudioJitterBuffer`` takes one Opus stream's packets, arrival-stamped, and gives out its timeline of
20 ms frames (``PlayoutFrame``: decoded, rebuilt from FEC, or concealed with PLC), each frame slot
with a deadline so that the timeline never stops; ``next_deadline()`` says when to ask again.
Audio leaves at most as fast as real time, whatever the timestamps say. Everything here is plain
computation on the times it is given. The rules (the deadline and its depth, concealment, gaps,
the release budget, the bound on packets waiting) and why: docs/NETWORK.md, "Inbound: the jitter
buffer".
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from media.libopus import OpusDecoder, OpusError, carries_fec
from media.rates import WIRE_RATE

logger = logging.getLogger(__name__)

DELAY_WINDOW = 100  # packets of transit offsets kept: 2 s of 20 ms packets
MIN_DEPTH_S = 0.03  # one 20 ms frame for the next packet's FEC, and 10 ms of timer and loop slack
START_DEPTH_S = 0.04  # until DEPTH_MIN_PACKETS have measured the jitter
MAX_DEPTH_S = 0.12
DEPTH_SLACK_S = 0.005  # the loop's timer lateness (media/pacing.py: p99 ~5 ms)
DEPTH_MIN_PACKETS = 10
MAX_IDLE_CONCEAL_S = 0.2
MAX_FILL_S = 1.0
# Release budget (docs/NETWORK.md): seconds of audio per second of real time, and the
# most it saves up: an outage's fill (MAX_FILL_S), or a stalled loop's unread packets for twice the
# 2 s after which the front stops placing calls on a silent worker.
RELEASE_RATE = 1.05
MAX_RELEASE_BURST_S = 4.0
DEFAULT_FRAME_SAMPLES = 960  # 20 ms at 48 kHz: every browser's Opus ptime
# Opus concealment and FEC work in multiples of 2.5 ms.
_GRANULE = WIRE_RATE // 400
_RECENT_SEQUENCES = 128  # decoded sequence numbers remembered to tell duplicates from late packets
# A sequence number this far from the expected one is a new stream (a sender restart), not loss.
_MAX_SEQUENCE_JUMP = 3000
# Packets waiting for their playout: 10 s of 20 ms frames. A peer keeps at most the depth (6) plus
# a burst here; playout releases at most in real time (the release budget), so without this bound
# one sending faster would grow the buffer without end. Past it, arrivals are dropped and counted.
MAX_BUFFERED_PACKETS = 500

Origin = Literal["packet", "fec", "plc"]


@dataclass(frozen=True)
class PlayoutFrame:
    """Decoded or concealed audio for one slot of the timeline: int16 mono at 48 kHz."""

    pcm: np.ndarray
    timestamp: int  # RTP time of its first sample, counted from the stream's first packet
    origin: Origin  # its own packet, the next packet's FEC, or packet loss concealment


@dataclass
class ReceiveStats:
    """What one stream's packets went through; counts since the stream began."""

    packets_received: int = 0  # each distinct packet that arrived (late ones too)
    packets_expected: int = 0  # sequence numbers from the first to the highest received
    packets_late: int = 0  # arrived after their slot was concealed: dropped
    packets_duplicate: int = 0
    packets_overrun: int = 0  # arrived with MAX_BUFFERED_PACKETS waiting (sent faster than real time): dropped
    frames_decoded: int = 0
    frames_recovered: int = 0  # missing frames rebuilt from the next packet's in-band FEC
    frames_concealed: int = 0  # missing frames made up by Opus PLC
    jitter_s: float = 0.0  # RFC 3550 interarrival jitter
    depth_s: float = START_DEPTH_S  # the playout deadline's depth now

    @property
    def packets_lost(self) -> int:
        """Never arrived (RFC 3550's cumulative loss): late packets are not lost, only too late."""
        return max(self.packets_expected - self.packets_received, 0)


@dataclass(frozen=True)
class _Packet:
    sequence: int  # extended past 16 bits
    timestamp: int  # extended past 32 bits, from the first packet
    payload: bytes


@dataclass
class _Clock:
    """Transit offsets of the last packets: the deadline's base and depth."""

    offsets: deque[float] = field(default_factory=lambda: deque(maxlen=DELAY_WINDOW))
    base: float = 0.0
    depth: float = START_DEPTH_S

    def rebase(self) -> None:
        """Forget every offset but the newest: a packet came after its slot was concealed, so the
        stream now comes later than the fastest packets remembered said (a sender that stalled with
        its timestamps going on, a longer route); the next faster packet takes the base down again."""
        newest = self.offsets[-1]
        self.offsets.clear()
        self.offsets.append(newest)
        self.base = newest

    def add(self, offset: float, frame_s: float) -> None:
        self.offsets.append(offset)
        self.base = min(self.offsets)
        if len(self.offsets) >= DEPTH_MIN_PACKETS:
            spread = max(self.offsets) - self.base
            self.depth = min(max(frame_s + spread + DEPTH_SLACK_S, MIN_DEPTH_S), MAX_DEPTH_S)


class AudioJitterBuffer:
    """One Opus stream's packets in, its timeline of 20 ms frames out (docs/NETWORK.md).

    ``push`` each packet with its arrival time; ``pop(now)`` returns the frames released by then,
    in order; ``next_deadline()`` says when ``pop`` has something new to say without a new packet.
    """

    def __init__(self, decoder: OpusDecoder | None = None, *, rate: int = WIRE_RATE) -> None:
        self._decoder = decoder or OpusDecoder(rate)
        self._rate = rate
        self.stats = ReceiveStats()
        self._clock = _Clock()
        self._buffer: dict[int, _Packet] = {}  # by extended sequence number
        self._started = False
        self._first_sequence = 0
        self._highest_sequence = 0
        self._timestamp_origin = 0  # RTP timestamp of the first packet
        self._last_timestamp = 0  # extended, of the highest packet: unwraps the next one
        self._next_timestamp = 0  # playout position: the first sample not yet released
        self._frame_samples = DEFAULT_FRAME_SAMPLES
        self._idle_concealed = 0  # samples concealed in a row with nothing buffered
        self._idle_concealed_at = float("-inf")  # when the last of them was
        self._decoded: deque[int] = deque(maxlen=_RECENT_SEQUENCES)
        self._last_arrival: tuple[float, int] | None = None  # arrival, timestamp: RFC 3550 jitter
        self._budget = 0.0  # samples that may still be released (the release budget); set at the first packet
        self._budget_at = 0.0  # when it was last topped up

    @property
    def depth_s(self) -> float:
        return self._clock.depth

    def push(self, sequence_number: int, timestamp: int, payload: bytes, arrival: float) -> None:
        """One RTP packet (16-bit sequence number, 32-bit timestamp, Opus payload), arrived at ``arrival``."""
        if not payload:
            return  # an empty payload carries no audio (RFC 7587 allows none); the slot stays missing
        if not self._started:
            self._start(sequence_number, timestamp)
            self._budget, self._budget_at = self._clock.depth * self._rate, arrival
        sequence = self._extend_sequence(sequence_number)
        if abs(sequence - self._highest_sequence) > _MAX_SEQUENCE_JUMP:
            logger.info("RTP sequence jumped by %d: a new stream, playout restarts", sequence - self._highest_sequence)
            self._restart(sequence_number, timestamp)
            sequence = self._extend_sequence(sequence_number)
        stamp = self._extend_timestamp(timestamp)
        if sequence in self._buffer or sequence in self._decoded:
            self.stats.packets_duplicate += 1
            return
        self.stats.packets_received += 1
        if sequence > self._highest_sequence:
            self._highest_sequence = sequence
            self._last_timestamp = stamp
        self.stats.packets_expected = self._highest_sequence - self._first_sequence + 1
        self._measure(stamp, arrival)
        if stamp < self._next_timestamp:
            self.stats.packets_late += 1
            self._clock.rebase()
            return
        if len(self._buffer) >= MAX_BUFFERED_PACKETS:
            if not self.stats.packets_overrun:
                logger.warning("%d RTP packets wait for playout: the peer sends audio faster than real time; "
                               "dropping what comes until they play", len(self._buffer))
            self.stats.packets_overrun += 1
            return
        self._buffer[sequence] = _Packet(sequence, stamp, payload)

    def next_deadline(self) -> float | None:
        """When ``pop`` will release or conceal the next frame without another packet; None: not
        until a packet arrives. A time in the past means now."""
        if not self._started:
            return None
        head = self._head()
        if head is not None and head.timestamp < self._next_timestamp + _GRANULE:
            return self._budget_due()
        if head is None:
            if self._idle_concealed >= MAX_IDLE_CONCEAL_S * self._rate:
                return None
            return max(self._deadline(self._next_timestamp), self._idle_concealed_at + self._frame_samples / self._rate,
                       self._budget_due())
        return max(self._deadline(self._next_timestamp), self._budget_due())

    def pop(self, now: float) -> list[PlayoutFrame]:
        """Every frame released by ``now``, in timeline order."""
        frames: list[PlayoutFrame] = []
        self._top_up(now)
        while self._started and self._budget > 0:
            head = self._head()
            if head is not None and head.timestamp < self._next_timestamp + _GRANULE:
                frames.extend(self._play(head))
                continue
            if now < self._deadline(self._next_timestamp):
                break
            if head is None:
                paused = self._idle_concealed >= MAX_IDLE_CONCEAL_S * self._rate
                if paused or now < self._idle_concealed_at + self._frame_samples / self._rate:
                    break
                self._idle_concealed_at = now
                frames.append(self._conceal(self._frame_samples, idle=True))
                continue
            gap = head.timestamp - self._next_timestamp
            if gap > MAX_FILL_S * self._rate:
                logger.debug("audio resumes after %.1f s without packets: the timeline jumps", gap / self._rate)
                self._next_timestamp = head.timestamp
                continue
            samples = min(self._frame_samples, gap - gap % _GRANULE)
            if samples == gap and carries_fec(head.payload):
                frames.append(self._recover(head, samples))
            else:
                frames.append(self._conceal(samples, idle=False))
        self.stats.depth_s = self._clock.depth
        return frames

    def close(self) -> None:
        self._decoder.close()

    # -- internals ---------------------------------------------------------------------------

    def _start(self, sequence_number: int, timestamp: int) -> None:
        self._started = True
        self._first_sequence = self._highest_sequence = sequence_number
        self._timestamp_origin = timestamp
        self._last_timestamp = self._next_timestamp = 0

    def _restart(self, sequence_number: int, timestamp: int) -> None:
        """A new stream: keep the timeline going from where it is, at the new packet."""
        self._buffer.clear()
        self._decoded.clear()
        # Counted on from the packets expected so far, as if the new stream had followed on.
        self._first_sequence = sequence_number - self.stats.packets_expected
        self._highest_sequence = sequence_number
        self._timestamp_origin = (timestamp - self._next_timestamp) & 0xFFFFFFFF
        self._last_timestamp = self._next_timestamp
        self._clock = _Clock()
        self._last_arrival = None

    def _extend_sequence(self, sequence_number: int) -> int:
        """The 16-bit number nearest to the highest seen, unwrapped."""
        delta = (sequence_number - self._highest_sequence) & 0xFFFF
        if delta >= 0x8000:
            delta -= 0x10000
        return self._highest_sequence + delta

    def _extend_timestamp(self, timestamp: int) -> int:
        """The 32-bit timestamp nearest to the highest packet's, unwrapped, from the first packet's."""
        delta = (timestamp - self._timestamp_origin - self._last_timestamp) & 0xFFFFFFFF
        if delta >= 0x80000000:
            delta -= 0x100000000
        return self._last_timestamp + delta

    def _measure(self, stamp: int, arrival: float) -> None:
        self._clock.add(arrival - stamp / self._rate, self._frame_samples / self._rate)
        if self._last_arrival is not None:
            last_arrival, last_stamp = self._last_arrival
            difference = (arrival - last_arrival) - (stamp - last_stamp) / self._rate
            self.stats.jitter_s += (abs(difference) - self.stats.jitter_s) / 16
        self._last_arrival = (arrival, stamp)

    def _top_up(self, now: float) -> None:
        """The release budget at ``now``: RELEASE_RATE seconds of audio per second since the last
        top-up, at most MAX_RELEASE_BURST_S saved (a clock read earlier than the last adds nothing)."""
        if now > self._budget_at:
            self._budget = min(self._budget + (now - self._budget_at) * RELEASE_RATE * self._rate,
                               MAX_RELEASE_BURST_S * self._rate)
            self._budget_at = now

    def _budget_due(self) -> float:
        """When the release budget is above zero again (a time in the past: it is now)."""
        if self._budget > 0:
            return float("-inf")
        return self._budget_at + (1 - self._budget) / (RELEASE_RATE * self._rate)

    def _deadline(self, stamp: int) -> float:
        return self._clock.base + stamp / self._rate + self._clock.depth

    def _head(self) -> _Packet | None:
        return self._buffer[min(self._buffer)] if self._buffer else None

    def _play(self, packet: _Packet) -> list[PlayoutFrame]:
        """Decode the next packet in order; a gap of less than 2.5 ms before it is not worth concealing."""
        del self._buffer[packet.sequence]
        self._decoded.append(packet.sequence)
        self._idle_concealed = 0
        self._idle_concealed_at = float("-inf")
        try:
            pcm = self._decoder.decode(packet.payload)
        except OpusError as exc:
            # A corrupt packet is lost data, not a broken stream: conceal its frame.
            logger.warning("undecodable Opus packet %d concealed: %s", packet.sequence, exc)
            return [self._conceal(self._frame_samples, idle=False)]
        self.stats.frames_decoded += 1
        self._frame_samples = len(pcm) or self._frame_samples
        self._budget -= len(pcm)
        start = max(packet.timestamp, self._next_timestamp)
        self._next_timestamp = packet.timestamp + len(pcm)
        return [PlayoutFrame(pcm, start, "packet")]

    def _recover(self, next_packet: _Packet, samples: int) -> PlayoutFrame:
        try:
            pcm = self._decoder.decode_fec(next_packet.payload, samples)
        except OpusError as exc:
            # Its FEC flag was set but the packet is corrupt (a peer's malformed packet after a loss
            # raised out of pop() here and stopped the call's inbound audio): conceal the slot.
            logger.warning("undecodable FEC in Opus packet %d: the frame before it is concealed: %s",
                           next_packet.sequence, exc)
            return self._conceal(samples, idle=False)
        self.stats.frames_recovered += 1
        return self._advance(pcm, "fec")

    def _conceal(self, samples: int, *, idle: bool) -> PlayoutFrame:
        pcm = self._decoder.conceal(samples)
        self.stats.frames_concealed += 1
        if idle:
            self._idle_concealed += len(pcm)
        return self._advance(pcm, "plc")

    def _advance(self, pcm: np.ndarray, origin: Origin) -> PlayoutFrame:
        frame = PlayoutFrame(pcm, self._next_timestamp, origin)
        self._next_timestamp += len(pcm)
        self._budget -= len(pcm)
        return frame
