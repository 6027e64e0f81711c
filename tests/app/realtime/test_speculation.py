"""Speculative answers (app/realtime/speculation.py): started at the silence's first quiet window,
held until the commit, cancelled when the speech goes on or the turn changes.

Speech is a tone and silence zeros (``EnergyVad``); the engine is the scripted fake, which keeps
the preemptible-turn rules of ``pipeline.contract`` (``max_batch`` slots; ``hold`` keeps its turns
after their first word, a long answer still being generated).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from app.config import Settings
from app.http.server import _base_session_config
from app.realtime.session_config import InputTranscription, SessionConfig, TurnDetection
from app.realtime.speculation import SPECULATION_BURST, SPECULATIONS_PER_SECOND, same_request
from media.frames import SampledFrame
from pipeline.contract import GenerationRequest, TranscriptionHint
from pipeline.conversation import Conversation, UserAudio, UserImage, UserText
from tests.app.realtime.test_session_tools import GET_TIME, PARIS, Answer, CallingEngine
from tests.clock import FakeClock
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness
from tests.pictures import encoded
from tests.settle import settle
from tests.speech import RATE, silence, tone

REPLY = "one two three"
TRANSCRIPTION = "conversation.item.input_audio_transcription"


async def started(engine: Any = None, config: SessionConfig | None = None) -> SessionHarness:
    harness = SessionHarness(engine if engine is not None else ScriptedEngine(REPLY), EnergyVad(), config)
    await harness.session.start()
    return harness


def held_engine() -> ScriptedEngine:
    engine = ScriptedEngine(REPLY)
    engine.hold = asyncio.Event()  # each turn waits after its first word until set
    return engine


async def speculating(engine: ScriptedEngine, pause_ms: int = 100) -> SessionHarness:
    """A started session that heard 600 ms of speech and a pause shorter than the 500 ms wait: a
    candidate end of turn, where a speculation starts (when the engine has room for it)."""
    h = await started(engine)
    h.push(tone(600))
    h.push(silence(pause_ms))
    await settle()
    return h


async def released_and_committed(engine: ScriptedEngine, h: SessionHarness) -> dict[str, Any]:
    """The held turns let go and the silence run on to the commit; the answer's ``response.done``."""
    engine.hold.set()
    h.push(silence(600))
    return await h.turn_done()


async def test_speech_that_resumes_cancels_the_speculation_and_none_of_its_events_reach_the_client():
    engine = held_engine()
    h = await speculating(engine, pause_ms=200)
    (speculative,) = engine.requests
    assert speculative.preemptible_id is not None and engine.cancelled_turns == 0
    h.push(tone(400))  # the user goes on
    await settle()
    assert engine.cancelled_turns == 1
    assert h.types() == ["session.created", "input_audio_buffer.speech_started"]

    engine.hold.set()
    h.push(silence(700))
    await h.turn_done()

    assert h.types().count("response.created") == 1
    assert h.types()[:7] == ["session.created", "input_audio_buffer.speech_started",
                             "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                             "conversation.item.added", "conversation.item.done", "response.created"]
    assert h.last("response.output_audio_transcript.done")["transcript"] == REPLY
    (used,) = engine.used_requests()
    (clip,) = used.conversation.items
    assert clip.pcm.size >= (600 + 200 + 400) * RATE // 1000  # the whole utterance, both parts
    assert h.outcomes() == ["started", "discarded", "started", "used"]
    await h.session.close()


async def test_a_conversation_item_created_during_the_silence_replaces_the_speculation():
    engine = held_engine()
    h = await speculating(engine)
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "In French."}]})
    await settle()
    assert engine.cancelled_turns == 1
    await released_and_committed(engine, h)

    discarded, used = engine.requests[0], engine.used_requests()[0]
    assert [type(item) for item in discarded.conversation.items] == [UserAudio]
    assert [type(item) for item in used.conversation.items] == [UserText, UserAudio]
    assert h.types().count("response.created") == 1
    assert h.outcomes() == ["started", "discarded", "started", "used"]
    await h.session.close()


async def test_a_session_update_during_the_silence_replaces_the_speculation():
    engine = held_engine()
    h = await speculating(engine)
    await h.send(type="session.update", session={"instructions": "Answer in one word."})
    await settle()
    assert engine.cancelled_turns == 1
    await released_and_committed(engine, h)

    (used,) = engine.used_requests()
    assert used.conversation.instructions == "Answer in one word."
    assert engine.requests[0].conversation.instructions is None
    await h.session.close()


