"""One call's network, both ways: loss, lateness, jitter and RTT, and the outbound FEC that follows them.

Inbound figures come from the call's jitter buffer (``media.playout.PlayoutTrack.stats``); outbound
ones from the peer's RTCP receiver reports about our stream (aiortc's ``remote-inbound-rtp``
stats: cumulative loss, the fraction lost since its last report, and the round-trip time from
our sender reports). aiortc announces no event for RTCP, so :class:`CallNetwork` reads the stats
every ``SAMPLE_INTERVAL_S``: about the peer's own report interval (aiortc and browsers send one
every 0.5-1.5 s), so nothing is missed and nothing is read twice for long.

Each sample:

- tells the outbound encoder the loss to protect against (``OpusTrack.set_expected_loss``): the
  highest fraction the peer reported in the last ``LOSS_MEMORY_SAMPLES`` (5 s), since a fraction
  is over ~50 packets and noisy (at 5 % loss one report says 2 %, the next 8 %);
- logs a warning when the loss of either direction over that window passes ``LOSS_WARNING`` (10 %),
  once until it has fallen back under half of it (a loss hovering around 10 % is one warning);
- reports the figures to an observer (metrics), which also gets them once more at the end.

``response.done`` carries the figures as they stand (``latency.network``: :meth:`annotate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from aiortc import MediaStreamTrack, RTCPeerConnection

from app.realtime.protocol import NetworkLatency, ResponseDoneEvent, event_type
from media.jitter_buffer import ReceiveStats
from media.opus import OpusTrack

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 1.0
LOSS_MEMORY_SAMPLES = 5
LOSS_WARNING = 0.10
# A window needs this many packets expected before its loss share means anything (1 s of 20 ms).
MIN_PACKETS_FOR_SHARE = 50
_RESPONSE_DONE = event_type(ResponseDoneEvent)


@dataclass(frozen=True)
class NetworkFigures:
    """One call's link as of the last sample; counts are cumulative since the call began."""

    inbound_packets_received: int = 0
    inbound_packets_lost: int = 0  # never arrived
    inbound_packets_late: int = 0  # arrived after their frame was concealed: dropped
    inbound_packets_overrun: int = 0  # arrived faster than real time with the jitter buffer full: dropped
    inbound_frames_recovered: int = 0  # rebuilt from the next packet's in-band FEC
    inbound_frames_concealed: int = 0  # made up by Opus PLC
    inbound_jitter_ms: float = 0.0  # RFC 3550 interarrival jitter of the peer's packets
    playout_depth_ms: float = 0.0  # the jitter buffer's deadline depth
    outbound_packets_sent: int = 0
    outbound_packets_lost: int = 0  # as the peer's receiver reports say
    outbound_fraction_lost: float = 0.0  # in the peer's last report
    outbound_fec_loss_percent: int = 0  # the loss our encoder's in-band FEC is tuned for
    rtt_ms: float | None = None  # from the peer's reports on our sender reports; None until known

    @property
    def inbound_packets_expected(self) -> int:
        return self.inbound_packets_received + self.inbound_packets_lost

    def latency_extension(self) -> dict[str, Any]:
        """``response.done``'s ``latency.network`` (``app.realtime.protocol.NetworkLatency``)."""
        return {
            "inbound_packets_lost": self.inbound_packets_lost,
            "inbound_packets_late": self.inbound_packets_late,
            "inbound_packets_overrun": self.inbound_packets_overrun,
            "inbound_frames_recovered": self.inbound_frames_recovered,
            "inbound_frames_concealed": self.inbound_frames_concealed,
            "inbound_jitter_ms": round(self.inbound_jitter_ms, 1),
            "outbound_packets_lost": self.outbound_packets_lost,
            "outbound_fec_loss_percent": self.outbound_fec_loss_percent,
            "rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 1),
        }


class NetworkObserver(Protocol):
    """Who wants a call's network figures (``app.metrics.CallObserver``)."""

    def on_network_sample(self, figures: NetworkFigures) -> None: ...
    def on_network_closed(self, figures: NetworkFigures) -> None: ...


