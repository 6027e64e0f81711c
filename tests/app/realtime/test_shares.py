"""A session's share of the engine, and its client's: prompt tokens charged per generation, bounded in time."""

from __future__ import annotations

import asyncio

from app.realtime.gate import EventRate
from app.realtime.session_config import SessionConfig
from app.realtime.shares import (
    ENGINE_SHARE_BURST,
    ENGINE_SHARE_PER_SECOND,
    ClientShares,
    EngineShare,
    SessionShare,
    ShareRefusal,
    ShareSize,
    answer_estimate,
    prompt_estimate,
)
from pipeline.conversation import Conversation, UserAudio, UserText
from tests.clock import FakeClock
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness
from tests.settle import settle
from tests.speech import silence, tone

# 24,000 bytes of instructions: a bound of ~24,000 prompt tokens each response (three fill the burst).
LONG_INSTRUCTIONS = "word " * 4_800


def test_work_someone_waits_for_is_charged_below_zero_and_throw_away_work_waits_for_the_refill():
    clock = FakeClock()
    bucket = EngineShare(burst=1_000, per_second=100, clock=clock)
    share = SessionShare(bucket)
    assert share.charge_within(600, "response") is None
    assert share.charge_within(600, "response") == ShareRefusal("session", 1_000, 100)  # 400 left: nothing charged
    share.charge(900)  # a spoken turn's answer runs whatever the share
    assert bucket.available == -500
    clock.now += 11
    assert bucket.available == 600 and share.charge_within(600, "speculative_response") is None
    clock.now += 100
    assert bucket.available == 1_000  # never more than the burst
    assert share.charge_within(5_000, "partial_transcript") is None  # larger than the burst: runs once it is full
    assert share.charged == 600 + 900 + 600 + 5_000


def test_two_sessions_of_one_client_draw_on_its_bucket_and_another_client_is_unaffected():
    clock = FakeClock()
    shares = ClientShares(ShareSize(1_000, 200), clock=clock)
    refusals: list[tuple[str, str]] = []

    def session_of(client: str) -> SessionShare:
        own = EngineShare(burst=1_000, per_second=100, clock=clock)
        return SessionShare(own, shares.join(client).budget.engine, on_refused=lambda limit, work: refusals.append((limit, work)))

    first, second, other = session_of("198.51.100.7"), session_of("198.51.100.7"), session_of("203.0.113.9")
    first.charge(900)  # a spoken turn's answer: charged to the session and to its client
    assert second.charge_within(600, "response") == ShareRefusal("client", 1_000, 200)
    assert second.charged == 0  # refused: nothing charged
    assert other.charge_within(600, "speculative_response") is None and other.charged == 600
    assert first.charge_within(600, "partial_transcript") == ShareRefusal("session", 1_000, 100)  # its own first
    assert refusals == [("client", "response"), ("session", "partial_transcript")]
    clock.now += 3  # the client's bucket refills at its own rate: 100 + 600
    assert second.charge_within(600, "response") is None


def test_a_clients_bucket_is_forgotten_once_its_last_session_closed_and_it_refilled():
    clock = FakeClock()
    shares = ClientShares(ShareSize(1_000, 100), clock=clock)
    shares.join("203.0.113.9").leave()
    assert len(shares) == 0  # nothing spent: forgotten at once

    first, second = shares.join("198.51.100.7"), shares.join("198.51.100.7")
    first.budget.engine.charge(500)
    first.leave()
    first.leave()  # twice: one session left
    second.leave()
    assert len(shares) == 1  # spent: kept, so that reopening a session does not start afresh
    again = shares.join("198.51.100.7")
    assert again.budget.engine.available == 500
    again.leave()
    clock.now += 5  # refilled: as good as a new one
    shares.join("203.0.113.9").leave()
    assert len(shares) == 0


def test_a_clients_budget_is_kept_until_its_event_rate_refilled_too():
    clock = FakeClock()
    shares = ClientShares(ShareSize(1_000, 100), EventRate(per_second=2, burst=4), clock=clock)
    held = shares.join("198.51.100.7")
    held.budget.events.take(4)  # its sessions' events spent the client's rate; its engine share is whole
    held.leave()
    assert len(shares) == 1
    again = shares.join("198.51.100.7")
    assert not again.budget.events.holds(1)  # reopening a session does not refill it
    again.leave()
    clock.now += 2  # refilled at 2 a second: as good as a new one
    shares.join("203.0.113.9").leave()
    assert len(shares) == 0


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


async def test_an_answer_cut_by_the_sessions_close_counts_what_it_decoded_in_the_sessions_figure():
    engine = ScriptedEngine("one two three four five six seven eight nine ten")
    engine.hold = asyncio.Event()  # each turn waits after its first word: still running at the close
    h = SessionHarness(engine, EnergyVad(), SessionConfig(instructions="Be brief."))
    await h.session.start()
    await h.send(type="response.create")
    await h.until("response.output_audio_transcript.delta")
    await h.session.close()
    (tokens,) = h.engine_tokens
    assert tokens > answer_estimate("Be brief.", 0)  # the prompt, and the word and frame it decoded


async def test_a_second_session_of_a_client_is_refused_at_the_clients_limit_and_another_client_is_served():
    engine = ScriptedEngine("one two three")
    clock = FakeClock()
    shares = ClientShares(clock=clock)
    config = SessionConfig(instructions=LONG_INSTRUCTIONS)
    async with (
        SessionHarness(engine, EnergyVad(), config, clock=clock, client="198.51.100.7", client_shares=shares) as first,
        SessionHarness(engine, EnergyVad(), config, clock=clock, client="198.51.100.7", client_shares=shares) as second,
        SessionHarness(engine, EnergyVad(), config, clock=clock, client="203.0.113.9", client_shares=shares) as other,
    ):
        while await created_and_cancelled(first) is None:  # the first spends its share and its client's
            pass
        assert first.share_refusals == [("session", "response")]

        assert await created_and_cancelled(second) == "engine_share_exceeded"
        (refused,) = [event["error"] for event in second.of_type("error") if event["error"]["code"] == "engine_share_exceeded"]
        assert "client's sessions" in refused["message"] and "the client limit" in refused["message"]
        assert second.share_refusals == [("client", "response")]
        assert await created_and_cancelled(other) is None  # another client's session is served
        assert other.share_refusals == []
    assert len(shares) == 2  # the spent clients' buckets are kept until they refill
