"""A real room over WebRTC: the answer's own echo, a backchannel and a real interruption.

The real server in this process with an engine that answers in a recorded voice (the espeak-ng
stories, so that the VAD hears the answer as speech), and a real aiortc client talking in real
time. A speakerphone client plays what it receives back into its microphone (150 ms, -12 dB, a
200 ms reverb) with no echo cancellation of its own.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import soxr

from app.client.webrtc import RealtimeClient, Speakerphone
from app.config import Settings
from app.http.server import create_app
from media.rates import SPEECH_RATE, VOICE_RATE
from tests.e2e.conftest import serving_in_process
from tests.fakes import CODEC_FRAME_SAMPLES, ScriptedEngine
from tests.speech import load_fixture

pytestmark = pytest.mark.e2e

REPLY_WORDS = 100  # 100 codec frames: 8 s of the recorded voice, generated in 4 s
TURN_S = 60.0  # a guard against hangs, not a speed limit
BARGE_IN = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": True}}}}


class SpeakingEngine(ScriptedEngine):
    """A scripted engine whose audio is a recorded voice: each codec frame is the next 80 ms of it."""

    def __init__(self, words: int = REPLY_WORDS) -> None:
        reply = " ".join(f"word{n}" for n in range(words))
        super().__init__(reply, text_first=True, frames_per_chunk=5, chunk_interval_s=0.2)
        story = np.concatenate([load_fixture("five_second_story"), load_fixture("long_story")])
        self._voice = soxr.resample(story, SPEECH_RATE, VOICE_RATE).astype(np.float32)
        self._at = 0

    def frame(self) -> np.ndarray:
        if self._at + CODEC_FRAME_SAMPLES > self._voice.size:
            self._at = 0
        chunk = self._voice[self._at : self._at + CODEC_FRAME_SAMPLES]
        self._at += CODEC_FRAME_SAMPLES
        return chunk


@pytest_asyncio.fixture(loop_scope="function")
async def server_url(tmp_path: Path) -> AsyncIterator[str]:
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=SpeakingEngine())
    async with serving_in_process(app) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="function")
async def long_answer_server_url(tmp_path: Path) -> AsyncIterator[str]:
    """A server whose answers are still being generated 12 s after they start: an interruption
    a few seconds in cancels the response (``turn_detected``) however late a loaded run hears
    it. With the 4 s answers of ``server_url`` one confirmed more than ~1 s late found the
    response completed, and cut only its audio (``output_audio_buffer.cleared``)."""
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=SpeakingEngine(words=3 * REPLY_WORDS))
    async with serving_in_process(app) as url:
        yield url


def read_metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return response.read().decode()


async def counter(url: str, name: str) -> float:
    text = await asyncio.to_thread(read_metrics, url)  # the server runs on this loop
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def answer_playing(client: RealtimeClient, question: np.ndarray) -> dict[str, Any]:
    """Asks, and returns once the answer's audio has started."""
    start = len(client.events)
    await client.say(question)
    return await client.wait_for(lambda event: event["type"] == "output_audio_buffer.started", start=start,
                                 timeout_s=TURN_S)


def outcome(client: RealtimeClient, response_id: str) -> str:
    done = next(event for event in client.events
                if event["type"] == "response.done" and event["response"]["id"] == response_id)
    cleared = any(event["type"] == "output_audio_buffer.cleared" and event["response_id"] == response_id
                  for event in client.events)
    return "cut" if cleared or done["response"]["status"] != "completed" else "whole"


async def played_out(client: RealtimeClient, response_id: str) -> None:
    await client.wait_for(lambda event: event["type"] in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
                          and event.get("response_id") == response_id, timeout_s=TURN_S)
    await client.wait_for(lambda event: event["type"] == "response.done", timeout_s=TURN_S)


async def test_the_answers_own_echo_through_a_speakerphone_does_not_cut_it(server_url: str) -> None:
    resumed_before = await counter(server_url, "omni_rtc_false_interruptions_resumed_total")
    async with RealtimeClient(server_url, ice_loopback=True, session=BARGE_IN, timeout_s=TURN_S,
                              speakerphone=Speakerphone(delay_ms=150, gain_db=-12.0)) as client:
        started = await answer_playing(client, load_fixture("hello"))
        await played_out(client, started["response_id"])

        assert outcome(client, started["response_id"]) == "whole"
        assert [event["type"] for event in client.events].count("input_audio_buffer.speech_started") == 1
        assert [event["type"] for event in client.events].count("response.created") == 1
    # The echo canceller took the echo out before the VAD: it hardly paused the answer.
    assert await counter(server_url, "omni_rtc_echo_suppressed_seconds_total") > 2.0
    assert await counter(server_url, "omni_rtc_false_interruptions_resumed_total") - resumed_before <= 2


async def test_a_real_interruption_over_the_echo_is_honoured(long_answer_server_url: str) -> None:
    async with RealtimeClient(long_answer_server_url, ice_loopback=True, session=BARGE_IN, timeout_s=TURN_S,
                              speakerphone=Speakerphone(delay_ms=150, gain_db=-12.0)) as client:
        started = await answer_playing(client, load_fixture("hello"))
        await asyncio.sleep(2.0)
        await client.say(load_fixture("weather"))  # a whole sentence over the answer and its echo
        await played_out(client, started["response_id"])

        assert outcome(client, started["response_id"]) == "cut"
        done = next(event["response"] for event in client.events if event["type"] == "response.done")
        assert done["status_details"]["reason"] == "turn_detected"


async def test_a_backchannel_over_the_answer_leaves_it_whole_and_is_not_answered(server_url: str) -> None:
    backchannel = load_fixture("hello")[: int(0.45 * SPEECH_RATE)]  # "hel-": under half a second of voice
    backchannels_before = await counter(server_url, "omni_rtc_backchannels_ignored_total")
    async with RealtimeClient(server_url, ice_loopback=True, session=BARGE_IN, timeout_s=TURN_S) as client:
        started = await answer_playing(client, load_fixture("hello"))
        await asyncio.sleep(2.0)
        await client.say(backchannel)
        await played_out(client, started["response_id"])

        assert outcome(client, started["response_id"]) == "whole"
        assert [event["type"] for event in client.events].count("response.created") == 1
    assert await counter(server_url, "omni_rtc_backchannels_ignored_total") - backchannels_before == 1