async def test_a_session_update_that_turns_speculation_off_cancels_it_and_the_commit_starts_the_answer():
    engine = held_engine()
    h = await speculating(engine)
    await h.send(type="session.update", session={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "speculative_response": False}}}})
    await settle()
    assert engine.cancelled_turns == 1
    done = await released_and_committed(engine, h)

    assert h.last("session.updated")["session"]["audio"]["input"]["turn_detection"]["speculative_response"] is False
    (used,) = engine.used_requests()
    assert used.preemptible_id is None
    assert done["latency"]["speculative"] is False
    assert h.outcomes() == ["started", "discarded"]
    await h.session.close()


async def test_input_audio_buffer_clear_during_the_silence_cancels_the_speculation_and_nothing_is_answered():
    engine = held_engine()
    h = await speculating(engine)
    await h.send(type="input_audio_buffer.clear")
    h.push(silence(600))
    await settle()

    assert engine.cancelled_turns == 1
    assert h.outcomes() == ["started", "discarded"]
    assert "input_audio_buffer.committed" not in h.types() and "response.created" not in h.types()
    engine.hold.set()
    await h.session.close()


async def test_a_camera_frame_during_the_silence_replaces_the_speculation_with_one_that_sees_it():
    engine = held_engine()
    h = await started(engine)
    h.session.add_video_frame(SampledFrame(encoded(64, 48, seed=1), 64, 48))  # before speech: the lead-in frame
    h.push(tone(600))
    h.push(silence(100))
    await settle()
    h.session.add_video_frame(SampledFrame(encoded(64, 48, seed=2), 64, 48))  # seen in the silence
    await settle()
    assert engine.cancelled_turns == 1
    await released_and_committed(engine, h)

    discarded, used = engine.requests[0], engine.used_requests()[0]
    assert [type(item) for item in discarded.conversation.items] == [UserImage, UserAudio]
    assert [type(item) for item in used.conversation.items] == [UserImage, UserImage, UserAudio]
    user_item = h.of_type("conversation.item.done")[0]["item"]
    assert [part["type"] for part in user_item["content"]] == ["input_image", "input_image", "input_audio"]
    await h.session.close()


async def test_a_client_response_create_during_the_silence_cancels_the_speculation():
    engine = held_engine()
    h = await speculating(engine)
    await h.send(type="response.create")
    await settle()

    assert engine.cancelled_turns == 1
    assert h.outcomes() == ["started", "discarded"]
    engine.hold.set()
    await h.session.close()


