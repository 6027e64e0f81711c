"""Settings: what the fields themselves decide, whatever reads them (flags, environment, code)."""

from __future__ import annotations

import pytest

from app.config import Settings

ENGINE_URLS = ["http://gpu-1:8091/v1"]


def test_the_log_level_is_read_in_any_case(monkeypatch):
    monkeypatch.setenv("OMNI_RTC_LOG_LEVEL", "WARNING")
    assert Settings().log_level == "warning"


def test_an_unknown_log_level_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="log_level"):
        Settings(log_level="verbose")


def test_an_in_process_engine_setting_is_refused_with_engine_urls():
    with pytest.raises(ValueError, match="attn_implementation set with engine_urls"):
        Settings(engine_urls=ENGINE_URLS, attn_implementation="eager")


def test_the_model_and_seed_go_to_either_engine():
    settings = Settings(engine_urls=ENGINE_URLS, model="Qwen/Qwen3-Omni-30B-A3B-Instruct", seed=7)
    assert (settings.model, settings.seed) == ("Qwen/Qwen3-Omni-30B-A3B-Instruct", 7)
