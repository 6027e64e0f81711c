"""The engine process's batch server, in this process on the dev model: a long prompt's chunked
work (the Talker's prefill, an end-of-turn score) takes turns with the decoding steps of the
generations already answering, and a cancel between its chunks ends it."""

from __future__ import annotations

import queue

import pytest
import torch

from pipeline.contract import AudioChunk, GenerationDone, GenerationRequest, TextDelta
from pipeline.conversation import Conversation, UserText
from pipeline.local.checkpoint import LoadedCheckpoint
from pipeline.local.chunked_prefill import PREFILL_CHUNK_POSITIONS
from pipeline.local.end_of_turn import message_end_probability
from pipeline.local.engine_messages import GenerationEventMessage, Submit
from pipeline.local.engine_process import _BatchServer
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import PromptRenderer
from pipeline.token_count import DEFAULT_MAX_PROMPT_TOKENS
from tests.pipeline.local.test_generation import greedy, model  # noqa: F401 (fixture)

pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]

SHORT, LONG = 1, 2
# ~1,400 user positions: three 512-position chunks for the Thinker's prefill and for the Talker's.
LONG_TEXT = "lorem ipsum " * 700


@pytest.fixture(scope="module")
def loaded(model, tokenizer, dev_model_dir):  # noqa: F811 (fixture)
    return LoadedCheckpoint(
        model=model,
        tokenizer=tokenizer,
        renderer=PromptRenderer.from_pretrained(dev_model_dir, tokenizer=tokenizer),
        base_params=GenerationParams(**greedy(force_output_tokens=64, max_audio_frames=30, adaptive_chunks=False)),
        device="cpu",
        dtype=torch.float32,
        max_batch=4,
        threads=1,
        max_prompt_tokens=DEFAULT_MAX_PROMPT_TOKENS,
    )


def answer(text: str, tokens: int) -> GenerationRequest:
    return GenerationRequest(conversation=Conversation(items=(UserText(text),)), temperature=0.0, max_output_tokens=tokens)


class Commands:
    """Generations submitted together; one is cancelled when ``cancel_when`` says so."""

    def __init__(self, submits: list[Submit]) -> None:
        self.submitted: queue.SimpleQueue[list[Submit] | None] = queue.SimpleQueue()
        self.submitted.put(submits)
        self.cancelled: set[int] = set()

    def is_cancelled(self, generation_id: int) -> bool:
        return generation_id in self.cancelled

    def forget(self, generation_id: int) -> None:
        pass


class Timeline:
    """What happened in order: each prefill forward of the Thinker's or the Talker's text model
    (a chunk, or a whole short prompt; decoding steps call the layers directly) and each event sent."""

    def __init__(self, model) -> None:  # noqa: F811 (fixture)
        self.entries: list[tuple[str, object]] = []
        self.on_forward = lambda stage, positions: None
        self._handles = [
            model.thinker.model.language_model.register_forward_pre_hook(self._forward("thinker"), with_kwargs=True),
            model.talker.model.register_forward_pre_hook(self._forward("talker"), with_kwargs=True),
        ]

    def _forward(self, stage: str):
        def record(_module, _args, kwargs) -> None:
            positions = kwargs["inputs_embeds"].shape[1]
            self.entries.append((stage, positions))
            self.on_forward(stage, positions)

        return record

    def send(self, message: object) -> None:
        assert isinstance(message, GenerationEventMessage), message
        self.entries.append((message.generation_id, message.event))

    def forwards(self, stage: str) -> list[int]:
        """Indices of ``stage``'s prefill forwards."""
        return [index for index, (kind, _) in enumerate(self.entries) if kind == stage]

    def events(self, generation_id: int, start: int = 0, end: int | None = None) -> list:
        return [event for kind, event in self.entries[start:end] if kind == generation_id]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@pytest.fixture
def timeline(model):  # noqa: F811 (fixture)
    recorded = Timeline(model)
    yield recorded
    recorded.close()


def serve(loaded: LoadedCheckpoint, commands: Commands, timeline: Timeline) -> None:
    _BatchServer(loaded, commands, timeline.send, loaded.max_batch).run(until_idle=True)


