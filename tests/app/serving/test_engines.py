"""The engine as sessions get it: scripted dev replies (speculative answers included), metering."""

from __future__ import annotations

import dataclasses

import pytest

from app.metrics import Metrics
from app.serving.engines import DevReplies, MeteredEngine, StallTimeoutEngine, for_session
from pipeline.contract import EngineError, GenerationRequest, TextDelta
from pipeline.conversation import Conversation, UserAudio, UserText
from tests.fakes import FULL_CAPABILITIES, ScriptedEngine
from tests.speech import tone


async def answer(engine, request: GenerationRequest) -> str:
    return "".join([event.text async for event in engine.run_generation(request) if isinstance(event, TextDelta)])


class ForcedEngine(ScriptedEngine):
    """Says a request's forced reply when it has one, as the real engine does."""

    async def run_generation(self, request: GenerationRequest):
        self.reply = request.forced_reply or "my own words"
        async for event in super().run_generation(request):
            yield event


async def test_each_session_takes_the_replies_in_order_then_the_models_own():
    shared = ForcedEngine()
    question = GenerationRequest(Conversation((UserText("Hi"),)))
    first, second = DevReplies(shared, ("one", "two")), DevReplies(shared, ("one", "two"))
    assert [await answer(first, question) for _ in range(3)] == ["one", "two", "my own words"]
    assert await answer(second, question) == "one"  # a session of its own starts at the first


async def test_transcriptions_are_not_scripted():
    shared = ForcedEngine()
    engine = DevReplies(shared, ("scripted",))
    await answer(engine, GenerationRequest.transcription(UserAudio(tone(500))))
    assert shared.requests[-1].forced_reply is None
    assert await answer(engine, GenerationRequest(Conversation((UserText("Hi"),)))) == "scripted"


def test_every_wrapper_says_what_the_wrapped_engine_can_do():
    no_calls = dataclasses.replace(FULL_CAPABILITIES, function_calls=False)
    wrapped = DevReplies(MeteredEngine(StallTimeoutEngine(ScriptedEngine(capabilities=no_calls), stall_timeout_s=1.0),
                                       Metrics()), ("one",))
    assert wrapped.capabilities == no_calls


def test_without_replies_a_session_gets_the_shared_engine():
    shared = ForcedEngine()
    assert for_session(shared, ()) is shared


QUESTION = GenerationRequest(Conversation((UserText("Hi"),)))


def speculative(preemptible_id: str) -> GenerationRequest:
    return dataclasses.replace(QUESTION, preemptible_id=preemptible_id)


async def test_a_discarded_speculative_answer_leaves_its_reply_for_the_next_answer():
    engine = DevReplies(ForcedEngine(), ("one", "two"))
    assert await answer(engine, speculative("spec_1")) == "one"  # ran to its end, then thrown away
    assert await answer(engine, speculative("spec_2")) == "one"
    assert await answer(engine, QUESTION) == "one"  # the committed turn says it
    assert await answer(engine, QUESTION) == "two"


async def test_a_used_speculative_answer_takes_its_reply_also_when_it_ended_before_the_commit():
    engine = DevReplies(ForcedEngine(), ("one", "two", "three"))
    running = engine.run_generation(speculative("spec_1"))
    assert (await anext(running)).text == "one"
    assert await engine.promote("spec_1")  # used while still running
    assert [event async for event in running]  # its audio and GenerationDone
    assert await answer(engine, speculative("spec_2")) == "two"
    assert not await engine.promote("spec_2")  # it ended by itself before the commit: used all the same
    assert await answer(engine, QUESTION) == "three"


async def test_refused_and_preempted_speculations_are_not_counted_as_engine_errors():
    metrics = Metrics()
    shared = ForcedEngine()
    shared.max_batch = 0  # no slot for any preemptible turn
    with pytest.raises(EngineError) as refused:
        await answer(MeteredEngine(shared, metrics), speculative("spec_1"))
    assert refused.value.code == "no_spare_capacity"
    assert b"no_spare_capacity" not in metrics.render()
