"""TransformersEngine on the dev checkpoint, in a real engine process."""

import asyncio
import dataclasses
import os
import signal
from pathlib import Path

import numpy as np
import psutil
import pytest
import soundfile

from app.realtime.turn_taking import EngineTextJudge
from media.rates import VOICE_RATE
from pipeline.contract import AudioChunk, EngineCapabilities, EngineError, GenerationDone, GenerationRequest, TextDelta
from pipeline.conversation import Conversation, UserAudio, UserText
from pipeline.local.devices import ENGINE_NICENESS
from pipeline.local.transformers_engine import TransformersEngine, TransformersEnginePool
from pipeline.tool_format import Tool
from tests.conftest import started_dev_engine
from tests.hostile import punctuation_tools

# The engine lives on the session loop, so every test here runs on it too. Each runs the dev model
# in engine processes: the suite's heaviest CPU work, left out of `make test-unit` (`make test` runs it).
pytestmark = [pytest.mark.dev_model, pytest.mark.asyncio(loop_scope="session")]

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

# The dev Thinker ends answers after ~24 tokens at random; here every answer runs to its
# max_output_tokens (the engine's cap of 4096 when unset) so turns are as long as a test needs,
# and 20 codec frames (1.6 s) bound each turn's audio.
GENERATION = {"force_output_tokens": 4096, "max_audio_frames": 20}
# Generous bound for a turn that should follow a cancelled or crashed one: hitting it means the
# engine never freed itself, not that it was slow.
HANG_GUARD_S = 300


def speech() -> np.ndarray:
    pcm, rate = soundfile.read(FIXTURES / "hello.wav", dtype="float32")
    assert rate == 16_000
    return pcm


def short_request(**overrides) -> GenerationRequest:
    # 12 text tokens: 12 codec frames, 0.96 s of speech from the dev Talker.
    fields = {"conversation": Conversation(items=(UserAudio(speech()),)), "max_output_tokens": 12}
    return GenerationRequest(**(fields | overrides))


def long_request() -> GenerationRequest:
    # Unbounded text forced to the engine's 4096-token cap: minutes on CPU.
    return GenerationRequest(conversation=Conversation(items=(UserText("Tell me a long story."),)), output_audio=False)


async def collect(engine, request):
    return [event async for event in engine.run_generation(request)]


async def test_a_pool_of_engine_processes_declares_everything_the_model_does():
    pool = TransformersEnginePool("unused-model", devices=["cpu", "cpu"])
    assert pool.capabilities == EngineCapabilities(function_calls=True, forced_function_calls=True, end_of_turn_scores=True,
                                                   images=True, preemptible_generations=True)


async def test_a_pool_not_yet_started_reports_each_engine_process_down():
    health = TransformersEnginePool("unused-model", devices=["cpu", "cpu"]).health()
    assert (health.alive, health.restarts, health.queue_depth) == (False, 0, 0)
    assert [(member["state"], member["alive"]) for member in health.members] == [("stopped", False)] * 2
    assert not health.every_member_alive


@pytest.fixture(scope="module")
async def engine(dev_model_dir):
    async with started_dev_engine(dev_model_dir, generation=GENERATION) as engine:
        yield engine


async def test_start_returns_once_the_process_has_warmed_up(engine):
    described = engine.describe()
    assert (described["state"], described["alive"]) == ("ready", True)
    warm_up = described["warm_up"]
    # A spoken answer alone, a spoken answer and a transcription together, an end-of-turn score.
    assert (warm_up["turns"], warm_up["failed"]) == (4, 0)
    assert warm_up["audio_chunks"] >= 4  # two spoken answers, each a first chunk and a later one
    assert warm_up["text_deltas"] > 0
    assert "emulated_speed" not in described


