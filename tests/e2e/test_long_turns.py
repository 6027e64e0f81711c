"""Long turns over WebRTC: a minute of speech without a pause is heard whole and answered once
it ends; speech over an answer in half-duplex shows in /metrics. The real server runs in this
process with a scripted engine (its fake audio encoder counts 12.5 tokens per second of each clip)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import pytest_asyncio

from app.cli import read_utterance
from app.client.webrtc import AUDIBLE_PEAK, RealtimeClient
from app.config import Settings
from app.http.server import create_app
from pipeline.conversation import UserAudio
from tests.e2e.conftest import serving_in_process
from tests.fakes import AUDIO_TOKENS_PER_SECOND, ScriptedEngine

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RATE = 16_000
# long_story.wav (3.7 s, "Once upon a time, a little robot walked to the sea...") 17 times over:
# 62.7 s with no pause near the 500 ms silence wait (its commas are ~200 ms).
STORY_REPEATS = 17
SEGMENT_MS = 30_000
# Server VAD without barge-in: speech over the answer is heard and counted, not acted on.
HALF_DUPLEX = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}}}


@pytest_asyncio.fixture(loop_scope="function")
async def served(tmp_path: Path) -> AsyncIterator[tuple[ScriptedEngine, str]]:
    engine = ScriptedEngine("I see.")
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=engine)
    async with serving_in_process(app) as url:
        yield engine, url


async def test_a_minute_without_pauses_is_committed_in_order_and_answered_after_it_ends(served) -> None:
    engine, url = served
    utterance = np.concatenate([read_utterance(FIXTURES / "long_story.wav")] * STORY_REPEATS)
    assert utterance.size >= 60 * RATE
    async with RealtimeClient(url, ice_loopback=True, timeout_s=180) as client:
        mark = client.frames_received
        turn = await client.speak(utterance)
        received = client.frames_since(mark)  # 20 ms frames from the server, silence while idle

    events = turn.events
    types = [event["type"] for event in events]
    assert types.count("input_audio_buffer.speech_started") == 1
    assert types.count("input_audio_buffer.speech_stopped") == 1
    assert types.count("response.created") == 1
    # The answer starts only after the utterance ended: the VAD's end of speech comes first,
    # and the first audible answer frame came later than the utterance lasted.
    assert types.index("input_audio_buffer.speech_stopped") < types.index("response.created")
    audible = [frame for frame in received if frame.peak >= AUDIBLE_PEAK]
    # Under load an answer once came with nothing audible: say what the client's jitter buffer did.
    assert audible, (turn.response["status"], client.receive_stats)
    # By the clock, not by frames counted: a loaded run may receive fewer frames than its seconds
    # (a gap of over a second is not filled, a late packet's slot is concealed once, not twice).
    assert audible[0].arrived_at > turn.spoken_at

    # Three user items, committed in order: two 30 s segments and the rest.
    committed = [event for event in events if event["type"] == "input_audio_buffer.committed"]
    speech_started = next(event for event in events if event["type"] == "input_audio_buffer.speech_started")
    speech_stopped = next(event for event in events if event["type"] == "input_audio_buffer.speech_stopped")
    assert len(committed) == 3
    assert committed[0]["item_id"] == speech_started["item_id"]
    assert committed[-1]["item_id"] == speech_stopped["item_id"]
    assert [event["previous_item_id"] for event in committed[1:]] == [event["item_id"] for event in committed[:-1]]
    (answered,) = engine.used_requests()  # the story's commas each started a speculation
    clips = answered.conversation.items
    assert all(isinstance(clip, UserAudio) for clip in clips)
    heard_ms = speech_stopped["audio_end_ms"] - speech_started["audio_start_ms"]
    lengths = [round(clip.seconds * 1000) for clip in clips]
    # Each segment ends with the first 32 ms VAD window past 30 s. Where the first begins on that
    # grid (the onset's window less the 300 ms prefix, or the stream's start) depends on how long
    # the microphone sent silence before the story: 30,016 or 30,028 ms, say.
    assert all(SEGMENT_MS <= length < SEGMENT_MS + 32 for length in lengths[:2]), lengths
    # Contiguous to the end; the last clip ends at the silence wait's end (an answer started at the
    # commit) or at its first quiet window (a speculative one: the audio it was made from).
    assert heard_ms - 500 < sum(lengths) <= heard_ms
    assert sum(lengths) >= utterance.size * 1000 // RATE

    # usage covers the whole utterance, not its first segment.
    audio_tokens = turn.usage["input_token_details"]["audio_tokens"]
    assert audio_tokens >= int(utterance.size / RATE * AUDIO_TOKENS_PER_SECOND) - len(clips)


async def test_speech_over_a_half_duplex_answer_is_counted_in_metrics(tmp_path: Path) -> None:
    # A long answer (6.4 s of audio), so the second utterance lands while it plays.
    engine = ScriptedEngine(" ".join(["la"] * 80))
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=engine)
    async with serving_in_process(app) as url:
        async with RealtimeClient(url, ice_loopback=True, session=HALF_DUPLEX) as client:
            await client.say(read_utterance(FIXTURES / "hello.wav"))
            await client.wait_for("output_audio_buffer.started")
            await client.say(read_utterance(FIXTURES / "weather.wav"))  # spoken over the answer
            await client.wait_for("output_audio_buffer.stopped")
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"{url}/metrics")).text
    assert "omni_rtc_ignored_speech_total 1.0" in metrics
    assert len(engine.used_requests()) == 1
