"""A long prompt prefilled a chunk at a time (the Thinker's, the Talker's) computes what its whole
prefill computes, and the turns already decoding go on between its chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.contract import AudioChunk, GenerationDone, TextDelta
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.params import GenerationParams
from tests.pipeline.local.test_generation import (  # noqa: F401 (fixtures)
    BATCH_WAVEFORM_ATOL,
    assert_same_turn,
    greedy,
    image_inputs,
    inputs,
    model,
    pcm_of,
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


def text_of(events: list) -> list:
    return [event for event in events if isinstance(event, TextDelta)]


def assert_same_speech(chunked: list, alone: list) -> None:
    """The same text, the same audio and the same end; a turn whose Talker joins later has more
    of its text out before its first audio, so the events interleave differently."""
    assert text_of(chunked) == text_of(alone)
    assert chunked[-1] == alone[-1]  # text, usage (codec frames included), finish reason
    assert sum(event.frames for event in chunked if isinstance(event, AudioChunk)) == sum(
        event.frames for event in alone if isinstance(event, AudioChunk)
    )
    np.testing.assert_allclose(pcm_of(chunked), pcm_of(alone), rtol=0, atol=BATCH_WAVEFORM_ATOL)


@pytest.mark.parametrize("turn", ["inputs", "image_inputs"])
def test_a_talker_prompt_prefilled_in_chunks_computes_what_its_whole_prefill_computes(model, tokenizer, turn, request):  # noqa: F811 (test_generation's fixtures)
    turn_inputs = request.getfixturevalue(turn)
    params = GenerationParams(**greedy(force_output_tokens=12, max_output_tokens=12, max_audio_frames=24, **FIXED))
    whole = DecodeBatch(model, tokenizer)
    whole.prefill_thinkers([("turn", turn_inputs, params)])
    assert whole.begin_talker_prefills(["turn"]) == []  # the Talker's prompt fits a chunk: it joins now
    chunk = 8  # several chunks, with audio and image positions cut between them
    batch = DecodeBatch(model, tokenizer, prefill_chunk=chunk)
    events: dict = {"turn": [event for _, event in batch.prefill_thinkers([("turn", turn_inputs, params)])]}
    (prefill,) = batch.begin_talker_prefills(["turn"])
    assert batch.talker_rows == []
    chunks = 1
    while not prefill.advance():
        chunks += 1
    assert chunks == -(-prefill.chunks.length // chunk) > 2
    prompt = prefill.chunks
    with torch.inference_mode():
        expected = model.talker(inputs_embeds=prompt.embeds, position_ids=prompt.positions, use_cache=True,
                                attention_mask=torch.ones(prompt.embeds.shape[:2], dtype=torch.long),
                                output_hidden_states=True)
    got = prompt.output()
    for got_layer, expected_layer in zip(got.cache.layers, expected.cache.layers, strict=True):
        torch.testing.assert_close(got_layer.keys, expected_layer.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(got_layer.values, expected_layer.values, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.last_hidden, expected.hidden_states[0][-1][:, -1:], rtol=0, atol=1e-5)
    batch.join_talker_prefilled(prefill)
    assert [turn.key for turn in batch.talker_rows] == ["turn"]
    first_code = batch.talker_rows[0].speaking().talker.generated
    assert torch.equal(first_code, whole.talker_rows[0].speaking().talker.generated)
    decode(batch, events)
    assert_same_speech(events["turn"], run(model, tokenizer, turn_inputs, **greedy(
        force_output_tokens=12, max_output_tokens=12, max_audio_frames=24, **FIXED)))


def test_decoding_turns_and_the_turns_own_text_go_on_between_its_talker_chunks(model, tokenizer, inputs, typed_inputs):  # noqa: F811 (test_generation's fixtures)
    typed = greedy(force_output_tokens=24, max_output_tokens=24, max_audio_frames=40, **FIXED)
    # Its text ends while its Talker prefills: the Talker still reads all of it, then <tts_eos>.
    spoken = greedy(force_output_tokens=3, max_output_tokens=3, max_audio_frames=16, **FIXED)
    batch = DecodeBatch(model, tokenizer, prefill_chunk=8)
    events: dict = {"decoding": [], "long": []}
    for key, event in batch.prefill_thinkers([("decoding", typed_inputs, GenerationParams(**typed))]):
        events[key].append(event)
    batch.prefill_talkers(["decoding"])
    for key, event in batch.prefill_thinkers([("long", inputs, GenerationParams(**spoken))]):
        events[key].append(event)
    (prefill,) = batch.begin_talker_prefills(["long"])
    between_chunks: dict = {"decoding": 0, "long": 0}
    while not prefill.advance():
        before = {key: len(events[key]) for key in events}
        step_batch(batch, events)
        for key in events:
            between_chunks[key] += len(text_of(events[key][before[key]:]))
    assert between_chunks["decoding"] > 0  # the decoding turn did not wait for the whole Talker prefill
    assert between_chunks["long"] > 0  # nor did the turn's own text, which ended meanwhile
    assert [turn.key for turn in batch.thinker_rows] == [turn.key for turn in batch.talker_rows] == ["decoding"]
    assert "long" in batch.keys
    batch.join_talker_prefilled(prefill)
    decode(batch, events)
    assert_same_turn(events["decoding"], run(model, tokenizer, typed_inputs, **typed), atol=BATCH_WAVEFORM_ATOL)
    assert_same_speech(events["long"], run(model, tokenizer, inputs, **spoken))


def test_a_turn_cancelled_during_its_talker_prefill_leaves_the_batch(model, tokenizer, inputs):  # noqa: F811 (test_generation's fixtures)
    batch = DecodeBatch(model, tokenizer, prefill_chunk=8)
    batch.prefill_thinkers([("long", inputs, GenerationParams(**greedy(max_output_tokens=8)))])
    (prefill,) = batch.begin_talker_prefills(["long"])
    prefill.advance()
    done = batch.cancel("long")
    assert done.finish_reason == "cancelled" and done.usage.output_audio_tokens == 0
    assert batch.keys == [] and batch.cache_bytes() == 0
    with pytest.raises(ValueError, match="no longer in the batch"):
        batch.join_talker_prefilled(prefill)