async def test_speech_turn_streams_text_and_audio_and_ends_with_done(engine):
    events = await collect(engine, short_request())
    deltas = [event for event in events if isinstance(event, TextDelta)]
    chunks = [event for event in events if isinstance(event, AudioChunk)]
    assert deltas
    assert sum(len(chunk.pcm) for chunk in chunks) >= VOICE_RATE // 2
    assert isinstance(events[-1], GenerationDone)
    assert not any(isinstance(event, GenerationDone) for event in events[:-1])


async def test_text_deltas_concatenate_to_the_done_text(engine):
    events = await collect(engine, short_request(output_audio=False))
    assert "".join(event.text for event in events if isinstance(event, TextDelta)) == events[-1].text


async def test_done_reports_usage_and_timings(engine):
    done = (await collect(engine, short_request()))[-1]
    assert done.usage.input_audio_tokens > 0
    assert done.usage.output_audio_tokens > 0
    assert 0 <= done.timings.queue_wait <= done.timings.first_text <= done.timings.total
    assert done.timings.first_audio <= done.timings.total


async def test_max_output_tokens_reaches_the_thinker(engine):
    done = (await collect(engine, short_request(max_output_tokens=3, output_audio=False)))[-1]
    assert done.usage.output_text_tokens <= 3
    assert done.finish_reason == "length"


async def test_transcription_turn_is_text_only_and_deterministic(engine):
    # The engine's force_output_tokens makes this run to the request's own bound (16 + 10/s).
    request = GenerationRequest.transcription(UserAudio(speech()))
    first = await collect(engine, request)
    second = await collect(engine, request)
    assert not any(isinstance(event, AudioChunk) for event in first)
    done = first[-1]
    assert isinstance(done, GenerationDone) and done.text
    assert done.usage.output_audio_tokens == 0 and done.usage.input_audio_tokens > 0
    assert done.usage.output_text_tokens <= request.max_output_tokens
    assert second[-1].text == done.text


async def test_end_of_turn_turn_scores_the_open_message_without_generating(engine):
    unfinished = await collect(engine, GenerationRequest.end_of_turn("Please put the"))
    finished = await collect(engine, GenerationRequest.end_of_turn("Please put the groceries in the fridge."))
    again = await collect(engine, GenerationRequest.end_of_turn("Please put the"))
    (done,) = unfinished  # no text, no audio: one forward, one answer
    assert isinstance(done, GenerationDone) and done.text == "" and done.usage.output_text_tokens == 0
    assert 0.0 <= done.end_of_turn_probability <= 1.0
    assert again[-1].end_of_turn_probability == done.end_of_turn_probability
    # The dev model's judgement is noise, but it reads the words: other words, another answer.
    assert finished[-1].end_of_turn_probability != done.end_of_turn_probability


async def test_engine_text_judge_transcribes_with_qwens_asr_then_scores_the_transcript(engine):
    verdict = await EngineTextJudge(engine).judge(speech())
    transcript = (await collect(engine, GenerationRequest.transcription(UserAudio(speech()))))[-1].text.strip()
    scored = (await collect(engine, GenerationRequest.end_of_turn(transcript)))[-1]
    assert verdict.transcript == transcript
    assert verdict.complete == scored.end_of_turn_probability


async def test_seeded_engine_repeats_a_turn_exactly(engine):
    first = (await collect(engine, short_request(output_audio=False)))[-1]
    second = (await collect(engine, short_request(output_audio=False)))[-1]
    assert first.text == second.text


async def test_closing_the_iterator_cancels_the_turn_and_frees_the_engine(engine):
    turn = engine.run_generation(long_request())
    assert isinstance(await anext(turn), TextDelta)
    await turn.aclose()
    events = await asyncio.wait_for(collect(engine, short_request()), HANG_GUARD_S)
    assert isinstance(events[-1], GenerationDone)
    assert engine.restarts == 0


async def test_cancelling_the_consuming_task_cancels_the_turn(engine):
    started = asyncio.Event()

    async def consume():
        async for _ in engine.run_generation(long_request()):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    events = await asyncio.wait_for(collect(engine, short_request()), HANG_GUARD_S)
    assert isinstance(events[-1], GenerationDone)


