"""Fixtures the pipeline tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from pipeline.local.devmodel import dev_generation_config, dev_model_config
from pipeline.local.tokenizer import load_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json")


@pytest.fixture
def one_thread():
    """One torch thread for the test: results do not depend on how many cores run it, and the
    suite's other processes keep theirs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(dev_model_dir):
    return load_tokenizer(dev_model_dir)


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
