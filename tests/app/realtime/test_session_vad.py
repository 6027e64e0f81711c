"""RealtimeSession through the real silero VAD, on the espeak-ng speech fixtures."""

from __future__ import annotations

import asyncio

import numpy as np

from app.realtime.session_config import SessionConfig, TurnDetection
from app.realtime.turn_taking import ECHO_TAIL_MS
from media.vad import SileroVad
from pipeline.conversation import AssistantText, UserAudio
from tests.fakes import CODEC_FRAME_SAMPLES, HALF_DUPLEX, ScriptedEngine, SessionHarness
from tests.speech import RATE, load_fixture, silence


async def started(vad: SileroVad, config: SessionConfig | None = None, reply: str = "Sure, here it is.") -> SessionHarness:
    harness = SessionHarness(ScriptedEngine(reply), vad, config)
    await harness.session.start()
    return harness


async def test_spoken_utterance_is_committed_and_answered_without_client_commit(vad):
    h = await started(vad)
    speech = load_fixture("hello")
    h.push(silence(500))
    h.push(speech)
    h.push(silence(800))
    await h.turn_done()

    assert h.types()[:6] == [
        "session.created",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert h.types()[-2:] == ["output_audio_buffer.started", "output_audio_buffer.stopped"]
    started_ms = h.last("input_audio_buffer.speech_started")["audio_start_ms"]
    stopped_ms = h.last("input_audio_buffer.speech_stopped")["audio_end_ms"]
    assert 500 - 300 - 100 <= started_ms <= 500  # speech onset at 500 ms minus the 300 ms prefix pad
    assert stopped_ms >= 500 + speech.size * 1000 // RATE + 500 - 100  # after the 500 ms silence wait
    (clip,) = h.engine.used_requests()[0].conversation.items
    # The audio its speculative answer was made from: up to the silence's first quiet 32 ms window,
    # not through the 500 ms wait (which ended 500-512 ms into the silence).
    assert (stopped_ms - started_ms - 500) * RATE // 1000 < clip.pcm.size <= (stopped_ms - started_ms - 436) * RATE // 1000
    assert h.last("response.done")["response"]["status"] == "completed"
    await h.session.close()


async def test_two_spoken_turns_second_request_holds_the_first_and_the_heard_answer(vad):
    h = await started(vad)
    h.push(load_fixture("hello"))
    h.push(silence(800))
    await h.turn_done()
    h.push(silence(ECHO_TAIL_MS + 200))
    h.push(load_fixture("weather"))
    h.push(silence(800))
    await h.turn_done(2)

    first, second = h.engine.requests
    assert [type(item) for item in second.conversation.items] == [UserAudio, AssistantText, UserAudio]
    assert np.array_equal(second.conversation.items[0].pcm, first.conversation.items[0].pcm)
    assert second.conversation.items[1] == AssistantText("Sure, here it is.")
    assert second.conversation.items[2].seconds > load_fixture("weather").size / RATE
    await h.session.close()


async def test_a_cough_is_not_a_turn(vad):
    h = await started(vad)
    h.push(load_fixture("short_cough"))
    h.push(silence(1000))
    await asyncio.sleep(0)

    assert h.types() == ["session.created"]
    await h.session.close()


async def test_half_duplex_speech_over_playback_is_not_a_turn(vad):
    h = await started(vad, HALF_DUPLEX)
    h.push(load_fixture("hello"))
    h.push(silence(800))
    await h.until("response.done")
    h.output.play(CODEC_FRAME_SAMPLES)
    h.push(load_fixture("weather"))  # spoken while the answer plays
    h.output.play()
    h.push(silence(800 + ECHO_TAIL_MS))

    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert len(h.engine.requests) == 1
    assert h.engine.cancelled_turns == 0
    await h.session.close()


async def test_barge_in_over_playback_truncates_and_answers_the_new_utterance(vad):
    h = await started(vad, SessionConfig(turn_detection=TurnDetection(interrupt_response=True)),
                      reply="one two three four five six")
    h.push(load_fixture("hello"))
    h.push(silence(800))
    await h.until("response.done")
    h.output.play(3 * CODEC_FRAME_SAMPLES)  # half of the answer heard
    h.push(load_fixture("weather"))
    h.push(silence(800))
    await h.turn_done(2)

    assert h.last("output_audio_buffer.cleared")["response_id"] == h.of_type("response.done")[0]["response"]["id"]
    assert h.last("conversation.item.truncated")["audio_end_ms"] == 240
    items = h.engine.requests[1].conversation.items
    assert items[1] == AssistantText("one two three ")
    assert isinstance(items[2], UserAudio)
    await h.session.close()


async def test_noise_reduction_cleans_what_the_vad_and_the_model_hear(vad):
    rng = np.random.default_rng(3)
    speech = load_fixture("hello")
    noisy = np.concatenate([silence(600), speech, silence(800)])
    noisy += (rng.standard_normal(noisy.size) * 0.02).astype(np.float32)  # hiss at -34 dBFS

    committed = {}
    for kind in (None, {"type": "near_field"}):
        config = SessionConfig.from_session({"audio": {"input": {"noise_reduction": kind}}})
        h = await started(vad, config)
        h.push(noisy)
        await h.turn_done()
        (clip,) = h.engine.used_requests()[0].conversation.items
        committed[str(kind)] = clip.pcm
        await h.session.close()

    def hiss_level(pcm: np.ndarray) -> float:  # the clip's first 200 ms: its prefix pad, before the words
        return float(np.sqrt(np.mean(np.square(pcm[: RATE // 5]))))

    plain, cleaned = committed["None"], committed["{'type': 'near_field'}"]
    assert hiss_level(cleaned) < hiss_level(plain) / 3  # at least 10 dB less hiss


async def test_a_cough_over_the_answer_leaves_it_whole_and_is_not_a_turn(vad):
    h = await started(vad, SessionConfig(turn_detection=TurnDetection(interrupt_response=True)),
                      reply="one two three four five six seven eight")
    h.push(load_fixture("hello"))
    h.push(silence(800))
    await h.until("response.done")
    h.output.play(2 * CODEC_FRAME_SAMPLES)  # two words heard, six to come
    h.push(load_fixture("short_cough"))
    h.push(silence(1000))
    h.output.play()

    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert h.of_type("output_audio_buffer.cleared") == []
    assert h.last("response.done")["response"]["status"] == "completed"
    assert h.output.played_samples == 8 * CODEC_FRAME_SAMPLES  # every word played
    assert len(h.engine.requests) == 1
    await h.session.close()
