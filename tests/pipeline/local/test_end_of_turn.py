"""The end-of-message probability scored a chunk at a time equals the one-forward score."""

from __future__ import annotations

import pytest

from pipeline.contract import GenerationRequest
from pipeline.local.end_of_turn import ChunkedMessageEndProbability, message_end_probability
from pipeline.local.prompt import PromptRenderer
from tests.pipeline.local.test_generation import model  # noqa: F401 (fixture)

pytestmark = [pytest.mark.dev_model, pytest.mark.usefixtures("one_thread")]


@pytest.mark.parametrize("text", ["Please put the", "lorem ipsum " * 40])
def test_a_prompt_scored_in_chunks_gets_the_whole_forwards_probability(model, dev_model_dir, text):  # noqa: F811 (fixture)
    renderer = PromptRenderer.from_pretrained(dev_model_dir)
    inputs = renderer.render_request(GenerationRequest.end_of_turn(text))
    chunk = 16
    score = ChunkedMessageEndProbability(model, inputs, renderer.message_end_id, chunk=chunk)
    chunks = 1
    while not score.advance():
        chunks += 1
    assert chunks == -(-inputs.input_ids.shape[1] // chunk)
    whole = message_end_probability(model, inputs, renderer.message_end_id)
    assert 0.0 < whole < 1.0
    assert score.probability() == pytest.approx(whole, rel=1e-4)