@pytest.fixture(scope="module")
async def one_at_a_time(dev_model_dir):
    async with started_dev_engine(dev_model_dir, generation=GENERATION, max_batch=1) as engine:
        yield engine


async def test_turns_beyond_max_batch_wait_first_in_first_out(one_at_a_time):
    engine = one_at_a_time
    order = []

    async def run(name):
        async for event in engine.run_generation(short_request()):
            order.append(name)
            if isinstance(event, GenerationDone):
                return event

    first = asyncio.create_task(run("first"))
    second = asyncio.create_task(run("second"))
    await asyncio.sleep(0)
    assert (engine.running, engine.queue_depth) == (1, 1)
    _, second_done = await asyncio.gather(first, second)
    assert order == sorted(order)  # every "first" event before any "second" one
    assert order[0] == "first"
    assert second_done.timings.queue_wait > 0


async def slots_freed(engine: TransformersEngine) -> None:
    """Until the engine process has confirmed that every closed turn stopped (a slot is held till then)."""
    async def freed() -> None:
        while engine.running:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(freed(), HANG_GUARD_S)


async def test_a_preemptible_turn_is_refused_at_once_when_every_slot_is_taken(one_at_a_time):
    engine = one_at_a_time
    await slots_freed(engine)
    ordinary = engine.run_generation(long_request())
    assert isinstance(await anext(ordinary), TextDelta)
    with pytest.raises(EngineError) as refused:
        await anext(engine.run_generation(dataclasses.replace(short_request(), preemptible_id="spec_1")))
    assert refused.value.code == "no_spare_capacity"
    assert (engine.running, engine.queue_depth) == (1, 0)
    await ordinary.aclose()


async def test_an_ordinary_turn_takes_a_preemptible_turns_slot_at_once(one_at_a_time):
    engine = one_at_a_time
    await slots_freed(engine)
    speculative = engine.run_generation(dataclasses.replace(long_request(), preemptible_id="spec_2"))
    assert isinstance(await anext(speculative), TextDelta)
    assert engine.spare == 0
    committed = asyncio.create_task(collect(engine, short_request()))
    await asyncio.sleep(0)
    assert (engine.running, engine.queue_depth) == (1, 0)  # submitted at once, not queued behind it
    with pytest.raises(EngineError) as preempted:
        async for _ in speculative:
            pass
    assert preempted.value.code == "preempted"
    events = await asyncio.wait_for(committed, HANG_GUARD_S)
    assert isinstance(events[-1], GenerationDone) and events[-1].finish_reason != "cancelled"
    events = await asyncio.wait_for(collect(engine, short_request()), HANG_GUARD_S)  # the slot is free again
    assert isinstance(events[-1], GenerationDone)


async def test_a_promoted_turn_is_an_ordinary_one_and_keeps_its_slot(one_at_a_time):
    engine = one_at_a_time
    await slots_freed(engine)
    speculative = engine.run_generation(dataclasses.replace(long_request(), preemptible_id="spec_3"))
    assert isinstance(await anext(speculative), TextDelta)
    assert await engine.promote("spec_3")
    assert not await engine.promote("spec_3") and not await engine.promote("spec_unknown")
    committed = asyncio.create_task(collect(engine, short_request()))
    await asyncio.sleep(0)
    assert (engine.running, engine.queue_depth) == (1, 1)  # it waits, as behind any committed turn
    assert isinstance(await anext(speculative), TextDelta)
    await speculative.aclose()
    events = await asyncio.wait_for(committed, HANG_GUARD_S)
    assert isinstance(events[-1], GenerationDone)


