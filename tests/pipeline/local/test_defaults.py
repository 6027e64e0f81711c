"""Qwen3-Omni's own defaults: the spoken-chat prompt, Thinker sampling, no <think>, a Talker at load."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

import pipeline.local.stages
import pipeline.local.tokenizer
from pipeline.contract import EngineError, TurnDone, TurnRequest
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, Conversation, UserText
from pipeline.local.checkpoint import NoTalkerError, load_checkpoint
from pipeline.local.devmodel import dev_generation_config, dev_model_config
from pipeline.local.engine_messages import EngineProcessSpec
from pipeline.local.engine_process import warm_up
from pipeline.local.generation import stream_turn
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import PromptRenderer
from pipeline.local.sampling import thinker_sampling
from pipeline.local.stages import THINK_TOKEN_IDS
from pipeline.local.tokenizer import build_tokenizer, load_tokenizer
from pipeline.local.transformers_engine import TransformersEngine

REPO_ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json")


def test_default_instructions_are_the_qwen3_omni_spoken_chat_prompt(dev_model_dir):
    assert DEFAULT_SYSTEM_PROMPT.startswith(
        "You are Qwen-Omni, a smart voice assistant created by Alibaba Qwen. "
        "You are a virtual voice assistant with no gender or age.\n"
    )
    for rule in ("short(no more than 50 words)", "bullet points", "asterisks, brackets, parentheses",
                 "the same language strictly as the user"):
        assert rule in DEFAULT_SYSTEM_PROMPT
    tokenizer = load_tokenizer(dev_model_dir)
    inputs = PromptRenderer.from_pretrained(dev_model_dir).render(Conversation(items=(UserText("Hi"),)))
    rendered = tokenizer.decode(inputs.input_ids[0])
    assert rendered.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nHi")


def documented_thinker_defaults() -> dict[str, float]:
    """The "Qwen's recommendation" column of docs/MODEL.md's Thinker sampling table."""
    text = (REPO_ROOT / "docs" / "MODEL.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", text, flags=re.MULTILINE)
    assert rows, "docs/MODEL.md has no Thinker sampling table"
    return {name: float(value) for name, value in rows}


def as_dict(sampling) -> dict[str, float]:
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "repetition_penalty": sampling.repetition_penalty,
    }


def test_a_generation_config_naming_nothing_gets_the_documented_recommendation():
    sampling = thinker_sampling(GenerationConfig(), None)
    assert sampling.do_sample
    assert as_dict(sampling) == documented_thinker_defaults()
    assert as_dict(sampling) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.0}


def test_a_generation_config_naming_values_is_followed():
    sampling = thinker_sampling(dev_generation_config(), None)
    assert sampling.do_sample
    assert as_dict(sampling) == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}


def test_a_generation_config_naming_some_values_gets_the_rest_from_the_recommendation():
    sampling = thinker_sampling(GenerationConfig(top_k=50, repetition_penalty=1.1), None)
    assert as_dict(sampling) == {"temperature": 0.6, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1}


def test_the_session_temperature_wins_and_zero_is_greedy():
    for config in (GenerationConfig(), dev_generation_config()):
        configured = thinker_sampling(config, None)
        chosen = thinker_sampling(config, 0.8)
        assert chosen.temperature == 0.8 and chosen.do_sample
        assert (chosen.top_k, chosen.top_p, chosen.repetition_penalty) == (
            configured.top_k,
            configured.top_p,
            configured.repetition_penalty,
        )
        assert not thinker_sampling(config, 0).do_sample


def test_a_checkpoint_that_says_do_not_sample_is_greedy_unless_the_request_asks():
    config = GenerationConfig(do_sample=False, temperature=0.7)
    assert not thinker_sampling(config, None).do_sample
    assert thinker_sampling(config, 0.8).do_sample


def test_think_tokens_are_the_ids_in_the_real_qwen3_tokenizer():
    tokenizer = build_tokenizer()
    assert tokenizer.convert_tokens_to_ids(["<think>", "</think>"]) == list(THINK_TOKEN_IDS)
    assert pipeline.local.tokenizer.SPECIAL_TOKENS[THINK_TOKEN_IDS[0]] == ("<think>", False)
    assert pipeline.local.tokenizer.SPECIAL_TOKENS[THINK_TOKEN_IDS[1]] == ("</think>", False)


def test_the_thinker_never_writes_think_tokens(dev_model_dir, monkeypatch):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir).eval()
    tokenizer = load_tokenizer(dev_model_dir)
    inputs = PromptRenderer.from_pretrained(dev_model_dir).render(Conversation(items=(UserText("Hi"),)))

    def favour_thinking(_module, _args, logits):
        # A Thinker that would rather think: <think> and </think> beat every other token by far.
        logits[..., list(THINK_TOKEN_IDS)] += 1e4
        return logits

    model.thinker.lm_head.register_forward_hook(favour_thinking)
    params = GenerationParams(temperature=0, output_audio=False, max_output_tokens=6)

    def answer() -> str:
        events = list(stream_turn(model, tokenizer, inputs, params, lambda: False))
        done = events[-1]
        assert isinstance(done, TurnDone)
        return done.text

    text = answer()
    assert text and "<think>" not in text and "</think>" not in text
    # Without the suppression the same Thinker writes nothing else (the test can fail).
    monkeypatch.setattr(pipeline.local.stages, "THINK_TOKEN_IDS", ())
    assert re.fullmatch(r"(</?think>)+", answer())


@pytest.fixture(scope="module")
def no_talker_dir(dev_model_dir, tmp_path_factory) -> Path:
    """A Thinking/Captioner-like checkpoint: the dev model's config with the Talker disabled."""
    out = tmp_path_factory.mktemp("Qwen3-Omni-dev-Thinking")
    config = dev_model_config()
    config.enable_audio_output = False
    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(config)
    assert not hasattr(model, "talker")
    model.generation_config = dev_generation_config()
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(dev_model_dir / name, out / name)
    return out


@pytest.mark.asyncio(loop_scope="session")
async def test_an_engine_on_a_checkpoint_without_talker_fails_to_start_naming_it(no_talker_dir):
    engine = TransformersEngine(no_talker_dir, device="cpu", threads=1)
    with pytest.raises(EngineError) as raised:
        await engine.start()
    await engine.close()
    message = str(raised.value)
    assert str(no_talker_dir) in message
    assert "has no Talker (its config sets enable_audio_output to false)" in message
    assert "Qwen/Qwen3-Omni-30B-A3B-Instruct" in message


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
    events = list(stream_turn(loaded.model, loaded.tokenizer, inputs, params, lambda: False))
    assert isinstance(events[-1], TurnDone) and events[-1].usage.output_text_tokens >= 1
    assert TurnRequest(conversation=conversation).output_audio  # what a speaking session would ask for


def test_a_checkpoint_without_talker_warms_up_its_text_paths_without_a_failure(no_talker_dir):
    loaded = load_checkpoint(EngineProcessSpec(model=str(no_talker_dir), device="cpu", audio_output=False))
    report = warm_up(loaded)
    assert (report.turns, report.failed, report.audio_chunks) == (4, 0, 0)
    assert report.text_deltas > 0


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
