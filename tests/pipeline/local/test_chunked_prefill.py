"""A long prompt prefilled a chunk at a time computes what its whole prefill computes, and the
turns already decoding go on between its chunks."""

from __future__ import annotations

import pytest

from pipeline.contract import GenerationDone, TextDelta
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.params import GenerationParams
from tests.pipeline.local.test_generation import (  # noqa: F401 (fixtures)
    BATCH_WAVEFORM_ATOL,
    assert_same_turn,
    greedy,
    image_inputs,
    inputs,
    model,
    run,
    seen_and_heard_inputs,
    step_batch,
    typed_inputs,
)

pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]

FIXED = {"adaptive_chunks": False}


def decode(batch: DecodeBatch, events: dict) -> None:
    while batch.keys:
        step_batch(batch, events)


def chunked_alone(model, tokenizer, turn_inputs, params: dict, chunk: int) -> tuple[list, int]:  # noqa: F811 (test_generation's fixtures)
    batch = DecodeBatch(model, tokenizer, prefill_chunk=chunk)
    assert batch.chunked(turn_inputs)
    prefill = batch.begin_prefill("turn", turn_inputs, GenerationParams(**params))
    chunks = 1
    while not prefill.advance():
        chunks += 1
    events: dict = {"turn": list(dict(batch.join_prefilled(prefill)).values())}
    if batch.wants_talker("turn"):
        batch.prefill_talkers(["turn"])
    decode(batch, events)
    return events["turn"], chunks


@pytest.mark.parametrize("turn", ["inputs", "typed_inputs", "image_inputs", "seen_and_heard_inputs"])
def test_a_prompt_prefilled_in_chunks_computes_what_its_whole_prefill_computes(model, tokenizer, turn, request):  # noqa: F811 (test_generation's fixtures)
    turn_inputs = request.getfixturevalue(turn)
    params = greedy(force_output_tokens=12, max_output_tokens=12, max_audio_frames=24, **FIXED)
    chunk = 16  # several chunks, with audio and image positions cut between them
    chunked, chunks = chunked_alone(model, tokenizer, turn_inputs, params, chunk)
    assert chunks == -(-turn_inputs.input_ids.shape[1] // chunk) > 2
    assert_same_turn(chunked, run(model, tokenizer, turn_inputs, **params), atol=BATCH_WAVEFORM_ATOL)


def test_a_short_prompt_is_not_chunked(model, tokenizer, typed_inputs):  # noqa: F811 (test_generation's fixtures)
    batch = DecodeBatch(model, tokenizer, prefill_chunk=typed_inputs.input_ids.shape[1])
    assert not batch.chunked(typed_inputs)


def test_decoding_turns_step_between_the_chunks_and_both_equal_their_turns_alone(model, tokenizer, inputs, typed_inputs):  # noqa: F811 (test_generation's fixtures)
    spoken = greedy(force_output_tokens=16, max_output_tokens=16, max_audio_frames=30, **FIXED)
    typed = greedy(force_output_tokens=10, max_output_tokens=10, max_audio_frames=20, **FIXED)
    batch = DecodeBatch(model, tokenizer, prefill_chunk=8)
    events: dict = {"decoding": [], "long": []}
    for key, event in batch.prefill_thinkers([("decoding", typed_inputs, GenerationParams(**typed))]):
        events[key].append(event)
    batch.prefill_talkers(["decoding"])
    prefill = batch.begin_prefill("long", inputs, GenerationParams(**spoken))
    text_between_chunks = 0
    while not prefill.advance():
        before = len(events["decoding"])
        if batch.keys:
            step_batch(batch, events)
        text_between_chunks += sum(isinstance(event, TextDelta) for event in events["decoding"][before:])
    assert text_between_chunks > 0  # the decoding turn did not wait for the whole prefill
    for key, event in batch.join_prefilled(prefill):
        events[key].append(event)
    if batch.wants_talker("long"):
        batch.prefill_talkers(["long"])
    decode(batch, events)
    assert isinstance(events["long"][-1], GenerationDone)
    assert_same_turn(events["decoding"], run(model, tokenizer, typed_inputs, **typed), atol=BATCH_WAVEFORM_ATOL)
    assert_same_turn(events["long"], run(model, tokenizer, inputs, **spoken), atol=BATCH_WAVEFORM_ATOL)
