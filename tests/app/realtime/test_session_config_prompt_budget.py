"""A session's instructions and tools have a token budget: refused past it
at session.update and response.create, counted exactly once their bytes pass it."""

from __future__ import annotations

import json

import pytest_asyncio

from app.realtime.session_config import SessionConfig
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT
from pipeline.token_count import text_tokens
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness
from tests.hostile import punctuation_tools
from tests.settle import settle


@pytest_asyncio.fixture
async def harness():
    h = SessionHarness(ScriptedEngine("Okay."), EnergyVad(), SessionConfig(turn_detection=None))
    await h.session.start()
    yield h
    await h.session.close()


async def ask(h: SessionHarness, **response: object) -> dict:
    count = len(h.of_type("response.done")) + 1
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    await h.send(type="response.create", **({"response": response} if response else {}))
    return (await h.turn_done(count))["response"]


async def test_the_audits_tools_update_is_refused_naming_the_budget_and_changes_nothing(harness):
    h = harness
    tools = punctuation_tools()
    event = {"event_id": "u1", "type": "session.update", "session": {"instructions": "Be brief.", "tools": tools}}
    assert len(json.dumps(event)) < h.session.config.max_event_bytes  # ~241 KB: the event limit let it in
    await h.send(**event)
    error = h.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "session.tools", "u1")
    assert "16,000 tokens" in error["message"]
    counted = int(error["message"].split(" tokens")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert counted > 150_000  # the real count, not a byte estimate
    assert not h.of_type("session.updated")
    assert h.session.config.tools == () and h.session.config.instructions is None
    assert (await ask(h))["status"] == "completed"
    assert h.engine.requests[-1].conversation.tools == ()


async def test_instructions_over_the_budget_by_their_bytes_but_not_their_tokens_are_taken(harness):
    h = harness
    instructions = "请用简短的句子回答。" * 1_500  # 15,000 characters, 45,000 bytes
    assert len(instructions.encode()) > 16_000 > text_tokens(instructions)
    await h.send(type="session.update", session={"instructions": instructions})
    assert not h.of_type("error")
    assert h.last("session.updated")["session"]["instructions"] == instructions


async def test_a_response_over_the_budget_is_refused_and_the_next_one_runs(harness):
    h = harness
    await h.send(type="conversation.item.create",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    await h.send(event_id="r1", type="response.create", response={"tools": punctuation_tools(count=12)})
    await settle()  # a response started despite the refusal would have reached the engine by now
    error = h.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_value", "response.tools", "r1")
    assert not h.of_type("response.created") and h.engine.requests == []
    assert (await ask(h, instructions=DEFAULT_SYSTEM_PROMPT))["status"] == "completed"


async def test_the_budget_is_the_servers_setting():
    config = SessionConfig(turn_detection=None, max_instructions_tokens=1_000)
    h = SessionHarness(ScriptedEngine("Okay."), EnergyVad(), config)
    await h.session.start()
    await h.send(type="session.update", session={"instructions": "Answer in one word. " * 100})  # 2,000 bytes, 501 tokens
    assert not h.of_type("error")
    await h.send(type="session.update", session={"instructions": "Answer in one word. " * 300})
    assert "budget for them is 1,000 tokens" in h.last("error")["error"]["message"]
    await h.session.close()
