"""The engine as sessions get it: scripted dev replies."""

from __future__ import annotations

from app.web.engines import DevReplies, for_session
from pipeline.conversation import Conversation, UserAudio, UserText
from pipeline.turn import TextDelta, TurnRequest
from tests.fakes import ScriptedEngine
from tests.speech import tone


async def answer(engine, request: TurnRequest) -> str:
    return "".join([event.text async for event in engine.run_turn(request) if isinstance(event, TextDelta)])


class ForcedEngine(ScriptedEngine):
    """Says a request's forced reply when it has one, as the real engine does."""

    async def run_turn(self, request: TurnRequest):
        self.reply = request.forced_reply or "my own words"
        async for event in super().run_turn(request):
            yield event


async def test_each_session_takes_the_replies_in_order_then_the_models_own():
    shared = ForcedEngine()
    question = TurnRequest(Conversation((UserText("Hi"),)))
    first, second = DevReplies(shared, ("one", "two")), DevReplies(shared, ("one", "two"))
    assert [await answer(first, question) for _ in range(3)] == ["one", "two", "my own words"]
    assert await answer(second, question) == "one"  # a session of its own starts at the first


async def test_transcriptions_are_not_scripted():
    shared = ForcedEngine()
    engine = DevReplies(shared, ("scripted",))
    await answer(engine, TurnRequest.transcription(UserAudio(tone(500))))
    assert shared.requests[-1].forced_reply is None
    assert await answer(engine, TurnRequest(Conversation((UserText("Hi"),)))) == "scripted"


def test_without_replies_a_session_gets_the_shared_engine():
    shared = ForcedEngine()
    assert for_session(shared, ()) is shared