def texts(events: list) -> int:
    return sum(isinstance(event, TextDelta) for event in events)


def test_a_long_talker_prompt_is_prefilled_a_chunk_between_the_decoding_turns_steps(loaded, timeline):
    serve(loaded, Commands([Submit(SHORT, answer("hi", 40)), Submit(LONG, answer(LONG_TEXT, 8))]), timeline)
    short_prefill, *long_chunks = timeline.forwards("talker")
    assert [timeline.entries[index][1] for index in long_chunks][:-1] == [PREFILL_CHUNK_POSITIONS] * 2
    first, last = long_chunks[0], long_chunks[-1]
    assert texts(timeline.events(SHORT, first, last)) > 0  # the short turn decoded between the chunks
    assert texts(timeline.events(LONG, first, last)) > 0  # so did the long turn's own text
    assert not any(isinstance(event, AudioChunk) for event in timeline.events(LONG, 0, last))
    for generation_id in (SHORT, LONG):
        events = timeline.events(generation_id)
        assert isinstance(events[-1], GenerationDone) and events[-1].finish_reason == "length"
        assert any(isinstance(event, AudioChunk) for event in events)
        assert events[-1].usage.output_audio_tokens > 0


def test_a_cancel_between_talker_chunks_ends_the_generation(loaded, timeline):
    commands = Commands([Submit(SHORT, answer("hi", 40)), Submit(LONG, answer(LONG_TEXT, 8))])

    def cancel_after_the_first_talker_chunk(stage: str, positions: int) -> None:
        if stage == "talker" and positions == PREFILL_CHUNK_POSITIONS:
            commands.cancelled.add(LONG)

    timeline.on_forward = cancel_after_the_first_talker_chunk
    serve(loaded, commands, timeline)
    assert [timeline.entries[index][1] for index in timeline.forwards("talker")].count(PREFILL_CHUNK_POSITIONS) == 1
    long_events = timeline.events(LONG)
    assert isinstance(long_events[-1], GenerationDone) and long_events[-1].finish_reason == "cancelled"
    assert texts(long_events) > 0 and not any(isinstance(event, AudioChunk) for event in long_events)
    assert timeline.events(SHORT)[-1].finish_reason == "length"


def test_a_long_end_of_turn_score_is_computed_a_chunk_between_the_decoding_turns_steps(loaded, timeline):
    request = GenerationRequest.end_of_turn(LONG_TEXT)
    serve(loaded, Commands([Submit(SHORT, answer("hi", 40)), Submit(LONG, request)]), timeline)
    short_prefill, *score_chunks = timeline.forwards("thinker")
    inputs = loaded.renderer.render_request(request)
    assert len(score_chunks) == -(-inputs.input_ids.shape[1] // PREFILL_CHUNK_POSITIONS) >= 3
    assert texts(timeline.events(SHORT, score_chunks[0], score_chunks[-1])) > 0
    (done,) = timeline.events(LONG)
    whole = message_end_probability(loaded.model, inputs, loaded.renderer.message_end_id)
    assert done.finish_reason == "stop" and done.end_of_turn_probability == pytest.approx(whole, rel=1e-4)
    assert done.usage.input_text_tokens == inputs.text_tokens
    assert timeline.events(SHORT)[-1].finish_reason == "length"


def test_a_cancel_between_score_chunks_ends_the_score(loaded, timeline):
    commands = Commands([Submit(SHORT, answer("hi", 40)), Submit(LONG, GenerationRequest.end_of_turn(LONG_TEXT))])

    def cancel_after_the_first_score_chunk(stage: str, positions: int) -> None:
        if stage == "thinker" and positions == PREFILL_CHUNK_POSITIONS:
            commands.cancelled.add(LONG)

    timeline.on_forward = cancel_after_the_first_score_chunk
    serve(loaded, commands, timeline)
    assert len(timeline.forwards("thinker")) == 2  # the short turn's prefill, one chunk of the score
    (done,) = timeline.events(LONG)
    assert done.finish_reason == "cancelled" and done.end_of_turn_probability is None
    assert timeline.events(SHORT)[-1].finish_reason == "length"
