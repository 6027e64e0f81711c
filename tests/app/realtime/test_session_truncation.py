"""``truncation``: how the history keeps to its token budget ("auto", "disabled", retention_ratio).

Text items of 200 bytes each (200 prompt tokens plus their message's) against a budget of 1,000
tokens: about four fit.
"""

from __future__ import annotations

import pytest

from app.realtime.session_config import SessionConfig
from pipeline.conversation import HistoryLimits, UserText
from tests.fakes import ScriptedEngine, SessionHarness

BUDGET = 1_000
TEXT = "x" * 200
ITEM_TOKENS = UserText(TEXT).prompt_tokens()


async def session(truncation: object | None = None) -> SessionHarness:
    h = SessionHarness(ScriptedEngine("Sure."), config=SessionConfig(history=HistoryLimits(max_prompt_tokens=BUDGET)))
    await h.session.start()
    if truncation is not None:
        await h.send(type="session.update", session={"type": "realtime", "truncation": truncation})
    return h


async def add_items(h: SessionHarness, count: int) -> list[int]:
    """Adds ``count`` text items one by one; the items held after each."""
    held = []
    for number in range(count):
        await h.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "id": f"u{number}", "content": [{"type": "input_text", "text": TEXT}]})
        held.append(h.session.stats()["items"])
    return held


@pytest.mark.parametrize("truncation, shown", [
    ("auto", "auto"),
    ("disabled", "disabled"),
    ({"type": "retention_ratio", "retention_ratio": 0.5},
     {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": None}),
    ({"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 600}},
     {"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {"post_instructions": 600}}),
])
async def test_session_updated_reflects_the_truncation(truncation, shown):
    h = await session(truncation)
    assert h.last("session.updated")["session"]["truncation"] == shown
    assert h.of_type("error") == []
    await h.session.close()


@pytest.mark.parametrize("truncation, param", [
    ("sometimes", "session.truncation"),
    ({"type": "retention_ratio", "retention_ratio": 1.5}, "session.truncation.retention_ratio"),
    ({"type": "retention_ratio"}, "session.truncation.retention_ratio"),
    ({"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}},
     "session.truncation.token_limits.post_instructions"),
])
async def test_a_wrong_truncation_is_refused_naming_it_and_nothing_changes(truncation, param):
    h = await session()
    await h.send(type="session.update", session={"truncation": truncation, "instructions": "Be brief."})
    error = h.last("error")["error"]
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert h.of_type("session.updated") == []
    assert h.session.config.instructions is None
    await h.session.close()


async def test_auto_drops_the_oldest_items_only_as_far_as_the_budget_needs():
    h = await session()
    held = await add_items(h, 10)
    fit = BUDGET // ITEM_TOKENS
    assert held == [1, 2, 3, 4] + [fit] * 6  # from the fifth on, each new item pushes out one
    assert [e["item_id"] for e in h.of_type("conversation.item.deleted")] == [f"u{n}" for n in range(6)]
    await h.session.close()


async def test_retention_ratio_drops_to_its_share_of_the_budget_so_truncations_come_less_often():
    h = await session({"type": "retention_ratio", "retention_ratio": 0.5})
    held = await add_items(h, 10)
    # Past 1,000 tokens (the fifth item) the history drops to 500: two items; then it grows again.
    assert held == [1, 2, 3, 4, 2, 3, 4, 2, 3, 4]
    assert len(h.of_type("conversation.item.deleted")) == 6
    await h.send(type="response.create")
    done = (await h.turn_done())["response"]
    assert done["status"] == "completed"
    assert len(h.engine.requests[0].conversation.items) == 4
    await h.session.close()


async def test_retention_ratios_token_limit_lowers_the_budget():
    h = await session({"type": "retention_ratio", "retention_ratio": 1.0, "token_limits": {"post_instructions": 500}})
    held = await add_items(h, 4)
    assert held == [1, 2, 2, 2]  # 500 tokens hold two items
    await h.session.close()


async def test_disabled_keeps_every_item_and_fails_a_response_past_the_budget_until_auto_applies():
    h = await session("disabled")
    held = await add_items(h, 8)
    assert held == list(range(1, 9))
    assert h.of_type("conversation.item.deleted") == []
    await h.send(type="response.create")
    done = (await h.turn_done())["response"]
    assert done["status"] == "failed"
    assert done["status_details"]["error"]["code"] == "context_length_exceeded"
    assert h.last("error")["error"]["code"] == "context_length_exceeded"
    assert h.engine.requests == []  # the model never saw it

    await h.send(type="session.update", session={"truncation": "auto"})
    # The budget applies at once: the oldest user items go, four stay (the failed answer's empty item too).
    assert [e["item_id"] for e in h.of_type("conversation.item.deleted")] == ["u0", "u1", "u2", "u3"]
    await h.send(type="response.create")
    assert (await h.turn_done(2))["response"]["status"] == "completed"
    await h.session.close()