async def test_concurrent_turns_are_decoded_together_and_each_gets_what_it_gets_alone(engine):
    spoken = short_request(temperature=0)
    typed = GenerationRequest(
        conversation=Conversation(items=(UserText("hi there, how are you?"),)), temperature=0, max_output_tokens=8
    )
    alone = {name: await collect(engine, request) for name, request in (("spoken", spoken), ("typed", typed))}
    order = []

    async def run(name, request):
        events = []
        async for event in engine.run_generation(request):
            order.append(name)
            events.append(event)
        return events

    spoken_task = asyncio.create_task(run("spoken", spoken))
    typed_task = asyncio.create_task(run("typed", typed))
    await asyncio.sleep(0)
    assert (engine.running, engine.queue_depth) == (2, 0)
    together = dict(zip(("spoken", "typed"), await asyncio.gather(spoken_task, typed_task)))
    assert order != sorted(order)  # interleaved: neither waited for the other to finish
    for name, events in together.items():
        done, expected = events[-1], alone[name][-1]
        assert (done.text, done.usage) == (expected.text, expected.usage)
        assert done.timings.queue_wait < done.timings.first_text
        chunks = [event for event in events if isinstance(event, AudioChunk)]
        expected_chunks = [event for event in alone[name] if isinstance(event, AudioChunk)]
        assert sum(chunk.frames for chunk in chunks) == sum(chunk.frames for chunk in expected_chunks)
    assert engine.describe()["running"] == 0


async def test_a_short_turn_beside_a_long_prompt_answers_before_the_long_prompt_is_prefilled(engine):
    # ~6,000 prompt tokens: a dozen prefill chunks. Prefilled together, the short turn would wait
    # for the whole long prompt (padded to its length) and answer after it.
    long_prompt = GenerationRequest(conversation=Conversation(items=(UserText("lorem ipsum " * 3000),)),
                                    output_audio=False, max_output_tokens=2)
    firsts: list[str] = []

    async def first_text(name: str, request: GenerationRequest) -> list:
        events = []
        async for event in engine.run_generation(request):
            if isinstance(event, TextDelta) and name not in firsts:
                firsts.append(name)
            events.append(event)
        return events

    long_task = asyncio.create_task(first_text("long", long_prompt))
    short_task = asyncio.create_task(first_text("short", short_request(output_audio=False, max_output_tokens=2)))
    long_events, short_events = await asyncio.wait_for(asyncio.gather(long_task, short_task), HANG_GUARD_S)
    assert firsts == ["short", "long"]
    assert long_events[-1].finish_reason == short_events[-1].finish_reason == "length"


async def test_the_engine_process_yields_the_cpu_to_the_server(engine):
    assert psutil.Process(engine.pid).nice() == psutil.Process().nice() + ENGINE_NICENESS


async def test_a_failing_turn_raises_engine_error_and_the_next_turn_works(engine):
    # 10 samples (0.6 ms) are too short for one feature frame: rendering raises in the engine process.
    bad = GenerationRequest(conversation=Conversation(items=(UserAudio(np.zeros(10, dtype=np.float32)),)))
    with pytest.raises(EngineError, match="ValueError"):
        await collect(engine, bad)
    events = await collect(engine, short_request())
    assert isinstance(events[-1], GenerationDone)


async def test_a_failing_turn_submitted_with_others_fails_alone(engine):
    # Submitted in one burst, the three reach the engine together; the bad one fails at
    # rendering and the other two are prefilled and decoded as they are alone.
    bad = GenerationRequest(conversation=Conversation(items=(UserAudio(np.zeros(10, dtype=np.float32)),)))
    good = short_request(temperature=0)
    alone = await collect(engine, good)
    results = await asyncio.gather(
        collect(engine, good), collect(engine, bad), collect(engine, good), return_exceptions=True
    )
    assert isinstance(results[1], EngineError) and "ValueError" in str(results[1])
    for events in (results[0], results[2]):
        assert isinstance(events, list)
        assert (events[-1].text, events[-1].usage) == (alone[-1].text, alone[-1].usage)
    assert engine.describe()["running"] == 0


