"""Speculative answers end to end: the real server (dev model, its media workers), a real aiortc
client speaking the turn-taking fixtures in real time.

A finished sentence is answered by the answer started at its silence's first quiet window
(``response.done`` says ``speculative``). A paused sentence, under server VAD with a wait longer
than its pause, starts a speculation at the pause that the speech after it discards: no event of
it reaches the client, and the one turn is answered once. ``/metrics`` counts both (the workers
report every 0.5 s, so the counts are read once they have moved).
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.cli import read_utterance
from app.client.turn import TurnResult
from app.client.webrtc import RealtimeClient

pytestmark = pytest.mark.e2e

TURNS = Path(__file__).resolve().parents[1] / "fixtures" / "turns"
FINISHED = TURNS / "finished_03_slt85.wav"
# "I can't come today because … my car broke down.": a 1,000 ms pause (manifest.json).
PAUSED = TURNS / "paused_03_slt85.wav"
SESSION = {"type": "realtime", "max_output_tokens": 24}
# Server VAD waiting longer than the paused fixture's pause: the pause is a candidate, not a turn.
PATIENT = {**SESSION, "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 1500}}}}
OUTCOMES = ("started", "used", "discarded", "refused", "preempted")
METRICS_DEADLINE_S = 10.0  # a guard: the workers report every 0.5 s


def speculation_counts(server_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{server_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts = {}
    for outcome in OUTCOMES:
        found = re.search(rf'^omni_rtc_speculative_responses_total{{outcome="{outcome}"}} ([0-9.e+]+)$', text, re.M)
        counts[outcome] = float(found.group(1)) if found else 0.0
    return counts


async def counts_once_moved(server_url: str, before: dict[str, float], outcome: str, by: int) -> dict[str, float]:
    give_up = time.monotonic() + METRICS_DEADLINE_S
    while True:
        counts = await asyncio.to_thread(speculation_counts, server_url)
        if counts[outcome] - before[outcome] >= by or time.monotonic() > give_up:
            return counts
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class Spoken:
    turn: TurnResult
    before: dict[str, float]
    after: dict[str, float]

    def moved(self, outcome: str) -> float:
        return self.after[outcome] - self.before[outcome]


async def speak(server_url: str, fixture: Path, session: dict) -> Spoken:
    before = await asyncio.to_thread(speculation_counts, server_url)
    async with RealtimeClient(server_url, ice_loopback=True, session=session) as client:
        turn = await client.speak(read_utterance(fixture))
    return Spoken(turn, before, await counts_once_moved(server_url, before, "used", 1))


@pytest.fixture(scope="module")
async def finished(server_url: str) -> Spoken:
    return await speak(server_url, FINISHED, SESSION)


@pytest.fixture(scope="module")
async def paused(server_url: str) -> Spoken:
    return await speak(server_url, PAUSED, PATIENT)


def latency(spoken: Spoken) -> dict:
    (done,) = [event for event in spoken.turn.events if event["type"] == "response.done"]
    return done["latency"]


async def test_a_finished_sentence_is_answered_by_its_speculative_answer(finished: Spoken) -> None:
    assert finished.turn.status in ("completed", "incomplete")
    assert finished.turn.audio_seconds > 0
    assert latency(finished)["speculative"] is True
    assert latency(finished)["speculation_hidden_ms"] > 0
    assert finished.moved("used") == 1


async def test_a_paused_sentences_speculation_at_the_pause_is_discarded_unseen_and_the_turn_answered_once(
    paused: Spoken,
) -> None:
    types = [event["type"] for event in paused.turn.events]
    assert types.count("input_audio_buffer.speech_started") == 1
    assert types.count("input_audio_buffer.committed") == 1  # one turn across the 1 s pause
    assert types.count("response.created") == 1 and types.count("response.done") == 1
    committed = types.index("input_audio_buffer.committed")
    assert not [kind for kind in types[:committed] if kind.startswith(("response.", "output_audio_buffer."))]
    assert paused.moved("discarded") >= 1  # the pause's speculation
    assert paused.moved("used") == 1 and latency(paused)["speculative"] is True
    assert paused.turn.status in ("completed", "incomplete")
