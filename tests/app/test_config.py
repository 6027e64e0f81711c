"""Settings: what the fields themselves decide, whatever reads them (flags, environment, code)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.config import LocalEngine, Settings, VllmOmniServers, dev_replies_file

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


def test_without_engine_urls_the_engine_is_the_in_process_one_with_its_settings(tmp_path):
    replies = tmp_path / "replies.json"
    replies.write_text('["Hi."]')
    engine = Settings(device="cpu", engines=2, max_batch=4, engine_threads=1, dev_replies=replies).engine
    assert engine == LocalEngine(devices=("cpu", "cpu"), max_batch=4, dtype="auto", generation={}, threads=1,
                                 attn_implementation=None, dev_replies=replies)


def test_the_engine_is_built_once_and_a_copy_builds_its_own():
    settings = Settings(device="cpu", max_batch=4)
    assert settings.engine is settings.engine
    copy = settings.model_copy(update={"max_batch": 2})
    assert isinstance(copy.engine, LocalEngine) and copy.engine.max_batch == 2
    assert isinstance(settings.engine, LocalEngine) and settings.engine.max_batch == 4


def test_settings_load_no_webrtc_stack():
    """Settings are read by the CLI, the client and every process; the jitter buffer's aiortc
    check belongs to the server's start (app.serving.call_factory.check_jitter_buffer)."""
    code = (
        "import sys, app.config\n"
        "app.config.Settings(jitter_buffer=True)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiortc', 'aioice')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_with_engine_urls_the_engine_is_the_vllm_omni_servers_and_nothing_of_the_local_one():
    engine = Settings(engine_urls=ENGINE_URLS, engine_api_key="k").engine
    assert isinstance(engine, VllmOmniServers)
    assert engine.urls == tuple(ENGINE_URLS)
    assert engine.api_key is not None and engine.api_key.get_secret_value() == "k"
    assert not hasattr(engine, "devices")


def test_scripted_replies_belong_to_the_in_process_engine(tmp_path):
    replies = tmp_path / "replies.json"
    replies.write_text('["Hi."]')
    assert dev_replies_file(Settings(dev_replies=replies)) == replies
    assert dev_replies_file(Settings(engine_urls=ENGINE_URLS)) is None


def test_the_engine_is_one_of_two_kinds_told_apart_by_its_kind():
    from pydantic import TypeAdapter

    from app.config import EngineSettings

    read = TypeAdapter(EngineSettings).validate_python({"kind": "vllm_omni", "urls": ["http://a:1/v1"], "api_key": None})
    assert isinstance(read, VllmOmniServers)
    with pytest.raises(ValueError, match="kind"):
        TypeAdapter(EngineSettings).validate_python({"kind": "both", "urls": [], "devices": ["cpu"]})
