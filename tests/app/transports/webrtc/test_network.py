"""CallNetwork: what a call's RTCP reports and jitter buffer say, where they go."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiortc.mediastreams import AudioStreamTrack

from app.realtime.protocol import NetworkLatency
from app.transports.webrtc.network import CallNetwork, NetworkFigures
from media.jitter_buffer import ReceiveStats
from media.opus import OpusTrack


class FakeSender:
    """An audio sender whose peer reported ``fraction_lost`` (RFC 3550's 8-bit fraction)."""

    def __init__(self, fraction_lost: int) -> None:
        self.fraction_lost = fraction_lost

    async def getStats(self) -> dict[str, Any]:
        return {
            "out": SimpleNamespace(type="outbound-rtp", packetsSent=500),
            "remote": SimpleNamespace(type="remote-inbound-rtp", packetsLost=50, fractionLost=self.fraction_lost,
                                      roundTripTime=0.042),
        }


class FakePeer:
    def __init__(self, fraction_lost: int = 0) -> None:
        self.sender = FakeSender(fraction_lost)

    def getTransceivers(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(kind="audio", sender=self.sender)]


class Samples:
    def __init__(self) -> None:
        self.figures: list[NetworkFigures] = []
        self.closed: list[NetworkFigures] = []
        self.sampled = asyncio.Event()

    def on_network_sample(self, figures: NetworkFigures) -> None:
        self.figures.append(figures)
        self.sampled.set()

    def on_network_closed(self, figures: NetworkFigures) -> None:
        self.closed.append(figures)


def lossy_inbound(lost: int, of: int, overrun: int = 0) -> SimpleNamespace:
    return SimpleNamespace(stats=ReceiveStats(packets_received=of - lost, packets_expected=of, frames_concealed=lost,
                                              packets_overrun=overrun))


async def sampled_once(network: CallNetwork, samples: Samples) -> None:
    network.start()
    await asyncio.wait_for(samples.sampled.wait(), 5)


async def test_the_outbound_fec_follows_the_loss_the_peer_reports() -> None:
    opus = OpusTrack(AudioStreamTrack())
    samples = Samples()
    network = CallNetwork(FakePeer(fraction_lost=26), name="t", outbound=opus, observer=samples, interval_s=0.01)
    await sampled_once(network, samples)
    await network.close()
    assert opus.expected_loss_percent == 11  # 26/256 = 10.2 %, rounded up
    figures = samples.figures[0]
    assert (figures.outbound_packets_sent, figures.outbound_packets_lost, figures.rtt_ms) == (500, 50, 42.0)
    opus.stop()


async def test_a_call_losing_more_than_a_tenth_of_its_packets_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    samples = Samples()
    network = CallNetwork(FakePeer(), name="rtc_lossy", observer=samples, interval_s=0.01)
    network.watch_inbound(lossy_inbound(lost=15, of=100))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="app.transports.webrtc.network"):
        await sampled_once(network, samples)
        while len(samples.figures) < 3:
            samples.sampled.clear()
            await asyncio.wait_for(samples.sampled.wait(), 5)
        await network.close()
    warnings = [record.getMessage() for record in caplog.records if "rtc_lossy" in record.getMessage()]
    assert len(warnings) == 1 and "15 %" in warnings[0]


async def test_response_done_carries_the_figures_and_close_reports_them_once() -> None:
    samples = Samples()
    network = CallNetwork(FakePeer(), name="t", observer=samples, interval_s=0.01)
    network.watch_inbound(lossy_inbound(lost=3, of=100, overrun=7))  # type: ignore[arg-type]
    await sampled_once(network, samples)
    done = {"type": "response.done", "latency": {"end_of_speech_to_first_audio_ms": 500.0}}
    other = {"type": "response.created"}
    added = network.annotate(done)
    assert network.annotate(other) is None
    assert done["latency"]["network"]["inbound_packets_lost"] == 3
    assert done["latency"]["network"]["inbound_packets_overrun"] == 7
    assert done["latency"]["network"]["rtt_ms"] == 42.0
    # The protocol's schema for it; what the call hands its session for the turn's report.
    assert added == NetworkLatency.model_validate(done["latency"]["network"])
    assert other == {"type": "response.created"}
    await network.close()
    await network.close()
    assert len(samples.closed) == 1
