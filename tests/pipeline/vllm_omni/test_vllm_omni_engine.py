"""The vLLM-Omni engine against the replay of vLLM-Omni 0.32's server on 127.0.0.1 (tests/vllm_omni_replay.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from app.serving.engines import StallTimeoutEngine
from pipeline.contract import (
    AudioChunk,
    EngineCapabilities,
    EngineError,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallStarted,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
)
from pipeline.conversation import AssistantText, Conversation, UserAudio, UserText
from pipeline.tool_format import FunctionCall, FunctionOutput, Tool
from pipeline.vllm_omni import vllm_omni_engine
from pipeline.vllm_omni.chat_completions import MAX_EVENT_LINE_BYTES
from pipeline.vllm_omni.vllm_omni_engine import VllmOmniEngine, VllmOmniEnginePool, redacted
from tests.fakes import SessionHarness
from tests.vllm_omni_replay import (
    ANSWER_TEXT,
    FAILURE_CODES,
    MODEL,
    TRANSCRIPT,
    Failure,
    Pace,
    ReplayServer,
    ToolCallAnswer,
    answer_audio,
)

DEADLINE_S = 30.0  # a guard against hangs, not a speed limit
# Five times faster than a GPU deployment decodes (tests/e2e keeps the realistic pace): a 3.7 s
# answer's audio streams in ~0.5 s, still chunk after chunk while the text streams.
FAST = Pace(first_token_s=0.05, first_audio_s=0.15, real_time_factor=0.1)


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer(pace=FAST) as server:
        yield server


def spoken(text: str = "Hello?") -> GenerationRequest:
    return GenerationRequest(Conversation(items=(UserText(text),)), voice="chelsie")


def written(text: str = "Hello?") -> GenerationRequest:
    return GenerationRequest(Conversation(items=(UserText(text),)), output_audio=False)


async def run(engine: VllmOmniEngine | VllmOmniEnginePool, request: GenerationRequest) -> list[tuple[float, GenerationEvent]]:
    """Every event of one turn with its arrival time."""
    async with asyncio.timeout(DEADLINE_S):
        return [(time.monotonic(), event) async for event in engine.run_generation(request)]


@contextlib.asynccontextmanager
async def started(*urls: str, **options) -> VllmOmniEnginePool:
    pool = VllmOmniEnginePool(list(urls), **options)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


async def test_a_spoken_turn_streams_audio_before_the_server_ends_its_stream(replay: ReplayServer) -> None:
    async with started(replay.url) as engine:
        events = await run(engine, spoken())
    received = replay.requests[-1]
    texts = [event.text for _, event in events if isinstance(event, TextDelta)]
    audio = [(at, event) for at, event in events if isinstance(event, AudioChunk)]
    done = events[-1][1]
    assert "".join(texts) == ANSWER_TEXT
    pcm = np.concatenate([chunk.pcm for _, chunk in audio])
    assert np.max(np.abs(pcm - replay.answer)) < 1 / 16_000
    # [DONE]'s time is written in the replay's thread after its last write: the client may have read
    # it first on a loaded box.
    assert await asyncio.to_thread(received.wait_ended, DEADLINE_S) and received.done_at is not None
    assert audio[0][0] < received.done_at  # the first audio reached us while the server still streamed
    assert len(audio) == received.audio_chunks_sent > 1
    assert isinstance(done, GenerationDone) and done.text == ANSWER_TEXT and done.finish_reason == "stop"
    assert done.usage.output_text_tokens == len(texts) + 1  # the server's count, its stop token included
    assert done.usage.output_audio_tokens == len(replay.answer) // 1920
    assert done.timings.first_audio is not None and done.timings.first_text < done.timings.first_audio


async def test_the_engine_is_named_after_the_servers_model(replay: ReplayServer) -> None:
    async with started(replay.url) as engine:
        assert engine.name == MODEL
        assert engine.describe() == [{
            "url": replay.url, "alive": True, "model": MODEL, "running": 0, "turns": 0, "failures": 0,
            "last_error": None, "probe_ms": engine.engines[0].describe()["probe_ms"],
        }]


async def test_usage_splits_the_prompt_into_audio_and_text_tokens(replay: ReplayServer) -> None:
    clip = UserAudio((0.1 * np.ones(32_000)).astype(np.float32))  # 2 s: the replay counts 25 tokens
    async with started(replay.url) as engine:
        events = await run(engine, GenerationRequest(Conversation(items=(clip,))))
    done = events[-1][1]
    assert isinstance(done, GenerationDone)
    assert done.usage.input_audio_tokens == 25 and done.usage.input_text_tokens > 0


async def test_a_second_turn_sends_the_first_as_history(replay: ReplayServer) -> None:
    clip = UserAudio((0.1 * np.ones(16_000)).astype(np.float32))
    conversation = Conversation(items=(clip, AssistantText("Once upon a time,"), UserText("Go on.")))
    async with started(replay.url) as engine:
        await run(engine, GenerationRequest(conversation))
    messages = replay.requests[-1].body["messages"]
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"][0]["type"] == "input_audio"
    assert messages[2] == {"role": "assistant", "content": "Once upon a time,"}


async def test_a_transcription_is_text_only(replay: ReplayServer) -> None:
    clip = UserAudio((0.1 * np.ones(16_000)).astype(np.float32))
    async with started(replay.url) as engine:
        events = await run(engine, GenerationRequest.transcription(clip))
    assert replay.requests[-1].modalities == ["text"]
    assert not [event for _, event in events if isinstance(event, AudioChunk)]
    done = events[-1][1]
    assert isinstance(done, GenerationDone) and done.text == TRANSCRIPT and done.finish_reason == "stop"


def test_a_pool_of_servers_calls_functions_but_forces_no_call_and_scores_no_end_of_turn() -> None:
    pool = VllmOmniEnginePool(["http://gpu-1:8091/v1", "http://gpu-2:8091/v1"])
    assert pool.capabilities == EngineCapabilities(function_calls=True, forced_function_calls=False,
                                                   end_of_turn_scores=False, images=True, preemptible_generations=True)


WEATHER_TOOL = Tool("get_weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}})
WEATHER = ToolCallAnswer("get_weather", '{"city": "Paris"}', preface="Let me check.", preface_audio=answer_audio("hello"))
ASKED = UserText("What is the weather in Paris?")


@contextlib.contextmanager
def calling(replay: ReplayServer, call: ToolCallAnswer) -> Iterator[None]:
    """The replay answers a request that offers tools with ``call`` meanwhile."""
    replay.tool_call = call
    try:
        yield
    finally:
        replay.tool_call = None


async def test_a_streamed_call_becomes_the_in_process_engines_call_events_and_its_output_goes_back(
    replay: ReplayServer,
) -> None:
    with calling(replay, WEATHER):
        async with started(replay.url) as engine:
            first = [event for _, event in await run(engine, GenerationRequest(Conversation((ASKED,), tools=(WEATHER_TOOL,))))]
            asked = replay.requests[-1]
            history = (ASKED, AssistantText("Let me check."), FunctionCall("call_7", "get_weather", WEATHER.arguments),
                       FunctionOutput("call_7", "sunny, 21 C"))
            second = [event for _, event in await run(engine, GenerationRequest(Conversation(history, tools=(WEATHER_TOOL,))))]
            answered = replay.requests[-1]
    assert asked.body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.", "parameters": dict(WEATHER_TOOL.parameters)}}]
    assert asked.body["tool_choice"] == "auto"
    kinds = [type(event).__name__ for event in first if not isinstance(event, AudioChunk)]
    assert kinds[:4] == ["TextDelta", "TextDelta", "TextDelta", "FunctionCallStarted"]  # the preface, then the call
    calls = [event for event in first if isinstance(event, FunctionCallStarted | FunctionCallDelta | FunctionCallDone)]
    assert calls[0] == FunctionCallStarted(0, "get_weather")
    assert "".join(event.delta for event in calls if isinstance(event, FunctionCallDelta)) == WEATHER.arguments
    assert calls[-1] == FunctionCallDone(0, "get_weather", WEATHER.arguments, closed=True, well_formed=True)
    assert sum(event.pcm.size for event in first if isinstance(event, AudioChunk)) == WEATHER.preface_audio.size
    done = first[-1]
    assert isinstance(done, GenerationDone) and done.text == "Let me check." and done.finish_reason == "stop"
    assert answered.body["messages"][2:] == [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER.arguments}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny, 21 C"},
    ]
    assert isinstance(second[-1], GenerationDone) and second[-1].text == ANSWER_TEXT  # the output, answered in words


async def test_a_call_cut_at_max_output_tokens_is_done_not_closed(replay: ReplayServer) -> None:
    request = GenerationRequest(Conversation((ASKED,), tools=(WEATHER_TOOL,)), output_audio=False, max_output_tokens=14)
    with calling(replay, ToolCallAnswer("get_weather", '{"city": "Paris", "unit": "celsius"}')):
        async with started(replay.url) as engine:
            events = [event for _, event in await run(engine, request)]
    (done_call,) = [event for event in events if isinstance(event, FunctionCallDone)]
    assert done_call.name == "get_weather" and not done_call.closed
    assert '{"city": "Paris", "unit": "celsius"}'.startswith(done_call.arguments) and done_call.arguments
    assert isinstance(events[-1], GenerationDone) and events[-1].finish_reason == "length"


async def test_tools_to_a_server_started_without_a_tool_parser_fail_the_turn(replay: ReplayServer) -> None:
    replay.auto_tool_choice = False
    try:
        async with started(replay.url) as engine:
            with pytest.raises(EngineError) as failed:
                await run(engine, GenerationRequest(Conversation((ASKED,), tools=(WEATHER_TOOL,))))
            served = await run(engine, spoken())
    finally:
        replay.auto_tool_choice = True
    assert failed.value.code == "engine_http_error"
    assert isinstance(served[-1][1], GenerationDone)


async def test_a_sessions_call_round_trip_runs_on_the_engine_server(replay: ReplayServer) -> None:
    """The realtime session on this engine: the call streams as function-call events, the client's
    output goes back as a tool message with the call's id, and the answer to it is spoken."""
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
            "parameters": dict(WEATHER_TOOL.parameters)}
    with calling(replay, WEATHER):
        async with started(replay.url) as engine, SessionHarness(engine) as h:
            await h.send(type="session.update", session={"tools": [tool]})
            await h.send(type="conversation.item.create", item={
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": ASKED.text}]})
            await h.send(type="response.create")
            first = (await h.turn_done(timeout_s=DEADLINE_S))["response"]
            (call,) = [item for item in first["output"] if item["type"] == "function_call"]
            await h.send(type="conversation.item.create",
                         item={"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"})
            await h.send(type="response.create")
            second = (await h.turn_done(2, timeout_s=DEADLINE_S))["response"]
    deltas = h.of_type("response.function_call_arguments.delta")
    (arguments_done,) = h.of_type("response.function_call_arguments.done")
    assert first["status"] == "completed" and [item["type"] for item in first["output"]] == ["message", "function_call"]
    assert "".join(delta["delta"] for delta in deltas) == arguments_done["arguments"] == WEATHER.arguments
    assert call["status"] == "completed" and call["name"] == "get_weather"
    tool_message = replay.requests[-1].body["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}
    assert replay.requests[-1].body["messages"][-2]["tool_calls"][0]["id"] == call["call_id"]
    assert second["status"] == "completed" and second["output"][0]["content"][0]["transcript"] == ANSWER_TEXT


async def test_max_output_tokens_ends_the_answer_with_length(replay: ReplayServer) -> None:
    request = GenerationRequest(Conversation(items=(UserText("Hi"),)), max_output_tokens=4)
    async with started(replay.url) as engine:
        events = await run(engine, request)
    done = events[-1][1]
    assert replay.requests[-1].body["max_tokens"] == 4
    assert isinstance(done, GenerationDone) and done.text == "Once upon a time," and done.finish_reason == "length"


async def test_closing_the_turn_closes_the_servers_stream_at_once(replay: ReplayServer) -> None:
    async with started(replay.url) as engine:
        turn = engine.run_generation(spoken())
        async for event in turn:
            if isinstance(event, AudioChunk):
                break
        await turn.aclose()
        received = replay.requests[-1]
        assert await asyncio.to_thread(received.wait_ended, DEADLINE_S)
        assert engine.engines[0].running == 0
    assert received.done_at is None and received.closed_at is not None  # the server saw its client go
    assert received.chunks_sent < received.chunks_planned


def speculative(text: str = "Hello?", preemptible_id: str = "spec_1") -> GenerationRequest:
    return dataclasses.replace(spoken(text), preemptible_id=preemptible_id)


async def test_a_speculative_turn_closed_on_cancel_closes_its_servers_stream(replay: ReplayServer) -> None:
    async with started(replay.url) as engine:
        turn = engine.run_generation(speculative())
        async for event in turn:
            if isinstance(event, AudioChunk):
                break
        await turn.aclose()  # the speculation was discarded
        received = replay.requests[-1]
        assert await asyncio.to_thread(received.wait_ended, DEADLINE_S)
        assert engine.engines[0].running == 0 and engine.engines[0].spare == vllm_omni_engine.THROWAWAY_STREAMS
    assert received.done_at is None and received.closed_at is not None
    assert received.chunks_sent < received.chunks_planned


async def test_a_speculative_turn_is_refused_while_the_server_streams_its_batch(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_omni_engine, "SERVER_BATCH", 1)
    async with started(replay.url) as engine:
        committed = engine.run_generation(spoken())
        assert isinstance(await anext(committed), TextDelta)
        sent = len(replay.requests)
        with pytest.raises(EngineError) as refused:
            await anext(engine.run_generation(speculative()))
        await committed.aclose()
    assert refused.value.code == "no_spare_capacity"
    assert len(replay.requests) == sent  # refused here, never sent


async def test_throw_away_streams_to_one_server_are_bounded_whatever_its_batch(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_omni_engine, "THROWAWAY_STREAMS", 2)
    async with started(replay.url) as engine:
        open_turns = [engine.run_generation(speculative(preemptible_id=f"spec_{n}")) for n in range(2)]
        for turn in open_turns:
            assert isinstance(await anext(turn), TextDelta)
        sent = len(replay.requests)
        with pytest.raises(EngineError) as refused:
            await anext(engine.run_generation(speculative(preemptible_id="spec_3")))
        assert len(replay.requests) == sent  # refused here, never sent
        assert isinstance((await run(engine, spoken()))[-1][1], GenerationDone)  # an ordinary turn still goes
        for turn in open_turns:
            await turn.aclose()
        assert engine.engines[0].spare == 2
    assert refused.value.code == "no_spare_capacity"


async def test_a_committed_turn_past_the_batch_preempts_the_speculative_stream_and_closes_it(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_omni_engine, "SERVER_BATCH", 1)
    async with started(replay.url) as engine:
        turn = engine.run_generation(speculative())
        assert isinstance(await anext(turn), TextDelta)
        speculative_request = replay.requests[-1]

        async def drain() -> None:
            async for _ in turn:
                pass

        draining = asyncio.create_task(drain())  # waiting on the server's next chunk when preempted
        await asyncio.sleep(0)
        events = await run(engine, spoken("Now mine."))
        with pytest.raises(EngineError) as preempted:
            await draining
        assert await asyncio.to_thread(speculative_request.wait_ended, DEADLINE_S)
    assert preempted.value.code == "preempted"
    assert speculative_request.done_at is None and speculative_request.closed_at is not None
    assert isinstance(events[-1][1], GenerationDone) and events[-1][1].text == ANSWER_TEXT


async def test_a_promoted_speculative_turn_is_not_preempted(replay: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_omni_engine, "SERVER_BATCH", 1)
    async with started(replay.url) as engine:
        turn = engine.run_generation(speculative(preemptible_id="spec_7"))
        assert isinstance(await anext(turn), TextDelta)
        assert await engine.promote("spec_7")
        assert not await engine.promote("spec_7")
        committed = asyncio.create_task(run(engine, spoken()))
        async with asyncio.timeout(DEADLINE_S):
            rest = [event async for event in turn]  # it runs to its end beside the committed turn
        committed_events = await committed
    assert isinstance(rest[-1], GenerationDone) and isinstance(committed_events[-1][1], GenerationDone)


async def test_a_stall_is_failed_by_the_stall_timeout_which_closes_the_stream(replay: ReplayServer) -> None:
    replay.fail_next("stall")
    async with started(replay.url) as engine:
        with pytest.raises(EngineError) as failed:
            await run(StallTimeoutEngine(engine, stall_timeout_s=0.5), spoken())
        received = replay.requests[-1]
        assert await asyncio.to_thread(received.wait_ended, DEADLINE_S)
    assert failed.value.code == "engine_timeout"
    assert received.closed_at is not None


# A stall: test_a_stall_is_failed_by_the_stall_timeout_which_closes_the_stream.
@pytest.mark.parametrize(("failure", "code"), [(failure, code) for failure, code in FAILURE_CODES.items()
                                               if failure != "stall"])
async def test_a_failing_server_fails_the_turn_and_serves_the_next(
    replay: ReplayServer, failure: Failure, code: str
) -> None:
    replay.fail_next(failure)
    async with started(replay.url) as engine:
        with pytest.raises(EngineError) as failed:
            await run(engine, spoken())
        assert failed.value.code == code
        assert "HTTP 500" in str(failed.value) if failure == "http_500" else "Internal" not in str(failed.value)
        again = await run(engine, written())
        assert engine.describe()[0]["failures"] == 1
    assert isinstance(again[-1][1], GenerationDone)


async def test_a_prompt_past_the_limit_fails_before_it_is_sent_and_the_next_runs(replay: ReplayServer) -> None:
    # 33,000 short words are ~33,000 tokens (165 KB: a byte bound alone would refuse
    # far less); the limit is counted, and the server never sees the turn.
    asked = len(replay.requests)
    long = GenerationRequest(Conversation((UserText("Hi"),), instructions="word " * 33_000), output_audio=False)
    fits = GenerationRequest(Conversation((UserText("Hi"),), instructions="word " * 30_000), output_audio=False)
    async with started(replay.url) as engine:
        with pytest.raises(EngineError) as refused:
            await run(engine, long)
        assert len(replay.requests) == asked
        again = await run(engine, fits)
    assert refused.value.code == "prompt_too_long"
    assert isinstance(again[-1][1], GenerationDone) and len(replay.requests) == asked + 1
    assert engine.describe()[0]["last_error"] is None  # the turn's fault, not the server's


async def test_a_line_that_never_ends_is_refused_at_its_bound(replay: ReplayServer) -> None:
    replay.fail_next("endless_line")
    async with started(replay.url) as engine:
        with pytest.raises(EngineError):
            await run(engine, spoken())
    received = replay.requests[-1]
    assert received.wait_ended() and received.closed_at is not None  # the client hung up on it
    # Past the bound nothing more is read: what was sent is the bound plus the sockets' buffers
    # (a few MB on loopback), not all that the server could send until the turn's deadline.
    assert received.endless_bytes_sent < 8 * MAX_EVENT_LINE_BYTES


async def test_a_models_answer_past_its_bound_reads_unreachable(replay: ReplayServer) -> None:
    replay.models_padding = 2 * 1024 * 1024
    try:
        async with started(replay.url) as engine:
            assert not engine.describe()[0]["alive"]
            assert engine.describe()[0]["last_error"] == "engine_unavailable"
    finally:
        replay.models_padding = 0


async def test_an_unreachable_server_fails_the_turn_and_reads_not_alive() -> None:
    async with started(f"http://127.0.0.1:{closed_port()}/v1") as engine:
        assert not engine.alive
        with pytest.raises(EngineError) as failed:
            await run(engine, spoken())
        (state,) = engine.describe()
    assert failed.value.code == "engine_unavailable"
    assert state["alive"] is False and state["last_error"] == "engine_unavailable"


async def test_turns_go_to_the_least_loaded_reachable_server() -> None:
    with ReplayServer(pace=FAST) as first, ReplayServer(pace=FAST) as second:
        async with started(f"http://127.0.0.1:{closed_port()}/v1", first.url, second.url) as pool:
            turns = [pool.run_generation(spoken()) for _ in range(3)]
            firsts = await asyncio.gather(*(anext(turn) for turn in turns))
            for turn in turns:
                await turn.aclose()
    assert all(isinstance(event, TextDelta) for event in firsts)
    assert (len(first.requests), len(second.requests)) == (2, 1)  # ties to the first listed; the dead one never


async def test_the_api_key_goes_with_every_request() -> None:
    with ReplayServer(pace=FAST, api_key="secret") as guarded:
        async with started(guarded.url, api_key="secret") as engine:
            await run(engine, written())
        async with started(guarded.url) as keyless:
            assert not keyless.alive  # its probe got 401
            with pytest.raises(EngineError) as refused:
                await run(keyless, written())
    assert guarded.requests[0].authorization == "Bearer secret"
    assert refused.value.code == "engine_http_error"


def test_urls_lose_their_credentials_in_reports() -> None:
    assert redacted("http://user:pw@gpu-1:8091/v1") == "http://gpu-1:8091/v1"
