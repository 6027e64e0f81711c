"""Barge-in over WebRTC keeps only what was heard: the real server in this process, a scripted
engine whose Thinker is far ahead of its audio, and a real aiortc client that talks over it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from app.cli import read_utterance
from app.client.webrtc import RealtimeClient
from app.config import Settings
from app.http.server import create_app
from media.rates import WIRE_RATE
from pipeline.conversation import AssistantText
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPLY = " ".join(f"word{n}" for n in range(60))  # 60 tokens, 60 frames: 4.8 s of speech
WIRE_FRAME_MS = 20  # one RTP packet
BARGE_IN = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": True}}}}
# A received sample louder than this is answer audio (the tone peaks at 0.3; Opus's silence is ~0).
AUDIBLE = 0.01
# 1 ms: the tone (250 Hz) dips under AUDIBLE for about 2 samples at each zero crossing; a longer
# dip is silence the server played where the answer's next chunk was late (or Opus easing into it).
ZERO_CROSSING_SAMPLES = WIRE_RATE // 1000
# An answer cut while still generating keeps the words a voice speaks in the audio played, at this
# pace (docs/SESSION.md, "History as heard"); the test counts them from the audio it received.
SPEAKING_TOKENS_PER_SECOND = 3.5


@pytest_asyncio.fixture(loop_scope="function")
async def engine_and_url(tmp_path: Path) -> AsyncIterator[tuple[ScriptedEngine, str]]:
    # The whole text comes at once; audio comes in 4-frame chunks about as fast as it plays, as
    # a decoder that just keeps up: at any moment almost everything decoded has been played.
    engine = ScriptedEngine(REPLY, text_first=True, frames_per_chunk=4, chunk_interval_s=0.3, waveform="tone")
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=engine)
    async with serving_in_process(app) as url:
        yield engine, url


def first_answer_ms(audio: np.ndarray) -> float:
    """Received 48 kHz audio: the first answer's audio, its audible stretches added up until a
    silence of a second or more (the answer after the barge-in comes after the user's 1.5 s
    utterance and the 500 ms silence wait). The stretches are joined across the tone's zero
    crossings (a sample or two under AUDIBLE), not across the silence the server plays where the
    answer's next chunk was late: that silence is not the answer's audio."""
    loud = np.flatnonzero(np.abs(audio) > AUDIBLE)
    if loud.size == 0:
        return 0.0
    steps = np.diff(loud)
    answer_ends = np.flatnonzero(steps >= WIRE_RATE)
    steps = steps[: answer_ends[0]] if answer_ends.size else steps
    joined = steps < ZERO_CROSSING_SAMPLES
    return (1 + int(np.sum(steps[joined])) + int(np.sum(~joined))) * 1000 / WIRE_RATE


async def test_barge_in_truncates_the_answer_to_the_audio_the_client_received(engine_and_url) -> None:
    engine, url = engine_and_url
    async with RealtimeClient(url, ice_loopback=True, session=BARGE_IN) as client:
        # Marked before the answer can start: its first packets may come before the data channel's
        # output_audio_buffer.started does (by as much as 250 ms on a loaded box).
        start, mark = len(client.events), client.frames_received
        await client.say(read_utterance(FIXTURES / "hello.wav"))
        started = await client.wait_for("output_audio_buffer.started", start=start)
        while first_answer_ms(client.audio_since(mark)) < 500:  # ~0.5 s of the answer has arrived
            await asyncio.sleep(0.02)
        await client.say(read_utterance(FIXTURES / "weather.wav"))  # the user talks over it
        done = await client.wait_for("response.done", start=start)
        cleared = await client.wait_for("output_audio_buffer.cleared", start=start)
        truncated = await client.wait_for("conversation.item.truncated", start=start)
        deltas_before_cut = [
            event for event in client.events[start : client.events.index(cleared)]
            if event["type"] == "response.output_audio_transcript.delta"
        ]
        second = await client.wait_for(lambda event: event["type"] == "response.done" and event is not done,
                                       start=start)
        received_ms = first_answer_ms(client.audio_since(mark))

    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    assert cleared["response_id"] == started["response_id"] == done["response"]["id"]
    assert truncated["item_id"] == done["response"]["output"][0]["id"]
    assert abs(truncated["audio_end_ms"] - received_ms) <= WIRE_FRAME_MS, (truncated, received_ms)
    # The Thinker was far ahead: all 60 words had streamed, so the text released bounds nothing;
    # cut while generating, the words heard are those spoken in the audio the client received,
    # give or take the packet (and the ms audio_end_ms is rounded by) its measure may be off by.
    assert len(deltas_before_cut) == 60
    fewest, most = (int((received_ms + error) * SPEAKING_TOKENS_PER_SECOND) // 1000
                    for error in (-WIRE_FRAME_MS - 1, WIRE_FRAME_MS + 1))
    transcript = done["response"]["output"][0]["content"][0]["transcript"]
    assert transcript in {" ".join(REPLY.split(" ")[:words]) + " " for words in range(fewest, most + 1)}, received_ms
    assert 1 <= len(transcript.split()) < 10
    assert second["response"]["status"] == "completed"
    answers = [item for item in engine.used_requests()[1].conversation.items if isinstance(item, AssistantText)]
    assert answers == [AssistantText(transcript)]
