"""``omni-rtc``: flags over environment and clear refusals. A real ``call``: tests/e2e/test_cli.py."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.cli import _settings, build_parser, default_in_words, main, readme_with_configuration_tables, serve_flags
from app.config import Settings
from app.http.server import _base_session_config
from app.realtime.turn_taking import EngineTextJudge
from app.serving.call_factory import text_judge
from tests.fakes import FULL_CAPABILITIES, ScriptedEngine

README = Path(__file__).resolve().parents[2] / "README.md"


def serve_settings(monkeypatch: pytest.MonkeyPatch, argv: list[str], **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return _settings(build_parser().parse_args(["serve", *argv]))


def test_serve_flags_override_the_environment(monkeypatch):
    settings = serve_settings(monkeypatch, ["--port", "9001", "--ice-server", "stun:127.0.0.1:3478"], OMNI_RTC_PORT="8001")
    assert settings.port == 9001
    assert settings.ice_servers == ["stun:127.0.0.1:3478"]


def test_serve_takes_what_no_flag_gives_from_the_environment(monkeypatch):
    settings = serve_settings(
        monkeypatch,
        [],
        OMNI_RTC_ICE_LOOPBACK="true",
        OMNI_RTC_ICE_SERVERS="stun:127.0.0.1:3478, turn:127.0.0.1:3478?transport=udp",
        OMNI_RTC_ICE_USERNAME="user",
        OMNI_RTC_ICE_CREDENTIAL="password",
        OMNI_RTC_CORS_ORIGINS="https://a.example,https://b.example",
    )
    assert settings.ice_loopback is True
    assert settings.ice_servers == ["stun:127.0.0.1:3478", "turn:127.0.0.1:3478?transport=udp"]
    assert settings.cors_origins == ["https://a.example", "https://b.example"]


def test_serve_repeated_flags_collect(monkeypatch):
    settings = serve_settings(monkeypatch, ["--cors-origin", "https://a.example", "--cors-origin", "https://b.example"])
    assert settings.cors_origins == ["https://a.example", "https://b.example"]


def test_serve_refuses_invalid_settings_with_a_message(capsys):
    assert main(["serve", "--host", "0.0.0.0"]) == 2  # public bind, no API key
    assert "API key" in capsys.readouterr().err


def test_interrupt_response_is_on_unless_the_flag_turns_it_off(monkeypatch):
    assert serve_settings(monkeypatch, []).default_interrupt_response is True
    assert serve_settings(monkeypatch, ["--no-interrupt-response"]).default_interrupt_response is False
    assert serve_settings(monkeypatch, [], OMNI_RTC_DEFAULT_INTERRUPT_RESPONSE="false").default_interrupt_response is False


def test_the_prompt_limit_must_hold_the_session_budgets(monkeypatch, capsys):
    settings = serve_settings(monkeypatch, ["--instructions-max-tokens", "8000", "--max-prompt-tokens", "24100"])
    assert (settings.instructions_max_tokens, settings.max_prompt_tokens) == (8_000, 24_100)
    assert main(["serve", "--instructions-max-tokens", "20000"]) == 2  # 20,000 + 16,000 history > 32,768
    assert "max_prompt_tokens" in capsys.readouterr().err


def test_dev_replies_are_a_file_of_answer_texts(monkeypatch, tmp_path):
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["Hello.", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>']))
    assert serve_settings(monkeypatch, ["--dev-replies", str(replies)]).dev_replies == replies


@pytest.mark.parametrize("content", ["not json", '{"a": 1}', '["ok", 3]'])
def test_serve_refuses_dev_replies_that_are_not_a_list_of_texts_naming_the_key(tmp_path, capsys, content):
    replies = tmp_path / "replies.json"
    replies.write_text(content)
    assert main(["serve", "--dev-replies", str(replies)]) == 2
    assert "dev_replies" in capsys.readouterr().err


def test_media_workers_default_to_the_usable_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 2, 5})  # as under `taskset -c 0,2,5`
    assert serve_settings(monkeypatch, []).media_workers == 3
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {1})
    assert serve_settings(monkeypatch, []).media_workers == 1  # one core: every call in the server process
    assert serve_settings(monkeypatch, ["--media-workers", "4"]).media_workers == 4
    assert serve_settings(monkeypatch, [], OMNI_RTC_MEDIA_WORKERS="1").media_workers == 1


def test_media_workers_default_without_affinity_is_every_core(monkeypatch):
    monkeypatch.delattr("os.sched_getaffinity")  # macOS and Windows have none
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert serve_settings(monkeypatch, []).media_workers == 6
    monkeypatch.setattr("os.cpu_count", lambda: None)  # undeterminable
    assert serve_settings(monkeypatch, []).media_workers == 1


def test_serve_refuses_zero_media_workers_naming_the_key(capsys):
    assert main(["serve", "--media-workers", "0"]) == 2
    assert "media_workers" in capsys.readouterr().err


def test_call_refuses_an_unreadable_wav(tmp_path, capsys):
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("not audio")
    assert main(["call", "http://127.0.0.1:9", "--wav", str(not_audio), "--out", str(tmp_path / "out")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_serve_attention_implementation_from_flag_or_environment(monkeypatch):
    assert serve_settings(monkeypatch, []).attn_implementation is None
    assert serve_settings(monkeypatch, ["--attn-implementation", "eager"]).attn_implementation == "eager"
    from_env = serve_settings(monkeypatch, [], OMNI_RTC_ATTN_IMPLEMENTATION="flash_attention_2")
    assert from_env.attn_implementation == "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        serve_settings(monkeypatch, [], OMNI_RTC_ATTN_IMPLEMENTATION="fast")


def test_serve_turn_text_judge_is_off_unless_asked_and_then_runs_on_the_engine(monkeypatch):
    engine = ScriptedEngine()
    assert serve_settings(monkeypatch, []).turn_text_judge == "off"
    assert text_judge(serve_settings(monkeypatch, []), engine) is None
    judge = text_judge(serve_settings(monkeypatch, ["--turn-text-judge", "engine"]), engine)
    assert isinstance(judge, EngineTextJudge)
    assert serve_settings(monkeypatch, [], OMNI_RTC_TURN_TEXT_JUDGE="engine").turn_text_judge == "engine"
    with pytest.raises(ValueError, match="turn_text_judge"):
        serve_settings(monkeypatch, [], OMNI_RTC_TURN_TEXT_JUDGE="lexical")


def test_the_text_judge_is_built_only_on_an_engine_that_scores_the_end_of_a_turn(monkeypatch):
    engine = ScriptedEngine(capabilities=dataclasses.replace(FULL_CAPABILITIES, end_of_turn_scores=False))
    assert text_judge(serve_settings(monkeypatch, ["--turn-text-judge", "engine"]), engine) is None


def test_dev_model_writes_the_hub_layout(tmp_path, capsys):
    assert main(["dev-model", "--out", str(tmp_path), "--layout", "hub"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert "thinker.model.layers.0.mlp.experts.0.gate_proj.weight" in index["weight_map"]


def test_serve_engine_pool_from_a_device_list_or_an_engine_count(monkeypatch):
    assert serve_settings(monkeypatch, []).engine.devices == ("auto",)
    assert serve_settings(monkeypatch, ["--device", "cuda:0,cuda:1"]).engine.devices == ("cuda:0", "cuda:1")
    assert serve_settings(monkeypatch, ["--device", "cpu", "--engines", "3"]).engine.devices == ("cpu",) * 3
    assert serve_settings(monkeypatch, ["--max-batch", "4"]).max_batch == 4
    assert serve_settings(monkeypatch, [], OMNI_RTC_MAX_BATCH="2", OMNI_RTC_ENGINES="2").engine.devices == ("auto",) * 2
    with pytest.raises(ValueError, match="engines=2 with device='cuda:0,cuda:1'"):
        serve_settings(monkeypatch, ["--device", "cuda:0,cuda:1", "--engines", "2"])
    with pytest.raises(ValueError, match="max_batch"):
        serve_settings(monkeypatch, ["--max-batch", "0"])


def test_serve_engine_urls_from_flags_or_the_environment(monkeypatch):
    settings = serve_settings(
        monkeypatch, ["--engine-url", "http://gpu-1:8091/v1/", "--engine-url", "https://gpu-2/v1", "--engine-api-key", "k"]
    )
    assert settings.engine_urls == ["http://gpu-1:8091/v1", "https://gpu-2/v1"]
    assert settings.engine_api_key is not None and settings.engine_api_key.get_secret_value() == "k"
    from_env = serve_settings(monkeypatch, [], OMNI_RTC_ENGINE_URLS="http://a:1/v1,http://b:2/v1")
    assert from_env.engine_urls == ["http://a:1/v1", "http://b:2/v1"]


def test_serve_refuses_engine_urls_that_are_not_http(monkeypatch):
    with pytest.raises(ValueError, match="engine_urls: 'gpu-1:8091' is not an http"):
        serve_settings(monkeypatch, ["--engine-url", "gpu-1:8091"])


def test_serve_refuses_in_process_engine_options_with_engine_urls(monkeypatch):
    with pytest.raises(ValueError, match="device, max_batch set with engine_urls"):
        serve_settings(monkeypatch, ["--engine-url", "http://gpu-1:8091/v1", "--device", "cuda", "--max-batch", "4"])
    with pytest.raises(ValueError, match="engine_api_key is set without engine_urls"):
        serve_settings(monkeypatch, ["--engine-api-key", "k"])


def test_partial_transcripts_are_on_unless_the_flag_or_the_environment_turns_them_off(monkeypatch):
    assert serve_settings(monkeypatch, []).partial_transcripts is True
    assert serve_settings(monkeypatch, ["--no-partial-transcripts"]).partial_transcripts is False
    assert serve_settings(monkeypatch, [], OMNI_RTC_PARTIAL_TRANSCRIPTS="false").partial_transcripts is False
    assert _base_session_config(Settings(partial_transcripts=False)).partial_transcripts is False


def test_speculative_responses_are_on_unless_the_flag_or_the_environment_turns_them_off(monkeypatch):
    assert serve_settings(monkeypatch, []).speculative_responses is True
    assert serve_settings(monkeypatch, ["--no-speculative-responses"]).speculative_responses is False
    off = serve_settings(monkeypatch, [], OMNI_RTC_SPECULATIVE_RESPONSES="false")
    assert off.speculative_responses is False
    assert serve_settings(monkeypatch, ["--speculative-responses"], OMNI_RTC_SPECULATIVE_RESPONSES="false").speculative_responses


# -- serve's flags follow from the Settings fields -----------------------------------------------


def serve_help(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping: each help reads as written
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    return capsys.readouterr().out


def test_every_setting_is_one_serve_flag():
    flags = serve_flags()
    assert [flag.setting for flag in flags] == list(Settings.model_fields)
    assert len({flag.option for flag in flags}) == len(flags)
    given = vars(build_parser().parse_args(["serve"]))
    assert set(given) == {"command", *Settings.model_fields}
    assert [name for name, value in given.items() if value is not None] == ["command"]  # none passed on unless given


def test_serve_keeps_its_flag_names():
    options = {flag.setting: flag.option for flag in serve_flags()}
    assert options["engine_urls"] == "--engine-url"
    assert options["ice_servers"] == "--ice-server"
    assert options["cors_origins"] == "--cors-origin"
    assert options["trusted_proxies"] == "--trusted-proxy"
    assert options["allowed_hosts"] == "--allowed-host"
    assert options["default_interrupt_response"] == "--interrupt-response"
    assert (options["ice_username"], options["ice_credential"]) == ("--ice-username", "--ice-credential")
    assert (options["disconnect_timeout_s"], options["ice_credential_ttl_s"]) == ("--disconnect-timeout", "--ice-credential-ttl")
    assert options["max_batch"] == "--max-batch"


def test_each_serve_flags_help_is_its_settings_description_and_default(monkeypatch, capsys):
    text = serve_help(monkeypatch, capsys)
    for flag in serve_flags():
        description = Settings.model_fields[flag.setting].description
        after_option = re.escape(flag.option) + r"[ ,][^\n]*\s+"
        default = re.escape(f"default: {default_in_words(flag.setting)})")
        help_text = re.escape(f"{description} (") + r"(repeatable; )?" + default
        assert re.search(after_option + help_text, text), flag.option


def test_serve_help_wraps_at_spaces_never_inside_a_hyphenated_word(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    assert "comma-separated" in text  # --device's help, kept whole on its line
    assert re.search(r"[a-z]-\n\s+[a-z]", text) is None


def test_serve_help_groups_the_flags_by_concern(monkeypatch, capsys):
    text = serve_help(monkeypatch, capsys)
    assert text.index("\nWebRTC:\n") < text.index("  --ice-server URL") < text.index("\nLimits:\n")
    edge = text.index("\nEdge: auth, TLS, proxies, hosts:\n")
    assert text.index("\nLimits:\n") < text.index("  --max-session SECONDS") < edge


def test_every_on_off_setting_has_both_flags(monkeypatch):
    assert serve_settings(monkeypatch, ["--ice-loopback"]).ice_loopback is True
    assert serve_settings(monkeypatch, ["--no-ice-loopback"], OMNI_RTC_ICE_LOOPBACK="true").ice_loopback is False
    assert serve_settings(monkeypatch, ["--no-jitter-buffer"]).jitter_buffer is False


def test_serve_literal_flags_offer_the_fields_choices(monkeypatch, capsys):
    assert serve_settings(monkeypatch, ["--log-level", "debug"]).log_level == "debug"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--log-level", "verbose"])
    assert "argument --log-level: invalid choice: 'verbose'" in capsys.readouterr().err


def test_serve_json_flags_read_json(monkeypatch, capsys):
    settings = serve_settings(monkeypatch, ["--generation", '{"max_audio_frames": 250}'])
    assert settings.generation == {"max_audio_frames": 250}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--generation", "max_audio_frames=250"])
    assert "argument --generation: not JSON" in capsys.readouterr().err


def test_serve_list_flags_collect_and_replace_the_environments_list(monkeypatch):
    settings = serve_settings(
        monkeypatch, ["--allowed-host", "a.example", "--allowed-host", "*.b.example"], OMNI_RTC_ALLOWED_HOSTS="c.example"
    )
    assert settings.allowed_hosts == ["a.example", "*.b.example"]


def test_serve_secret_flags_become_secret_strings(monkeypatch):
    settings = serve_settings(monkeypatch, ["--api-key", "k-123"])
    assert isinstance(settings.api_key, SecretStr) and settings.api_key.get_secret_value() == "k-123"


def test_settings_that_were_environment_only_have_flags_over_the_environment(monkeypatch):
    settings = serve_settings(
        monkeypatch,
        ["--max-session", "90", "--turn-stall-timeout", "0.5", "--max-sdp-bytes", "2048", "--max-events-per-second", "5"],
        OMNI_RTC_MAX_SESSION_S="30",
        OMNI_RTC_TURN_STALL_TIMEOUT_S="20",
    )
    assert (settings.max_session_s, settings.turn_stall_timeout_s) == (90.0, 0.5)
    assert (settings.max_sdp_bytes, settings.max_events_per_second) == (2048, 5.0)


def test_serve_refuses_a_bad_value_naming_the_key(capsys):
    assert main(["serve", "--max-sdp-bytes", "100"]) == 2  # at least 1 KiB
    assert "max_sdp_bytes" in capsys.readouterr().err


def test_readme_configuration_tables_are_the_settings():
    readme = README.read_text(encoding="utf-8")
    assert readme_with_configuration_tables(readme) == readme, (
        "README.md's configuration tables are stale: run PYTHONPATH=. .venv/bin/python scripts/settings_table.py"
    )
