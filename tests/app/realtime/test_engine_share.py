"""A session's share of the engine: prompt tokens charged per generation, bounded in time."""

from __future__ import annotations

import asyncio

from app.realtime.engine_share import ENGINE_SHARE_BURST, ENGINE_SHARE_PER_SECOND, EngineShare, prompt_estimate
from app.realtime.session_config import SessionConfig
from pipeline.conversation import Conversation, UserAudio, UserText
from tests.clock import FakeClock
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness
from tests.settle import settle
from tests.speech import silence, tone

# 24,000 bytes of instructions: a bound of ~24,000 prompt tokens each response (three fill the burst).
LONG_INSTRUCTIONS = "word " * 4_800


def test_work_someone_waits_for_is_charged_below_zero_and_throw_away_work_waits_for_the_refill():
    clock = FakeClock()
    share = EngineShare(burst=1_000, per_second=100, clock=clock)
    assert share.try_charge(600) and not share.try_charge(600)  # 400 left: refused, nothing charged
    share.charge(900)  # a spoken turn's answer runs whatever the share
    assert share.available == -500
    clock.now += 11
    assert share.available == 600 and share.try_charge(600)
    clock.now += 100
    assert share.available == 1_000  # never more than the burst
    assert share.try_charge(5_000)  # larger than the burst: it runs once the bucket is full
    assert share.charged == 600 + 900 + 600 + 5_000


def test_the_estimate_is_a_bound_on_the_prompt():
    short = prompt_estimate(Conversation(items=(UserText("hi"),), instructions="Be brief."))
    spoken = prompt_estimate(Conversation(items=(UserAudio(silence(1_000)),), instructions="Be brief."))
    long = prompt_estimate(Conversation(items=(UserText("hi"),), instructions=LONG_INSTRUCTIONS))
    assert short < spoken < long and long >= len(LONG_INSTRUCTIONS)


async def created_and_cancelled(h: SessionHarness) -> str | None:
    """A client's response.create, then its response.cancel; the create's refusal code, if any."""
    before = len(h.events)
    await h.send(type="response.create")
    await settle()
    refused = [event["error"]["code"] for event in h.events[before:] if event["type"] == "error"]
    await h.send(type="response.cancel")
    await settle()
    return refused[0] if refused else None


async def test_a_response_create_and_cancel_loop_is_refused_past_the_share_and_speech_is_still_answered():
    engine = ScriptedEngine("one two three")
    engine.hold = asyncio.Event()
    clock = FakeClock()
    async with SessionHarness(engine, EnergyVad(), SessionConfig(instructions=LONG_INSTRUCTIONS), clock=clock) as h:
        refusals = [await created_and_cancelled(h) for _ in range(4)]
        assert refusals[:2] == [None, None] and refusals[-1] == "engine_share_exceeded"
        started = len(engine.requests)
        assert started < 4
        engine.hold.set()
        await settle()
        h.output.play()  # the cancelled answers' first words play out

        answered = h.types().count("response.done") + 1
        h.push(tone(600))  # the user speaks: answered though the share is spent
        h.push(silence(700))
        done = await h.turn_done(answered)
        assert done["response"]["status"] == "completed" and len(engine.requests) == started + 1

        clock.now += ENGINE_SHARE_BURST / ENGINE_SHARE_PER_SECOND  # refilled: the client may ask again
        await h.send(type="response.create")
        await h.turn_done(answered + 1)
        assert len(engine.requests) == started + 2


async def test_speculation_waits_while_the_share_is_spent():
    engine = ScriptedEngine("one two three")
    clock = FakeClock()
    async with SessionHarness(engine, EnergyVad(), SessionConfig(instructions=LONG_INSTRUCTIONS), clock=clock) as h:
        while await created_and_cancelled(h) is None:  # the client spends the share
            pass
        h.output.play()  # the cancelled answers' first words play out
        h.push(tone(600))
        h.push(silence(100))  # a candidate end of turn: no speculative start
        await settle()
        assert "started" not in h.outcomes()
        answered = h.types().count("response.done") + 1
        h.push(silence(600))
        done = await h.turn_done(answered)
        assert done["latency"]["speculative"] is False


async def test_the_engine_tokens_a_session_caused_are_reported_once_when_it_closes():
    engine = ScriptedEngine("one two three")
    h = SessionHarness(engine, EnergyVad(), SessionConfig(instructions=LONG_INSTRUCTIONS))
    await h.session.start()
    await h.send(type="response.create")
    await h.turn_done()
    await h.session.close()
    await h.session.close()  # twice: reported once

    (tokens,) = h.engine_tokens
    assert tokens >= len(LONG_INSTRUCTIONS) // 4  # the instructions' bound at least, prefilled once


async def test_an_answer_is_charged_its_decoded_tokens_and_frames_besides_its_prompt():
    async def charged(reply: str) -> tuple[int, int]:
        engine = ScriptedEngine(reply)
        h = SessionHarness(engine, EnergyVad(), SessionConfig(instructions="Be brief."))
        await h.session.start()
        await h.send(type="response.create")
        done = await h.turn_done()
        await h.session.close()
        details = done["response"]["usage"]["output_token_details"]
        return h.engine_tokens[0], details["text_tokens"] + details["audio_tokens"]

    short, short_decoded = await charged("one")
    long, long_decoded = await charged("one two three four five six seven eight nine ten")
    assert long_decoded > short_decoded > 0
    assert long - short == long_decoded - short_decoded  # the same prompt: the difference is what was decoded
