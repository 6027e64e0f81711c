"""A held turn without a session: a preemptible engine turn read into a buffer, then released,
promoted or closed. The engine is a script: events to yield, ``asyncio.Event``s to wait at, an
exception to end with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import numpy as np
import pytest

from app.realtime.held_generation import HeldGeneration
from pipeline.contract import (
    AudioChunk,
    EngineError,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    Usage,
)
from pipeline.conversation import Conversation, UserText
from tests.fakes import FULL_CAPABILITIES
from tests.settle import settle

Step = GenerationEvent | asyncio.Event | Exception

DONE = GenerationDone(text="Hi there.", usage=Usage(input_text_tokens=3, input_audio_tokens=0, output_text_tokens=2),
                finish_reason="stop")
AUDIO = AudioChunk(np.zeros(1_920, dtype=np.float32), frames=1)


class ScriptEngine:
    """Each turn runs ``script``; ``promote`` answers ``promotes_to``."""

    name = "script"
    capabilities = FULL_CAPABILITIES

    def __init__(self, script: Sequence[Step], *, promotes_to: bool = True) -> None:
        self.script = script
        self.promotes_to = promotes_to
        self.promoted: list[str] = []
        self.cancelled = 0  # streams stopped before their script's end

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._stream()

    async def _stream(self) -> AsyncGenerator[GenerationEvent, None]:
        try:
            for step in self.script:
                if isinstance(step, asyncio.Event):
                    await step.wait()
                elif isinstance(step, Exception):
                    raise step
                else:
                    yield step
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise

    async def promote(self, preemptible_id: str) -> bool:
        self.promoted.append(preemptible_id)
        return self.promotes_to


def request(preemptible_id: str | None = "spec_1") -> GenerationRequest:
    return GenerationRequest(conversation=Conversation(items=(UserText("Hello"),)), preemptible_id=preemptible_id)


async def collect(events: AsyncGenerator[GenerationEvent, None]) -> list[GenerationEvent]:
    return [event async for event in events]


def test_a_request_without_a_preemptible_id_is_refused():
    with pytest.raises(ValueError, match="preemptible_id"):
        HeldGeneration(ScriptEngine([DONE]), request(preemptible_id=None), name="held")


async def test_the_events_held_so_far_come_first_then_the_later_ones():
    go_on = asyncio.Event()
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), go_on, TextDelta(" there."), DONE]), request(), name="held")
    await settle()
    events = held.events()
    assert await anext(events) == TextDelta("Hi")
    go_on.set()
    assert await collect(events) == [TextDelta(" there."), DONE]


async def test_the_events_of_a_turn_that_already_ended_come_all_at_once():
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), AUDIO, DONE]), request(), name="held")
    await settle()
    assert held.ended
    assert await collect(held.events()) == [TextDelta("Hi"), AUDIO, DONE]


async def test_the_events_raise_what_the_turn_raised_after_those_before_it():
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), EngineError("boom", code="engine_error")]), request(), name="held")
    seen: list[GenerationEvent] = []
    with pytest.raises(EngineError, match="boom"):
        async for event in held.events():
            seen.append(event)
    assert seen == [TextDelta("Hi")]


async def test_closing_the_events_closes_the_turn():
    go_on = asyncio.Event()
    engine = ScriptEngine([TextDelta("Hi"), go_on, DONE])
    held = HeldGeneration(engine, request(), name="held")
    events = held.events()
    await anext(events)
    await events.aclose()
    assert held.stopped and engine.cancelled == 1


async def test_output_is_told_once_at_the_first_audio():
    first_audio, more = asyncio.Event(), asyncio.Event()
    told: list[None] = []
    engine = ScriptEngine([TextDelta("Hi"), first_audio, AUDIO, more, AUDIO, DONE])
    held = HeldGeneration(engine, request(), name="held", on_output=lambda: told.append(None))
    await settle()
    assert told == []
    first_audio.set()
    await settle()
    assert len(told) == 1
    more.set()
    await settle()
    assert held.ended and len(told) == 1


async def test_output_of_a_text_only_turn_is_told_at_its_end():
    go_on = asyncio.Event()
    told: list[None] = []
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), go_on, DONE]), request(), name="held",
                    on_output=lambda: told.append(None))
    await settle()
    assert told == []
    go_on.set()
    await settle()
    assert held.ended and len(told) == 1


async def test_output_is_never_told_for_a_turn_that_failed_before_any_audio():
    told: list[None] = []
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), EngineError("boom")]), request(), name="held",
                    on_output=lambda: told.append(None))
    await settle()
    assert held.ended and told == []


async def test_the_end_is_told_with_the_turn_when_its_stream_ends_by_itself():
    ends: list[HeldGeneration] = []
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), DONE]), request(), name="held", on_end=ends.append)
    await settle()
    assert ends == [held]


async def test_the_end_is_told_when_the_turn_fails():
    ends: list[HeldGeneration] = []
    held = HeldGeneration(ScriptEngine([EngineError("boom")]), request(), name="held", on_end=ends.append)
    await settle()
    assert ends == [held]


async def test_the_end_is_not_told_for_a_closed_turn():
    ends: list[HeldGeneration] = []
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), asyncio.Event(), DONE]), request(), name="held",
                    on_end=ends.append)
    await settle()
    await held.close()
    await settle()
    assert ends == []


async def test_closing_cancels_the_engines_stream():
    engine = ScriptEngine([TextDelta("Hi"), asyncio.Event(), DONE])
    held = HeldGeneration(engine, request(), name="held")
    await settle()
    await held.close()
    assert engine.cancelled == 1
    assert held.stopped and held.ended


async def test_closing_twice_is_safe():
    engine = ScriptEngine([asyncio.Event(), DONE])
    held = HeldGeneration(engine, request(), name="held")
    await settle()
    await held.close()
    await held.close()
    assert engine.cancelled == 1 and held.stopped


async def test_closing_a_turn_that_ended_by_itself_keeps_its_end():
    engine = ScriptEngine([TextDelta("Hi"), DONE])
    held = HeldGeneration(engine, request(), name="held")
    await settle()
    await held.close()
    assert engine.cancelled == 0
    assert held.done == DONE


async def test_promoting_tells_the_engine_the_preemptible_id():
    engine = ScriptEngine([TextDelta("Hi"), asyncio.Event(), DONE])
    held = HeldGeneration(engine, request("spec_7"), name="held")
    assert await held.promote() is True
    assert engine.promoted == ["spec_7"]
    await held.close()


@pytest.mark.parametrize("code", ["preempted", "no_spare_capacity"])
async def test_a_turn_the_engine_took_back_or_never_ran_cannot_be_promoted(code: str):
    engine = ScriptEngine([EngineError("gone", code=code)], promotes_to=False)
    held = HeldGeneration(engine, request(), name="held")
    assert await held.promote() is False
    assert held.engine_code == code


async def test_a_refused_promotion_waits_for_the_turns_end():
    preempted = asyncio.Event()
    engine = ScriptEngine([TextDelta("Hi"), preempted, EngineError("preempted", code="preempted")], promotes_to=False)
    held = HeldGeneration(engine, request(), name="held")
    promoting = asyncio.create_task(held.promote())
    await settle()
    assert not promoting.done()
    preempted.set()
    assert await promoting is False


async def test_a_turn_that_failed_otherwise_is_still_promoted():
    engine = ScriptEngine([TextDelta("Hi"), EngineError("broke", code="engine_error")], promotes_to=False)
    held = HeldGeneration(engine, request(), name="held")
    assert await held.promote() is True
    assert held.engine_code == "engine_error"


async def test_a_turn_that_ended_cleanly_is_still_promoted_and_the_engine_told():
    engine = ScriptEngine([DONE], promotes_to=False)
    held = HeldGeneration(engine, request(), name="held")
    await settle()
    assert await held.promote() is True
    assert engine.promoted == ["spec_1"]


async def test_done_is_the_turn_done_after_a_clean_end():
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), DONE]), request(), name="held")
    await settle()
    assert held.done is DONE


async def test_done_is_none_while_the_turn_runs():
    go_on = asyncio.Event()
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), go_on, DONE]), request(), name="held")
    await settle()
    assert held.done is None
    go_on.set()
    await settle()
    assert held.done is DONE


async def test_done_is_none_after_a_failure():
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), EngineError("boom")]), request(), name="held")
    await settle()
    assert held.ended and held.done is None


async def test_done_is_none_after_a_close():
    held = HeldGeneration(ScriptEngine([TextDelta("Hi"), asyncio.Event(), DONE]), request(), name="held")
    await settle()
    await held.close()
    assert held.done is None


async def test_engine_code_is_none_for_a_clean_end():
    held = HeldGeneration(ScriptEngine([DONE]), request(), name="held")
    await settle()
    assert held.engine_code is None


async def test_engine_code_is_none_for_a_failure_that_is_not_an_engine_error():
    held = HeldGeneration(ScriptEngine([RuntimeError("bug")]), request(), name="held")
    await settle()
    assert isinstance(held.error, RuntimeError)
    assert held.engine_code is None


async def test_engine_code_is_the_engine_errors_code():
    held = HeldGeneration(ScriptEngine([EngineError("no slot", code="no_spare_capacity")]), request(), name="held")
    await settle()
    assert held.engine_code == "no_spare_capacity"