async def test_a_prompt_past_the_limit_fails_alone_before_it_joins_the_batch(engine):
    # 16 tools of punctuation render to ~190,000 tokens; unchecked, the batched prefill would pad
    # every row to that and a failed step would fail every generation in it.
    tools = tuple(Tool(tool["name"], tool["description"], tool["parameters"]) for tool in punctuation_tools())
    huge = GenerationRequest(conversation=Conversation(items=(UserText("Hi"),), tools=tools), max_output_tokens=4)
    good = short_request(temperature=0)
    alone = await collect(engine, good)
    results = await asyncio.gather(collect(engine, good), collect(engine, huge), return_exceptions=True)
    refused = results[1]
    assert isinstance(refused, EngineError) and refused.code == "prompt_too_long"
    assert "at most 32768" in str(refused)
    events = results[0]
    assert isinstance(events, list)
    assert (events[-1].text, events[-1].usage) == (alone[-1].text, alone[-1].usage)
    assert sum(len(event.pcm) for event in events if isinstance(event, AudioChunk)) > 0


async def test_a_killed_engine_process_fails_its_turn_and_is_restarted(engine):
    restarts = engine.restarts
    turn = engine.run_generation(long_request())
    assert isinstance(await anext(turn), TextDelta)
    dead = engine.pid
    os.kill(engine.pid, signal.SIGKILL)
    with pytest.raises(EngineError) as failure:
        async for _ in turn:
            pass
    assert failure.value.code == "engine_died"
    assert engine.state in ("loading", "warming") and not engine.alive
    events = await asyncio.wait_for(collect(engine, short_request()), HANG_GUARD_S)
    assert isinstance(events[-1], GenerationDone)
    assert engine.restarts == restarts + 1
    assert engine.alive
    # The new process warmed up too before it was given the turn (it reads none before: test_warmup.py).
    assert engine.pid != dead
    assert engine.describe()["warm_up"]["turns"] == 4


async def test_close_fails_waiting_turns_and_is_safe_twice(dev_model_dir):
    engine = TransformersEngine(dev_model_dir, device="cpu", threads=1, generation=GENERATION)
    await engine.start()
    assert engine.alive
    running = asyncio.create_task(collect(engine, long_request()))
    waiting = asyncio.create_task(collect(engine, short_request()))
    await asyncio.sleep(0)
    await engine.close()
    await engine.close()
    assert not engine.alive
    for task in (running, waiting):
        with pytest.raises(EngineError, match="closed"):
            await task


async def test_a_killed_engine_process_fails_every_turn_of_its_batch_and_the_next_turns_complete(engine):
    turns = [engine.run_generation(long_request()) for _ in range(2)]
    for turn in turns:
        assert isinstance(await anext(turn), TextDelta)
    assert engine.running == 2
    os.kill(engine.pid, signal.SIGKILL)
    for turn in turns:
        with pytest.raises(EngineError) as failure:
            async for _ in turn:
                pass
        assert failure.value.code == "engine_died"
    results = await asyncio.wait_for(
        asyncio.gather(collect(engine, short_request()), collect(engine, short_request())), HANG_GUARD_S
    )
    assert all(isinstance(events[-1], GenerationDone) for events in results)


async def test_a_pool_sends_turns_to_the_least_loaded_engine_and_a_crash_fails_only_its_turns(dev_model_dir):
    pool = TransformersEnginePool(dev_model_dir, devices=["cpu", "cpu"], seed=0, threads=1, generation=GENERATION)
    await pool.start()
    try:
        first, second = pool.run_generation(long_request()), pool.run_generation(long_request())
        for turn in (first, second):
            assert isinstance(await anext(turn), TextDelta)
        assert [engine["running"] for engine in pool.describe()] == [1, 1]
        victim = pool.engines[0]
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(EngineError) as failure:
            async for _ in first:
                pass
        assert failure.value.code == "engine_died"
        # The other engine's turn goes on.
        assert isinstance(await anext(second), TextDelta)
        await second.aclose()
        events = await asyncio.wait_for(collect(pool, short_request()), HANG_GUARD_S)
        assert isinstance(events[-1], GenerationDone)
        await asyncio.wait_for(_restarted(victim), HANG_GUARD_S)
        described = pool.describe()
        assert [engine["restarts"] for engine in described] == [1, 0] and all(engine["alive"] for engine in described)
    finally:
        await pool.close()
        await pool.close()


