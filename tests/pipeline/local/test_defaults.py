"""Qwen3-Omni's own defaults: the spoken-chat prompt, no <think>, a Talker at load."""

from __future__ import annotations

import re

import pytest
from transformers import Qwen3OmniMoeForConditionalGeneration

import pipeline.local.stages
import pipeline.local.tokenizer
from pipeline.contract import EngineError, GenerationDone
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, Conversation, UserText
from pipeline.local.checkpoint import load_checkpoint
from pipeline.local.engine_messages import EngineProcessSpec
from pipeline.local.engine_process import warm_up
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import PromptRenderer
from pipeline.local.stages import THINK_TOKEN_IDS
from pipeline.local.tokenizer import build_tokenizer, load_tokenizer
from pipeline.local.transformers_engine import TransformersEngine

pytestmark = pytest.mark.dev_model  # computes with the dev model: make test, not make test-unit


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
        events = list(stream_generation(model, tokenizer, inputs, params, lambda: False))
        done = events[-1]
        assert isinstance(done, GenerationDone)
        return done.text

    text = answer()
    assert text and "<think>" not in text and "</think>" not in text
    # Without the suppression the same Thinker writes nothing else (the test can fail).
    monkeypatch.setattr(pipeline.local.stages, "THINK_TOKEN_IDS", ())
    assert re.fullmatch(r"(</?think>)+", answer())


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


def test_a_checkpoint_without_talker_warms_up_its_text_paths_without_a_failure(no_talker_dir):
    loaded = load_checkpoint(EngineProcessSpec(model=str(no_talker_dir), device="cpu", audio_output=False))
    report = warm_up(loaded)
    assert (report.turns, report.failed, report.audio_chunks) == (4, 0, 0)
    assert report.text_deltas > 0
