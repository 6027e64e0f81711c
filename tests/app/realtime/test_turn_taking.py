"""Long turns: segments, the turn's maximum, and speech half-duplex ignores.

A session with a scripted engine and an energy VAD (a tone is speech, zeros are silence), so
minutes of speech take a moment and every boundary is exact.
"""

from __future__ import annotations

import numpy as np

from app.realtime.session_config import SessionConfig
from app.realtime.turn_taking import ECHO_TAIL_MS, TURN_LIMIT_CODE
from pipeline.conversation import AssistantText, UserAudio
from tests.fakes import (
    HALF_DUPLEX,
    HALF_DUPLEX_STEADY_TONE,
    STEADY_TONE_SPEECH,
    EnergyVad,
    ScriptedEngine,
    SessionHarness,
)
from tests.speech import silence, tone

RATE = 16_000


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def session(ignored: Counter | None = None, config: SessionConfig | None = None) -> SessionHarness:
    h = SessionHarness(ScriptedEngine("Go on."), EnergyVad(), config, on_ignored_speech=ignored)
    await h.session.start()
    return h


async def test_a_70_s_utterance_is_committed_in_segments_and_answered_once_it_ends():
    h = await session(config=STEADY_TONE_SPEECH)
    h.push(silence(200))
    h.push(tone(70_000))
    assert "response.created" not in h.types()  # 70 s of talk: two segments committed, no answer
    assert h.types().count("input_audio_buffer.committed") == 2
    assert "input_audio_buffer.speech_stopped" not in h.types()
    h.push(silence(700))
    await h.turn_done()

    types = h.types()
    assert types.count("input_audio_buffer.speech_started") == 1
    assert types.count("input_audio_buffer.speech_stopped") == 1
    assert types.count("input_audio_buffer.committed") == 3
    assert types.index("input_audio_buffer.speech_stopped") < types.index("response.created")
    committed = [event["item_id"] for event in h.of_type("input_audio_buffer.committed")]
    assert committed[0] == h.last("input_audio_buffer.speech_started")["item_id"]
    assert committed[-1] == h.last("input_audio_buffer.speech_stopped")["item_id"]
    assert [event["previous_item_id"] for event in h.of_type("input_audio_buffer.committed")[1:]] == committed[:-1]
    (request,) = h.engine.used_requests()
    clips = request.conversation.items
    assert [type(clip) for clip in clips] == [UserAudio] * 3
    seconds = [clip.seconds for clip in clips]
    assert seconds[0] >= 30 and seconds[1] >= 30  # 30 s segments (whole 32 ms VAD windows)
    whole = np.concatenate([clip.pcm for clip in clips])
    speech_start = h.last("input_audio_buffer.speech_started")["audio_start_ms"]
    # Up to the silence's first quiet 32 ms window, as its speculative answer heard it.
    tone_end = (200 + 70_000 - speech_start) * RATE // 1000
    assert tone_end < whole.size <= tone_end + 64 * RATE // 1000
    # Contiguous, in order: the tone goes on across the segment boundaries without a seam.
    onset = 200 * RATE // 1000 - speech_start * RATE // 1000
    assert np.array_equal(whole[onset : onset + 70 * RATE], tone(70_000))
    usage = h.last("response.done")["response"]["usage"]
    assert usage["input_token_details"]["audio_tokens"] >= 70 * 12  # the fake encoder: 12.5 per second
    await h.session.close()


async def test_a_turn_past_its_maximum_gets_an_error_naming_it_and_is_answered():
    ignored = Counter()
    h = await session(ignored, HALF_DUPLEX_STEADY_TONE)
    h.push(tone(125_000))  # 5 s past the 120 s maximum, without a pause
    error = h.last("error")["error"]
    assert error["code"] == TURN_LIMIT_CODE
    assert "maximum of 120 s" in error["message"]
    await h.until("response.done")
    types = h.types()
    assert types.index("error") < types.index("response.created")
    clips = h.engine.requests[0].conversation.items
    assert sum(clip.seconds for clip in clips) == 120.0
    assert ignored.count == 1  # the 5 s after the limit were spoken over the answer: half-duplex ignored them

    h.output.play()
    h.push(silence(700 + ECHO_TAIL_MS))
    h.push(tone(1_000))
    h.push(silence(700))
    await h.turn_done(2)  # the session goes on
    items = h.engine.requests[1].conversation.items
    assert items[-2] == AssistantText("Go on.")
    assert [type(item) for item in items[-5:]] == [UserAudio] * 3 + [AssistantText, UserAudio]
    await h.session.close()


async def test_speech_over_an_answer_in_half_duplex_is_counted_not_acted_on():
    ignored = Counter()
    h = await session(ignored, HALF_DUPLEX)
    h.push(tone(600))
    h.push(silence(700))
    await h.until("response.done")  # its audio has not played yet: the assistant is speaking
    h.push(tone(600))
    h.push(silence(700))
    h.push(tone(600))
    h.push(silence(700))
    assert ignored.count == 2
    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert len(h.engine.requests) == 1

    barge_in = Counter()
    h2 = await session(barge_in, SessionConfig.from_session(
        {"audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": True}}}}))
    h2.push(tone(600))
    h2.push(silence(700))
    await h2.until("response.done")
    h2.push(tone(1000))
    assert barge_in.count == 0  # barge-in acts on it
    assert h2.types().count("input_audio_buffer.speech_started") == 2
    await h.session.close()
    await h2.session.close()