async def test_engines_sharing_a_cpu_share_its_cores_unless_threads_are_given(dev_model_dir):
    pool = TransformersEnginePool(dev_model_dir, devices=["cpu", "cpu"], seed=0, generation=GENERATION)
    await pool.start()
    try:
        share = max(1, len(os.sched_getaffinity(0)) // 2)
        assert [engine["threads"] for engine in pool.describe()] == [share, share]
    finally:
        await pool.close()


async def _restarted(engine):
    while not engine.alive:
        await asyncio.sleep(0.05)


async def test_unknown_generation_option_fails_start_with_a_clear_error(dev_model_dir):
    engine = TransformersEngine(dev_model_dir, device="cpu", threads=1, generation={"no_such_option": 1})
    with pytest.raises(EngineError, match="no_such_option"):
        await engine.start()
    await engine.close()


async def test_a_turn_on_an_engine_that_was_never_started_fails_clearly(dev_model_dir):
    engine = TransformersEngine(dev_model_dir, device="cpu")
    with pytest.raises(EngineError, match="not running"):
        await collect(engine, short_request())
    assert not engine.alive
    await engine.close()


def engine_processes() -> set[int]:
    """Pids of spawned children of this process (not multiprocessing's resource tracker)."""
    return {child.pid for child in psutil.Process().children() if "spawn_main" in " ".join(child.cmdline())}


async def _new_engine_process(existing: set[int]):
    while not engine_processes() - existing:
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("moment", ["before the spawn", "while the model loads"])
async def test_close_during_start_ends_start_with_engine_error(dev_model_dir, moment):
    existing = engine_processes()  # the module's engine may be running
    engine = TransformersEngine(dev_model_dir, device="cpu", threads=1)
    starting = asyncio.create_task(engine.start())
    if moment == "before the spawn":
        await asyncio.sleep(0)
    else:
        await asyncio.wait_for(_new_engine_process(existing), HANG_GUARD_S)
    await engine.close()
    with pytest.raises(EngineError):
        await starting
    assert not engine.alive
    assert engine_processes() <= existing


# Text after 1.5 s of model time, audio after ten minutes: a turn is held well past any test's wait.
EMULATED = {"first_text_ms": 1500, "first_audio_ms": 600_000}


@pytest.fixture(scope="module")
async def emulated(dev_model_dir):
    async with started_dev_engine(dev_model_dir, max_batch=1, generation={**GENERATION, "emulate": EMULATED}) as engine:
        yield engine


async def test_an_emulated_engine_holds_a_turn_until_its_model_time(emulated):
    assert emulated.describe()["emulated_speed"] == EMULATED
    loop = asyncio.get_running_loop()
    submitted = loop.time()
    turn = emulated.run_generation(short_request())
    first = await anext(turn)
    # The dev model writes its first token in tens of milliseconds; the emulated one in 1.5 s.
    assert isinstance(first, TextDelta)
    assert loop.time() - submitted >= 1.5
    await turn.aclose()


async def test_cancelling_an_emulated_turn_mid_delay_ends_it_at_once(emulated):
    turn = emulated.run_generation(short_request())
    assert isinstance(await anext(turn), TextDelta)  # decoded long since; its audio is held for ten minutes
    await turn.aclose()
    # The engine decodes one turn at a time: the next turn starts only once the cancelled one has ended.
    following = emulated.run_generation(short_request())
    assert isinstance(await asyncio.wait_for(anext(following), HANG_GUARD_S), TextDelta)
    assert emulated.running == 1
    await following.aclose()


async def test_a_wrong_emulated_speed_is_refused_when_the_engine_is_made(dev_model_dir):
    with pytest.raises(ValueError, match="first_audio"):
        TransformersEngine(dev_model_dir, device="cpu", generation={"emulate": {"first_audio": 400}})
