"""Sampling: the checkpoint's generation config, Qwen's recommendation (Thinker) or generate()'s (Talker), the session's temperature."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

from pipeline.local.devmodel import dev_generation_config
from pipeline.local.sampling import talker_sampling, thinker_sampling

REPO_ROOT = Path(__file__).resolve().parents[3]


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


def test_a_generation_config_naming_no_talker_values_gets_generates_talker_sampling():
    defaults = inspect.signature(Qwen3OmniMoeForConditionalGeneration.generate).parameters
    expected = {name: defaults[f"talker_{name}"].default for name in ("temperature", "top_k", "top_p", "repetition_penalty")}
    assert as_dict(talker_sampling(GenerationConfig())) == expected


def test_the_talker_values_a_generation_config_names_are_followed():
    config = GenerationConfig(talker_temperature=0.7, talker_top_k=30)
    assert as_dict(talker_sampling(config)) == {"temperature": 0.7, "top_k": 30, "top_p": 1.0, "repetition_penalty": 1.05}