class CallNetwork:
    """Samples one peer connection's audio link; owns the sampling task (``start``/``close``)."""

    def __init__(
        self,
        pc: RTCPeerConnection,
        *,
        name: str,
        outbound: OpusTrack | None = None,
        observer: NetworkObserver | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self._pc = pc
        self._name = name
        self._outbound = outbound
        self._observer = observer
        self._interval_s = interval_s
        self._inbound: ReceiveStats | None = None
        self.figures = NetworkFigures()
        self._history: deque[NetworkFigures] = deque([self.figures], maxlen=LOSS_MEMORY_SAMPLES + 1)
        self._peer_fractions: deque[float] = deque(maxlen=LOSS_MEMORY_SAMPLES)
        self._warned = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def watch_inbound(self, track: MediaStreamTrack) -> None:
        """The call's inbound audio track; its jitter buffer's figures are sampled (aiortc's own track has none)."""
        stats = getattr(track, "stats", None)
        self._inbound = stats if isinstance(stats, ReceiveStats) else None

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("CallNetwork already started")
        self._task = asyncio.create_task(self._run(), name=f"network {self._name}")

    async def close(self) -> None:
        """Stops sampling and reports the last figures to the observer once; safe twice."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            self._update(await self._outbound_stats())
        except Exception:
            logger.exception("call %s: reading RTCP statistics failed", self._name)
        if self._observer is not None:
            self._observer.on_network_closed(self.figures)

    def annotate(self, event: dict[str, Any]) -> NetworkLatency | None:
        """Adds the figures to a ``response.done`` event's latency block and returns them (other
        events are left alone: None)."""
        if event.get("type") == _RESPONSE_DONE and isinstance(event.get("latency"), dict):
            added = self.figures.latency_extension()
            event["latency"]["network"] = added
            return NetworkLatency.model_validate(added)
        return None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                outbound = await self._outbound_stats()
            except Exception:
                # A stats read that fails says nothing about the call: note it and sample again.
                logger.exception("call %s: reading RTCP statistics failed", self._name)
                continue
            self._update(outbound)
            self._follow_loss(outbound)
            if self._observer is not None:
                self._observer.on_network_sample(self.figures)

    async def _outbound_stats(self) -> dict[str, Any]:
        """The audio sender's packets sent and the peer's last report about them."""
        found: dict[str, Any] = {}
        for transceiver in self._pc.getTransceivers():
            if transceiver.kind != "audio" or transceiver.sender is None:
                continue
            for stats in (await transceiver.sender.getStats()).values():
                if stats.type == "outbound-rtp":
                    found["sent"] = stats.packetsSent
                elif stats.type == "remote-inbound-rtp":
                    found["report"] = stats
        return found

    def _update(self, outbound: dict[str, Any]) -> None:
        inbound = self._inbound or ReceiveStats()
        report = outbound.get("report")
        previous = self.figures
        rtt = getattr(report, "roundTripTime", None)
        self.figures = NetworkFigures(
            inbound_packets_received=inbound.packets_received,
            inbound_packets_lost=inbound.packets_lost,
            inbound_packets_late=inbound.packets_late,
            inbound_packets_overrun=inbound.packets_overrun,
            inbound_frames_recovered=inbound.frames_recovered,
            inbound_frames_concealed=inbound.frames_concealed,
            inbound_jitter_ms=inbound.jitter_s * 1000,
            playout_depth_ms=inbound.depth_s * 1000 if self._inbound is not None else 0.0,
            outbound_packets_sent=int(outbound.get("sent", previous.outbound_packets_sent)),
            outbound_packets_lost=max(int(getattr(report, "packetsLost", 0)), 0),
            # aiortc keeps the report's 8-bit fixed-point fraction (RFC 3550 s. 6.4.1).
            outbound_fraction_lost=getattr(report, "fractionLost", 0) / 256,
            outbound_fec_loss_percent=self._outbound.expected_loss_percent if self._outbound is not None else 0,
            rtt_ms=rtt * 1000 if isinstance(rtt, float) else previous.rtt_ms,
        )

    def _follow_loss(self, outbound: dict[str, Any]) -> None:
        if "report" in outbound:
            self._peer_fractions.append(self.figures.outbound_fraction_lost)
        peer_loss = max(self._peer_fractions, default=0.0)
        if self._outbound is not None:
            self._outbound.set_expected_loss(math.ceil(peer_loss * 100))
        self._history.append(self.figures)
        oldest = self._history[0]
        expected = self.figures.inbound_packets_expected - oldest.inbound_packets_expected
        lost = self.figures.inbound_packets_lost - oldest.inbound_packets_lost
        inbound_loss = lost / expected if expected >= MIN_PACKETS_FOR_SHARE else 0.0
        worst = max(inbound_loss, peer_loss)
        if worst > LOSS_WARNING and not self._warned:
            self._warned = True
            logger.warning(
                "call %s: %.0f %% of the peer's audio packets and %.0f %% of ours lost over the last %d s "
                "(a bad network: lost audio is concealed, turns go on)",
                self._name, inbound_loss * 100, peer_loss * 100, LOSS_MEMORY_SAMPLES * self._interval_s,
            )
        elif worst <= LOSS_WARNING / 2:
            self._warned = False
