"""Partial transcripts against the real engine's scheduling: the dev model's TransformersEngine
with one batch slot, real silero VAD, espeak-ng speech, a virtual speaker.

A partial is a preemptible turn: it starts only on a free slot, and a committed turn that needs
its slot takes it at once. Both are checked where the engine process decides them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from app.realtime.session_config import InputTranscription, SessionConfig
from pipeline.contract import GenerationDone, GenerationEvent, GenerationRequest
from pipeline.conversation import Conversation, UserText
from pipeline.local.transformers_engine import TransformersEngine
from tests.conftest import started_dev_engine
from tests.fakes import SessionHarness
from tests.speech import load_fixture, silence

# The engine lives on the session loop (the fixtures' default), so every test here runs on it too.
pytestmark = [pytest.mark.dev_model, pytest.mark.asyncio(loop_scope="session")]

DELTA = "conversation.item.input_audio_transcription.delta"
STEP_MS = 100
TURN_GUARD_S = 300  # against hangs only: a CPU turn takes ~1-2 s, more when the machine is busy
# Random weights stop at random: every turn goes on to its max_output_tokens, so a partial decodes
# its 16 + 10 tokens per second of audio (long enough to be caught running) and a committed turn
# holds its slot as long as its bound says.
GENERATION = {"force_output_tokens": 4096, "max_audio_frames": 4}
HOLDS_THE_SLOT = 2_000  # tokens: seconds of decoding, far longer than saying the fixture takes


@pytest.fixture(scope="module")
async def engine(dev_model_dir):
    async with started_dev_engine(dev_model_dir, generation=GENERATION, max_batch=1) as engine:
        yield engine


def committed_request(tokens: int) -> GenerationRequest:
    """Another visitor's committed answer, text only, ``tokens`` long."""
    return GenerationRequest(conversation=Conversation(items=(UserText("Tell me a story."),)), output_audio=False,
                       max_output_tokens=tokens)


async def collect(events: AsyncGenerator[GenerationEvent, None]) -> list[GenerationEvent]:
    async with contextlib.aclosing(events) as turn:
        return [event async for event in turn]


async def speak(h: SessionHarness, name: str) -> None:
    """The fixture in 100 ms steps, each partial in flight running to its end (or refusal) between them."""
    pcm = load_fixture(name)
    for start in range(0, pcm.size, STEP_MS * 16):
        h.push(pcm[start : start + STEP_MS * 16])
        async with asyncio.timeout(TURN_GUARD_S):
            while h.session.stats()["partial_transcripts"]:
                await asyncio.sleep(0.01)


def harness(engine, vad) -> SessionHarness:
    h = SessionHarness(engine, vad, SessionConfig(transcription=InputTranscription(model="any")))
    h.push(silence(300))
    return h


async def slots_freed(engine: TransformersEngine) -> None:
    """Until the engine process has confirmed that every closed turn stopped."""
    async with asyncio.timeout(TURN_GUARD_S):
        while engine.running:
            await asyncio.sleep(0.01)


async def test_no_partial_starts_while_a_committed_turn_holds_the_only_slot(engine, vad):
    await slots_freed(engine)
    committed = engine.run_generation(committed_request(HOLDS_THE_SLOT))
    await anext(committed)  # decoding: it holds the slot
    h = harness(engine, vad)
    await h.session.start()
    await speak(h, "long_story")
    outcomes = [outcome for outcome, _ in h.partials]
    assert outcomes and set(outcomes) == {"started", "refused"} and outcomes.count("refused") == outcomes.count("started")
    assert engine.queue_depth == 0  # never queued behind it
    assert [event for event in h.of_type(DELTA) if event["partial"]] == []
    assert engine.running == 1  # the committed turn was decoding all along
    await committed.aclose()
    await h.session.close()


class CommitsDuringThePartial:
    """The engine, with another visitor's committed turn submitted once the first partial is decoding."""

    def __init__(self, engine: TransformersEngine) -> None:
        self._engine = engine
        self.name = engine.name
        self.capabilities = engine.capabilities
        self.committed: asyncio.Task[list[GenerationEvent]] | None = None
        self.queued_behind: int | None = None  # the engine's queue just after that submission

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        if self.committed is None and (request.preemptible_id or "").startswith("partial"):
            return self._partial(request)
        return self._engine.run_generation(request)

    async def promote(self, preemptible_id: str) -> bool:
        return await self._engine.promote(preemptible_id)

    async def _partial(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        async with contextlib.aclosing(self._engine.run_generation(request)) as events:
            async for event in events:
                if self.committed is None:  # the partial is decoding in the only slot
                    self.committed = asyncio.create_task(collect(self._engine.run_generation(committed_request(8))))
                    await asyncio.sleep(0)
                    self.queued_behind = self._engine.queue_depth
                yield event


async def test_a_committed_turn_takes_a_running_partials_slot_and_nothing_of_it_is_shown(engine, vad):
    await slots_freed(engine)
    wrapped = CommitsDuringThePartial(engine)
    h = harness(wrapped, vad)
    await h.session.start()
    await speak(h, "hello")
    assert wrapped.committed is not None
    assert wrapped.queued_behind == 0  # submitted at once, into the partial's slot
    rest = await asyncio.wait_for(wrapped.committed, TURN_GUARD_S)
    assert isinstance(rest[-1], GenerationDone) and rest[-1].finish_reason != "cancelled"
    assert [outcome for outcome, _ in h.partials][:2] == ["started", "preempted"]
    assert [event for event in h.of_type(DELTA) if event["partial"]] == []
    await h.session.close()
