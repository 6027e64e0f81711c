"""Loading a checkpoint: a Talker or a refusal naming why, the tokenizer once, the attention implementation."""

from __future__ import annotations

import json
import shutil

import pytest

import pipeline.local.tokenizer
from pipeline.contract import GenerationDone, GenerationRequest
from pipeline.conversation import Conversation, UserText
from pipeline.local.checkpoint import NoTalkerError, load_checkpoint
from pipeline.local.engine_messages import EngineProcessSpec
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams

pytestmark = pytest.mark.dev_model  # computes with the dev model: make test, not make test-unit


def test_a_checkpoint_whose_talker_weights_are_missing_is_refused(no_talker_dir, tmp_path):
    claims_talker = tmp_path / "claims-a-talker"
    shutil.copytree(no_talker_dir, claims_talker)
    config = json.loads((claims_talker / "config.json").read_text())
    config["enable_audio_output"] = True
    (claims_talker / "config.json").write_text(json.dumps(config))
    with pytest.raises(NoTalkerError, match=r"claims-a-talker has no Talker \(\d+ Talker/Code2Wav weights are missing"):
        load_checkpoint(EngineProcessSpec(model=str(claims_talker), device="cpu"))


def test_without_audio_output_a_checkpoint_without_talker_serves_text(no_talker_dir):
    loaded = load_checkpoint(EngineProcessSpec(model=str(no_talker_dir), device="cpu", audio_output=False))
    assert not loaded.model.has_talker
    conversation = Conversation(items=(UserText("Hi"),))
    params = GenerationParams(temperature=0, output_audio=False, max_output_tokens=4)
    inputs = loaded.renderer.render(conversation)
    events = list(stream_generation(loaded.model, loaded.tokenizer, inputs, params, lambda: False))
    assert isinstance(events[-1], GenerationDone) and events[-1].usage.output_text_tokens >= 1
    assert GenerationRequest(conversation=conversation).output_audio  # what a speaking session would ask for


def test_the_engine_loads_the_tokenizer_once(dev_model_dir, monkeypatch):
    loads = []
    original = pipeline.local.tokenizer.AutoTokenizer.from_pretrained

    def counting(*args, **kwargs):
        loads.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline.local.tokenizer.AutoTokenizer, "from_pretrained", counting)
    loaded = load_checkpoint(EngineProcessSpec(model=str(dev_model_dir), device="cpu"))
    assert len(loads) == 1
    inputs = loaded.renderer.render(Conversation(items=(UserText("Hi"),)))
    assert loaded.tokenizer.decode(inputs.input_ids[0]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_the_attention_implementation_reaches_the_model(dev_model_dir, implementation):
    loaded = load_checkpoint(EngineProcessSpec(model=str(dev_model_dir), device="cpu", attn_implementation=implementation))
    assert loaded.model.thinker.config._attn_implementation == implementation
    assert loaded.model.talker.config._attn_implementation == implementation


def test_without_an_attention_implementation_transformers_chooses(dev_model_dir):
    loaded = load_checkpoint(EngineProcessSpec(model=str(dev_model_dir), device="cpu"))
    assert loaded.model.thinker.config._attn_implementation == "sdpa"
