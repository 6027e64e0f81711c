"""The session's semantic_vad's decisions, its missing model, and quick replies in the echo tail.

The VAD is the energy stand-in (exact speech boundaries); the end-of-turn model is a fake whose
answer the test sets, and which can hold its answer back to let audio arrive meanwhile.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from app.realtime.session_config import SessionConfig
from app.realtime.turn_taking import ECHO_TAIL_MS, END_OF_TURN_BY_EAGERNESS, JUDGED_SECONDS
from pipeline.conversation import UserAudio
from tests.fakes import CODEC_FRAME_SAMPLES, HALF_DUPLEX, ScriptedEngine, SessionHarness
from tests.settle import settle
from tests.speech import silence, tone
from tests.words import HeldJudge, TranscriptJudge

RATE = 16_000
MEDIUM = END_OF_TURN_BY_EAGERNESS["medium"]
# The end-of-turn model answers in a worker thread: the wall time a test gives its answers to reach
# the loop before it looks at what they decided.
ANSWERS_S = 0.5
SEMANTIC = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}


class FakeEndOfTurn:
    """Answers ``probability``; with ``hold()``, each answer waits until ``release()``."""

    def __init__(self, probability: float) -> None:
        self.probability_to_answer = probability
        self.asked: list[int] = []  # samples of each utterance it was asked about
        self._gate: threading.Event | None = None

    def hold(self) -> None:
        self._gate = threading.Event()

    def release(self) -> None:
        assert self._gate is not None
        self._gate.set()

    def probability(self, pcm: np.ndarray) -> float:
        self.asked.append(pcm.size)
        if self._gate is not None:
            self._gate.wait(timeout=10)  # runs in a worker thread: the loop goes on meanwhile
        return self.probability_to_answer


async def semantic_session(model: FakeEndOfTurn | None, *, eagerness: str = "medium", reply: str = "Sure.",
                           text_judge: TranscriptJudge | None = None,
                           **turn_detection: bool | None) -> SessionHarness:
    """A session that switched to semantic_vad; ``turn_detection``: more of its fields (interrupt_response)."""
    harness = SessionHarness(ScriptedEngine(reply), end_of_turn=model, text_judge=text_judge)
    await harness.session.start()
    detection = {"type": "semantic_vad", "eagerness": eagerness, **turn_detection}
    await harness.send(type="session.update", session={"audio": {"input": {"turn_detection": detection}}})
    return harness


async def answered_at_the_candidate_silence(h: SessionHarness, then_ms: int) -> None:
    """Silence up to the check, its answers back on the loop, then ``then_ms`` more silence (pushed
    at once, the session would reach its wait before the worker thread answers)."""
    h.push(silence(MEDIUM.candidate_ms + 40))
    await settle(seconds=ANSWERS_S)
    h.push(silence(then_ms))


async def asked(model: FakeEndOfTurn, count: int) -> None:
    """Until the model was asked ``count`` checks (it is asked in a worker thread)."""
    try:
        async with asyncio.timeout(5):  # a guard against hangs, not a speed limit
            while len(model.asked) < count:
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"the end-of-turn model was asked {len(model.asked)} checks, not {count}") from None


async def test_finished_utterance_is_committed_at_the_candidate_silence_not_after_server_vads_wait():
    model = FakeEndOfTurn(0.95)
    h = await semantic_session(model)
    h.push(tone(800))
    h.push(silence(MEDIUM.candidate_ms + 40))  # the check is asked at candidate_ms of silence
    await h.until("input_audio_buffer.committed")
    h.push(silence(100))
    await h.turn_done()

    assert h.last("session.updated")["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "medium", "create_response": True, "interrupt_response": True,
        "speculative_response": True,
        "interrupt_min_speech_ms": 700,
        "interrupt_resume_silence_ms": 250,
        "speech_floor_dbfs": -36.0,
        "speech_over_background_db": 12.0,
        "speech_under_user_db": 15.0,
    }  # interrupt_response left out: OpenAI's default
    assert model.asked, "the model was asked"
    stopped = h.last("input_audio_buffer.speech_stopped")["audio_end_ms"]
    assert 800 + MEDIUM.candidate_ms <= stopped < 800 + 500  # before server VAD's 500 ms wait
    (clip,) = h.engine.used_requests()[0].conversation.items
    # The item is the audio its (speculative) answer was made from: up to the silence's first
    # quiet 32 ms window, where the candidate was.
    assert isinstance(clip, UserAudio) and clip.pcm.size == (800 + 32) * RATE // 1000
    latency = h.last("response.done")["latency"]
    assert latency["silence_wait_ms"] == stopped - 800  # the silence actually waited
    await h.session.close()


async def test_an_unsure_not_finished_waits_until_the_max_wait():
    model = FakeEndOfTurn(0.5)  # below the threshold, above confident_below: unsure
    h = await semantic_session(model)
    h.push(tone(800))
    h.push(silence(MEDIUM.max_wait_ms - 100))
    await settle(seconds=ANSWERS_S)
    assert "input_audio_buffer.speech_stopped" not in h.types()

    h.push(silence(200))
    await h.until("input_audio_buffer.committed")
    assert h.last("input_audio_buffer.speech_stopped")["audio_end_ms"] >= 800 + MEDIUM.max_wait_ms
    await h.session.close()


async def test_a_pause_the_model_calls_unfinished_keeps_the_sentence_in_one_turn():
    model = FakeEndOfTurn(0.05)
    h = await semantic_session(model)
    h.push(tone(700))
    h.push(silence(700))  # past server VAD's 500 ms, short of the max wait
    await settle(seconds=ANSWERS_S)
    model.probability_to_answer = 0.95
    h.push(tone(600))
    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.turn_done()

    assert h.types().count("input_audio_buffer.committed") == 1
    (clip,) = h.engine.used_requests()[0].conversation.items
    assert clip.pcm.size >= (700 + 700 + 600) * RATE // 1000
    await h.session.close()


async def test_an_answer_arriving_after_the_user_spoke_again_is_ignored():
    model = FakeEndOfTurn(0.95)
    model.hold()
    h = await semantic_session(model)
    h.push(tone(700))
    h.push(silence(MEDIUM.candidate_ms + 40))
    await asked(model, 1)  # the check is out, its answer held back
    h.push(tone(500))  # the user goes on before the model answers "finished"
    model.release()
    await settle(seconds=ANSWERS_S)
    assert "input_audio_buffer.committed" not in h.types()

    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.turn_done()
    (clip,) = h.engine.used_requests()[0].conversation.items
    assert clip.pcm.size >= (700 + MEDIUM.candidate_ms + 500) * RATE // 1000  # one turn, both parts
    assert len(model.asked) == 2  # the ignored answer's check, then the one that committed
    await h.session.close()


# -- waits that follow the model's confidence -----------------------------------------------------


async def test_a_confident_not_finished_is_held_through_a_2_5_s_pause():
    model = FakeEndOfTurn(0.02)  # below medium's confident_below: "not finished", and sure of it
    h = await semantic_session(model)
    h.push(tone(700))
    await answered_at_the_candidate_silence(h, 2500 - MEDIUM.candidate_ms - 40)  # past the unsure wait
    await settle(seconds=ANSWERS_S)
    assert "input_audio_buffer.speech_stopped" not in h.types()

    model.probability_to_answer = 0.95
    h.push(tone(600))  # the speaker goes on
    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.turn_done()
    assert h.types().count("input_audio_buffer.committed") == 1
    (clip,) = h.engine.used_requests()[0].conversation.items
    assert clip.pcm.size >= (700 + 2500 + 600) * RATE // 1000  # one turn across the pause
    await h.session.close()


async def test_a_confident_not_finished_is_still_committed_at_the_documented_maximum():
    model = FakeEndOfTurn(0.02)
    h = await semantic_session(model)
    h.push(tone(700))
    await answered_at_the_candidate_silence(h, MEDIUM.confident_wait_ms - 100 - MEDIUM.candidate_ms - 40)
    await settle(seconds=ANSWERS_S)
    assert "input_audio_buffer.speech_stopped" not in h.types()

    h.push(silence(200))
    await h.turn_done()
    assert MEDIUM.confident_wait_ms == MEDIUM.longest_wait_ms == 3000  # docs/SESSION.md's table
    wait = h.last("response.done")["latency"]["silence_wait_ms"]
    assert MEDIUM.confident_wait_ms <= wait < MEDIUM.confident_wait_ms + 64  # the VAD's 32 ms windows
    await h.session.close()


# -- the words' second opinion (the stand-in judge reads a given transcript) -------------------------


async def test_please_put_the_is_held_though_the_sound_says_finished():
    model = FakeEndOfTurn(0.95)  # the sound is sure the speaker has finished
    judge = TranscriptJudge("Please put the")
    h = await semantic_session(model, text_judge=judge)
    h.push(tone(900))
    await answered_at_the_candidate_silence(h, 2000)  # well past the unsure wait: the words hold the turn
    await settle(seconds=ANSWERS_S)
    assert judge.judged == ["Please put the"]
    assert "input_audio_buffer.speech_stopped" not in h.types()

    judge.transcript = "Please put the groceries in the fridge."
    h.push(tone(800))  # "...groceries in the fridge."
    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.turn_done()
    assert judge.judged == ["Please put the", "Please put the groceries in the fridge."]
    assert h.types().count("input_audio_buffer.committed") == 1
    await h.session.close()


async def test_please_put_the_groceries_in_the_fridge_is_committed_at_the_candidate_silence():
    model = FakeEndOfTurn(0.95)
    judge = TranscriptJudge("Please put the groceries in the fridge.")
    h = await semantic_session(model, text_judge=judge)
    h.push(tone(1700))
    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.turn_done()
    assert judge.judged == ["Please put the groceries in the fridge."]
    wait = h.last("response.done")["latency"]["silence_wait_ms"]
    assert wait < 500  # as the sound alone would: sooner than server VAD's wait
    await h.session.close()


async def test_speech_heard_while_the_assistant_answers_costs_no_words_check():
    judge = TranscriptJudge("What time is it?")
    h = await semantic_session(FakeEndOfTurn(0.95), reply="one two three four", text_judge=judge,
                               interrupt_response=False)
    h.push(tone(600))
    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.until("response.done")
    h.output.play(CODEC_FRAME_SAMPLES)  # the answer is playing (half-duplex)...
    h.push(tone(600))  # ...and its echo reaches the microphone
    h.push(silence(300))
    await settle(seconds=ANSWERS_S)
    assert judge.judged == ["What time is it?"]  # the user's turn only: no engine turn for the echo
    await h.session.close()


async def test_speaking_in_bursts_keeps_one_words_check_in_flight():
    # One words check in flight: otherwise each silence would start another ASR turn over the whole utterance.
    judge = HeldJudge()
    h = await semantic_session(FakeEndOfTurn(0.3), text_judge=judge)  # type: ignore[arg-type]
    for _ in range(4):
        h.push(tone(600))
        h.push(silence(200))  # a pause: a words check, then speech again makes it stale
        await settle(seconds=ANSWERS_S)
    assert (len(judge.sizes), judge.cancelled, judge.most_running) == (4, 3, 1)
    judge.release.set()
    await h.session.close()


async def test_the_words_judged_are_the_utterances_last_seconds():
    judge = HeldJudge()
    h = await semantic_session(FakeEndOfTurn(0.3), text_judge=judge,  # type: ignore[arg-type]
                               speech_over_background_db=None)  # a steady tone: tests.fakes.STEADY_TONE_SPEECH
    h.push(tone(20_000))
    h.push(silence(200))
    await settle(seconds=ANSWERS_S)
    assert judge.sizes == [JUDGED_SECONDS * RATE]
    judge.release.set()
    await h.session.close()


async def test_a_failing_text_judge_leaves_the_decision_to_the_sound():
    class Broken:
        async def judge(self, pcm):
            raise RuntimeError("the engine is gone")

    model = FakeEndOfTurn(0.95)
    h = await semantic_session(model, text_judge=Broken())  # type: ignore[arg-type]
    h.push(tone(800))
    h.push(silence(MEDIUM.candidate_ms + 40))
    await h.turn_done()
    assert h.last("response.done")["latency"]["silence_wait_ms"] < 500
    await h.session.close()


async def test_eagerness_changed_mid_session_applies_to_the_next_utterance():
    model = FakeEndOfTurn(0.55)  # between high's threshold and medium's
    h = await semantic_session(model, eagerness="medium")
    h.push(tone(600))
    h.push(silence(MEDIUM.max_wait_ms + 100))
    await h.turn_done()
    first_wait = h.last("input_audio_buffer.speech_stopped")["audio_end_ms"] - 600
    h.push(silence(ECHO_TAIL_MS + 100))

    await h.send(type="session.update",
                 session={"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    assert h.last("session.updated")["session"]["audio"]["input"]["turn_detection"]["eagerness"] == "high"
    start_ms = h.of_type("input_audio_buffer.speech_stopped")[0]["audio_end_ms"] + ECHO_TAIL_MS + 100
    h.push(tone(600))
    h.push(silence(END_OF_TURN_BY_EAGERNESS["high"].candidate_ms + 40))
    await h.until("input_audio_buffer.committed", 2)
    second_wait = h.last("input_audio_buffer.speech_stopped")["audio_end_ms"] - 600
    assert first_wait >= MEDIUM.max_wait_ms  # medium: 0.55 is not sure enough
    assert second_wait - start_ms < 500  # high: 0.55 is
    await h.session.close()


async def test_semantic_vad_without_the_model_is_an_error_and_server_vad_stays():
    h = SessionHarness(ScriptedEngine("Sure."), end_of_turn=None)
    await h.session.start()
    await h.send(**SEMANTIC, event_id="evt_semantic")

    error = h.last("error")["error"]
    assert error["code"] == "semantic_vad_unavailable" and error["event_id"] == "evt_semantic"
    turn_detection = h.last("session.updated")["session"]["audio"]["input"]["turn_detection"]
    assert turn_detection["type"] == "server_vad" and turn_detection["silence_duration_ms"] == 500
    h.push(tone(600))
    h.push(silence(700))
    await h.turn_done()  # server VAD still answers
    assert h.last("input_audio_buffer.speech_stopped")["audio_end_ms"] >= 600 + 500
    await h.session.close()


async def test_a_session_created_with_semantic_vad_and_no_model_starts_with_server_vad_and_an_error():
    config = SessionConfig.from_session({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    h = SessionHarness(ScriptedEngine("Sure."), config=config, end_of_turn=None)
    await h.session.start()

    assert h.types() == ["session.created", "error"]
    assert h.events[0]["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert h.events[1]["error"]["code"] == "semantic_vad_unavailable"
    await h.session.close()


# -- quick replies in the echo tail ---------------------------------------------------------------


async def answered_and_played(h: SessionHarness) -> None:
    h.push(tone(600))
    h.push(silence(700))
    await h.turn_done()
    assert h.types()[-1] == "output_audio_buffer.stopped"


@pytest.mark.parametrize("delay_ms", [0, 100, 200, 300])
async def test_a_reply_starting_inside_the_echo_tail_and_going_on_is_a_turn(delay_ms):
    h = SessionHarness(ScriptedEngine("Sure, here it is."), config=HALF_DUPLEX)
    await h.session.start()
    await answered_and_played(h)
    tail_start_ms = 600 + 700  # the input pushed when output_audio_buffer.stopped came

    h.push(silence(delay_ms))
    h.push(tone(1000))  # starts inside the 400 ms tail, goes on past it
    h.push(silence(700))
    await h.turn_done(2)

    second_started = h.of_type("input_audio_buffer.speech_started")[1]
    # From where the speech started (the VAD's 32 ms window), never from the answer's time.
    assert tail_start_ms - 32 <= second_started["audio_start_ms"] <= tail_start_ms + delay_ms
    assert len(h.engine.used_requests()) == 2
    clip = h.engine.used_requests()[1].conversation.items[-1]
    assert isinstance(clip, UserAudio)
    # All of the reply, from where the speech started, not from the tail's end (400 - delay ms
    # later), up to the silence's first quiet window (the audio its speculative answer was made from).
    assert clip.pcm.size >= (1000 + 32) * RATE // 1000
    await h.session.close()


async def test_a_blip_confined_to_the_echo_tail_is_ignored():
    h = SessionHarness(ScriptedEngine("Sure, here it is."), config=HALF_DUPLEX)
    await h.session.start()
    await answered_and_played(h)

    h.push(tone(300))  # 250 ms makes speech; it ends inside the 400 ms tail
    h.push(silence(1000))
    await settle()  # a turn started by the blip would have reached the engine by now

    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert len(h.engine.requests) == 1
    await h.session.close()


async def test_speech_begun_while_the_answer_played_is_still_not_a_turn():
    h = SessionHarness(ScriptedEngine("one two three four"), config=HALF_DUPLEX)
    await h.session.start()
    h.push(tone(600))
    h.push(silence(700))
    await h.until("response.done")
    h.output.play(CODEC_FRAME_SAMPLES)
    h.push(tone(200))  # echo of the answer while it plays...
    h.output.play()
    h.push(tone(800))  # ...going on through the tail
    h.push(silence(800))
    await settle()  # a turn started by the speech would have reached the engine by now

    assert h.types().count("input_audio_buffer.speech_started") == 1
    assert len(h.engine.requests) == 1
    await h.session.close()
