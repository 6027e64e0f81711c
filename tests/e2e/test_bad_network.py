"""A call over a bad network (tests/netem.py): 10 % loss, 30 ms of jitter, reordering and duplicates
both ways. Every utterance is still answered, and the loss shows where an operator looks.

One call of two utterances is recorded once for the module; each test checks one thing it shows.
How much audio the loss costs, and how late turns commit, is measured by tests/bench/network.py.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import read_utterance
from app.client.turn import TurnResult
from app.client.webrtc import RealtimeClient
from media.jitter_buffer import ReceiveStats
from tests.netem import DirectionCounts, ImpairedRelay, Impairment

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SESSION = {"type": "realtime", "max_output_tokens": 24}
BAD = Impairment(loss=0.10, delay_ms=10, jitter_ms=30, duplicate=0.01)


@dataclass(frozen=True)
class BadCall:
    turns: list[TurnResult]
    received: ReceiveStats
    up: DirectionCounts
    down: DirectionCounts
    metrics: str


@pytest.fixture(scope="module")
async def bad_call(server_url: str) -> BadCall:
    async with ImpairedRelay(up=BAD, down=BAD, seed=27) as relay:
        client = RealtimeClient(
            server_url, session=SESSION, ice_loopback=True, offer_candidates=False, answer_filter=relay.route_answer
        )
        async with client:
            turns = [await client.speak(read_utterance(FIXTURES / name)) for name in ("hello.wav", "weather.wav")]
            assert client.receive_stats is not None
            received = client.receive_stats
    with urllib.request.urlopen(f"{server_url}/metrics", timeout=10) as response:
        metrics = (await asyncio.to_thread(response.read)).decode()
    return BadCall(turns, received, relay.up.counts, relay.down.counts, metrics)


def test_the_relay_really_lost_packets_both_ways(bad_call: BadCall) -> None:
    for counts in (bad_call.up, bad_call.down):
        assert counts.packets > 100
        assert counts.lost > 0.05 * counts.packets


def test_every_utterance_is_answered(bad_call: BadCall) -> None:
    # The dev model's answers end completed or at the session's token limit (incomplete).
    assert all(turn.status in ("completed", "incomplete") for turn in bad_call.turns)
    assert all(turn.audible_seconds > 0 for turn in bad_call.turns)


def test_response_done_reports_the_calls_inbound_loss_and_its_concealment(bad_call: BadCall) -> None:
    done = [event for event in bad_call.turns[-1].events if event["type"] == "response.done"]
    network = done[-1]["latency"]["network"]
    assert network["inbound_packets_lost"] > 0
    assert network["inbound_frames_recovered"] + network["inbound_frames_concealed"] > 0
    assert network["inbound_jitter_ms"] > 0


def test_the_client_conceals_the_answers_lost_packets(bad_call: BadCall) -> None:
    assert bad_call.received.packets_lost > 0
    assert bad_call.received.frames_recovered + bad_call.received.frames_concealed > 0


def test_metrics_count_the_lost_and_repaired_packets(bad_call: BadCall) -> None:
    def value(pattern: str) -> float:
        found = re.search(pattern + r" ([0-9.e+]+)$", bad_call.metrics, re.MULTILINE)
        assert found is not None, pattern
        return float(found.group(1))

    assert value(r'omni_rtc_inbound_audio_packets_total\{outcome="lost"\}') > 0
    assert value(r'omni_rtc_inbound_audio_frames_repaired_total\{method="plc"\}') + value(
        r'omni_rtc_inbound_audio_frames_repaired_total\{method="fec"\}'
    ) > 0