def comparable(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without what differs between any two runs (ids, times) and without usage (the
    speculative item holds less trailing silence: fewer audio tokens) and latency."""
    dropped = {"event_id", "item_id", "response_id", "previous_item_id", "id", "conversation_id", "expires_at",
               "call_id", "usage", "latency"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: strip(inner) for key, inner in value.items() if key not in dropped}
        if isinstance(value, list):
            return [strip(inner) for inner in value]
        return value

    return [strip(event) for event in events if event["type"] not in ("session.created", "session.updated")]


async def speak_and_play(speculative: bool, engine: Any, tools: list[dict[str, Any]] | None = None) -> SessionHarness:
    """One spoken turn answered and played, speculation on or off; ``tools`` set first if given."""
    h = await started(engine, SessionConfig(turn_detection=TurnDetection(speculative_response=speculative)))
    if tools is not None:
        await h.send(type="session.update", session={"tools": tools})
    h.push(tone(600))
    h.push(silence(700))
    await h.turn_done()
    await h.session.close()
    return h


async def test_a_speculative_answers_events_equal_a_committed_answers_in_order_and_content():
    on = await speak_and_play(True, ScriptedEngine(REPLY))
    off = await speak_and_play(False, ScriptedEngine(REPLY))

    assert comparable(on.events) == comparable(off.events)
    assert np.array_equal(np.concatenate(on.output.played), np.concatenate(off.output.played))
    assert on.last("response.done")["latency"]["speculative"] is True
    assert off.last("response.done")["latency"]["speculative"] is False
    # The only difference: the speculative item ends at the silence's first quiet window.
    tokens = [h.last("response.done")["response"]["usage"]["input_token_details"]["audio_tokens"] for h in (on, off)]
    assert tokens[0] < tokens[1]


async def test_tool_calls_from_a_speculative_answer_are_delivered_as_from_a_committed_one():
    class SpeculativeCaller(CallingEngine):
        async def promote(self, preemptible_id: str) -> bool:
            return True

    def engine() -> SpeculativeCaller:
        return SpeculativeCaller(Answer("Let me look.", calls=[("get_time", PARIS)]))

    on, off = await speak_and_play(True, engine(), [GET_TIME]), await speak_and_play(False, engine(), [GET_TIME])

    assert comparable(on.events) == comparable(off.events)
    calls = on.of_type("response.function_call_arguments.done")
    assert [(call["name"], call["arguments"]) for call in calls] == [("get_time", PARIS)]
    assert on.last("response.done")["latency"]["speculative"] is True
    assert on.engine.requests[0].preemptible_id is not None


async def test_with_the_batch_full_no_speculation_starts_and_the_commit_answers():
    engine = held_engine()
    engine.max_batch = 1
    other = await started(engine, SessionConfig(turn_detection=None))
    await other.send(type="response.create")  # another visitor's answer holds the only slot
    await settle()
    h = await speculating(engine)
    assert h.outcomes() == ["started", "refused"]
    done = await released_and_committed(engine, h)

    assert done["response"]["status"] == "completed"
    assert done["latency"]["speculative"] is False
    assert [request.preemptible_id for request in engine.used_requests()] == [None, None]
    await other.until("response.done")
    await other.session.close()
    await h.session.close()


async def test_a_committed_turn_preempts_a_speculation_in_the_last_slot_and_the_commit_still_answers():
    engine = held_engine()
    engine.max_batch = 1
    h = await speculating(engine)
    other = await started(engine, SessionConfig(turn_detection=None))
    await other.send(type="response.create")  # a committed answer needs the slot
    await settle()

    assert h.outcomes() == ["started", "preempted"]
    assert len(engine.running) == 1 and not engine.preemptible
    done = await released_and_committed(engine, h)
    assert done["response"]["status"] == "completed"
    assert done["latency"]["speculative"] is False
    assert (await other.until("response.done"))["response"]["status"] == "completed"
    await other.session.close()
    await h.session.close()


async def test_a_speculation_running_at_the_commit_is_promoted_and_streams_on():
    engine = held_engine()
    h = await started(engine)
    h.push(tone(600))
    h.push(silence(700))  # committed while the speculative answer waits after its first word
    await h.until("response.output_audio_transcript.delta")
    assert h.types().count("response.output_audio_transcript.delta") == 1
    assert engine.promoted == [engine.requests[0].preemptible_id]
    engine.hold.set()
    done = await h.turn_done()

    assert done["response"]["status"] == "completed"
    assert h.last("response.output_audio_transcript.done")["transcript"] == REPLY
    assert done["latency"]["speculative"] is True
    await h.session.close()


async def test_the_items_transcription_is_held_with_the_answer_and_released_after_its_first_audio():
    engine = ScriptedEngine(REPLY, transcript="hello there")
    h = await started(engine, SessionConfig(transcription=InputTranscription("any")))
    h.push(tone(600))
    h.push(silence(200))
    await settle()
    assert [request.task for request in engine.requests] == ["respond", "transcribe"]  # both run, held
    assert h.types() == ["session.created", "input_audio_buffer.speech_started"]
    h.push(silence(500))
    completed = await h.until(f"{TRANSCRIPTION}.completed")
    await h.turn_done()

    assert completed["transcript"] == "hello there"
    assert [request.task for request in engine.requests] == ["respond", "transcribe"]  # no second turn
    assert all(request.preemptible_id in engine.promoted for request in engine.requests)
    types = h.types()
    assert types.index("response.created") < types.index(f"{TRANSCRIPTION}.delta")
    assert types.index("response.output_audio_transcript.delta") < types.index(f"{TRANSCRIPTION}.delta")
    await h.session.close()


async def test_speech_that_keeps_dipping_starts_at_most_four_speculations_in_one_utterance():
    engine = held_engine()
    h = await started(engine)
    for _ in range(6):
        h.push(tone(300))
        h.push(silence(100))  # a dip: each one a candidate, each resumption cancels it
        await settle()
    engine.hold.set()
    h.push(tone(300))
    h.push(silence(700))
    done = await h.turn_done()

    assert h.outcomes().count("started") == 4
    assert done["latency"]["speculative"] is False  # the bound was reached: the commit started it
    await h.session.close()


async def test_speculative_starts_are_bounded_in_time_and_clearing_the_buffer_does_not_reset_them():
    """A session restarting its turn on purpose (speech, a candidate, input_audio_buffer.clear,
    again) gets the burst, then one start every 1 / SPECULATIONS_PER_SECOND seconds."""
    engine = held_engine()
    clock = FakeClock()
    h = SessionHarness(engine, EnergyVad(), clock=clock)
    await h.session.start()
    for _ in range(SPECULATION_BURST + 2):
        h.push(tone(300))
        h.push(silence(100))  # a candidate: a speculation starts while any start is left
        await settle()
        await h.send(type="input_audio_buffer.clear")
    assert h.outcomes().count("started") == SPECULATION_BURST
    clock.now += 1 / SPECULATIONS_PER_SECOND  # one more start's worth of time
    for _ in range(2):
        h.push(tone(300))
        h.push(silence(100))
        await settle()
        await h.send(type="input_audio_buffer.clear")
    assert h.outcomes().count("started") == SPECULATION_BURST + 1
    engine.hold.set()
    await h.session.close()


@pytest.mark.parametrize("interrupt_response", [False, True])
async def test_speech_while_a_speculative_answer_plays_is_handled_as_for_any_answer(interrupt_response):
    engine = ScriptedEngine(REPLY)
    h = await started(engine, SessionConfig(turn_detection=TurnDetection(interrupt_response=interrupt_response)))
    h.push(tone(600))
    h.push(silence(700))
    await h.until("response.done")
    h.output.play(1920)  # one of the answer's three frames heard
    h.push(tone(1000))  # the user speaks over it (a sentence: barge-in interrupts)
    h.push(silence(700))
    await settle()

    if interrupt_response:  # barge-in: cut, truncated, the new utterance answered
        await h.until("response.done", 2)
        assert h.last("conversation.item.truncated")["audio_end_ms"] == 80
        assert h.types().count("output_audio_buffer.cleared") == 1
    else:  # half-duplex: not heard, nothing speculated on it
        assert h.types().count("input_audio_buffer.speech_started") == 1
        assert len(engine.requests) == 1
    await h.session.close()


async def test_the_servers_setting_is_every_sessions_default_and_a_session_may_set_its_own():
    base = _base_session_config(Settings(speculative_responses=False))
    engine = held_engine()
    h = await started(engine, base)
    assert h.events[0]["session"]["audio"]["input"]["turn_detection"]["speculative_response"] is False
    await h.send(type="session.update", session={"turn_detection": {"type": "server_vad"}})  # beta, key left out
    assert h.last("session.updated")["session"]["audio"]["input"]["turn_detection"]["speculative_response"] is False
    h.push(tone(600))
    h.push(silence(100))
    await settle()
    assert engine.requests == [] and h.outcomes() == []  # the server's default: off

    await h.send(type="session.update", session={"turn_detection": {"type": "server_vad", "speculative_response": True}})
    assert h.last("session.updated")["session"]["audio"]["input"]["turn_detection"]["speculative_response"] is True
    engine.hold.set()
    await h.session.close()


# A value of each GenerationRequest field unlike ``BASE``'s: a field added to GenerationRequest must be put
# here (a held answer asked differently is not the answer wanted) or in NOT_COMPARED with a reason.
BASE = GenerationRequest(conversation=Conversation(items=(UserText("hello"),)))
CHANGED: dict[str, Any] = {
    "conversation": Conversation(items=(UserText("goodbye"),)),
    "voice": "chelsie",
    "temperature": 0.5,
    "max_output_tokens": 64,
    "output_audio": False,
    "task": "transcribe",
    "hint": TranscriptionHint(language="en"),
    "forced_reply": "A scripted reply.",
}
# preemptible_id names the held request; the wanted one, what a commit now would start, has none yet.
NOT_COMPARED: dict[str, Any] = {"preemptible_id": "spec_1"}


def test_every_field_of_a_turn_request_is_either_compared_or_named_as_not_compared():
    assert set(CHANGED) | set(NOT_COMPARED) == {field.name for field in dataclasses.fields(GenerationRequest)}
    assert not set(CHANGED) & set(NOT_COMPARED)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_request_that_differs_in_any_one_field_is_not_the_same_request(name: str):
    assert same_request(BASE, dataclasses.replace(BASE))
    assert not same_request(BASE, dataclasses.replace(BASE, **{name: CHANGED[name]}))


@pytest.mark.parametrize("name", sorted(NOT_COMPARED))
def test_a_request_that_differs_only_in_a_field_not_compared_is_the_same_request(name: str):
    assert same_request(dataclasses.replace(BASE, **{name: NOT_COMPARED[name]}), BASE)
