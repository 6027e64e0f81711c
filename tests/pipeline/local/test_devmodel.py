import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from safetensors import safe_open
from transformers import (
    AutoConfig,
    GenerationConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)

import pipeline.local.devmodel
from pipeline.contract import AudioChunk, GenerationDone
from pipeline.conversation import Conversation, UserAudio
from pipeline.local.devmodel import (
    DEV_MODEL_DIRNAME,
    DEV_MODEL_VERSION,
    HUB_LAYOUT_SHARDS,
    VERSION_FILE,
    build_dev_model,
    dev_model,
    ensure_dev_model,
)
from pipeline.local.generation import stream_generation
from pipeline.local.params import GenerationParams
from pipeline.local.prompt import PromptRenderer
from pipeline.local.qwen3_omni_config import instruct_config
from pipeline.local.tokenizer import load_tokenizer

pytestmark = pytest.mark.dev_model  # computes with the dev model: make test, not make test-unit

SAMPLES_PER_CODEC_FRAME = 1920  # 80 ms at 24 kHz
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_dev_model_loads_with_from_pretrained_as_the_real_class(dev_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir)
    assert type(model) is Qwen3OmniMoeForConditionalGeneration
    assert model.has_talker
    assert {"thinker", "talker", "code2wav"} <= {name for name, _ in model.named_children()}
    assert model.thinker.model.audio_tower is not None
    assert model.talker.code_predictor is not None


LOUDNESS_LAYER = "code2wav.decoder.6.conv."


def test_saved_weights_are_the_seeded_dev_weights_and_all_sane(dev_model_dir):
    saved = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir).state_dict()
    rebuilt = dev_model(seed=0).state_dict()
    assert saved.keys() == rebuilt.keys()
    for name, tensor in rebuilt.items():
        assert torch.equal(saved[name], tensor), name
        assert torch.isfinite(tensor).all(), name
        # Initialised weights are N(0, 0.02), ones, zeros or small markers; never stray memory.
        # Code2Wav's last convolution alone carries the loudness calibration (a gain of 2**23).
        bound = 1e6 if name.startswith(LOUDNESS_LAYER) else 10
        assert tensor.abs().max() < bound, name


def test_dev_model_speaks_at_speech_level(dev_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir)
    codes = torch.randint(0, 2048, (1, 16, 30), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        wave = model.code2wav(codes)
    rms = wave.pow(2).mean().sqrt().item()
    # -20 dBFS by calibration; any 16-bit PCM step is 3e-5, so this is plainly audible.
    assert 0.03 < rms < 0.3


def test_config_carries_the_real_token_ids(dev_model_dir):
    config = AutoConfig.from_pretrained(dev_model_dir)
    assert config.architectures == ["Qwen3OmniMoeForConditionalGeneration"]
    assert (
        config.im_start_token_id,
        config.im_end_token_id,
        config.tts_pad_token_id,
        config.tts_bos_token_id,
        config.tts_eos_token_id,
        config.system_token_id,
        config.user_token_id,
        config.assistant_token_id,
    ) == (151644, 151645, 151671, 151672, 151673, 8948, 872, 77091)
    thinker = config.thinker_config
    assert (thinker.audio_token_id, thinker.audio_start_token_id) == (151675, 151669)
    assert thinker.text_config.vocab_size == 152_064
    assert thinker.audio_config.num_mel_bins == 128


def test_config_carries_the_real_codec_ids_and_speakers(dev_model_dir):
    talker = AutoConfig.from_pretrained(dev_model_dir).talker_config
    assert (
        talker.codec_pad_id,
        talker.codec_bos_id,
        talker.codec_eos_token_id,
        talker.codec_nothink_id,
        talker.codec_think_bos_id,
        talker.codec_think_eos_id,
    ) == (2148, 2149, 2150, 2155, 2156, 2157)
    assert talker.speaker_id == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert talker.num_code_groups == 16
    assert talker.text_config.vocab_size > max(talker.speaker_id.values())


def test_code2wav_upsamples_each_codec_frame_to_1920_samples(dev_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir)
    assert model.code2wav.total_upsample == SAMPLES_PER_CODEC_FRAME
    codes = torch.randint(0, 2048, (1, 16, 10))
    with torch.no_grad():
        wav_10 = model.code2wav(codes)
        wav_20 = model.code2wav(torch.cat([codes, codes], dim=-1))
    # The causal transposed convolutions trim a fixed tail per call, so frames add 1920 each.
    assert wav_20.shape[-1] - wav_10.shape[-1] == 10 * SAMPLES_PER_CODEC_FRAME


def test_feature_extractor_is_whisper_128_bins_at_16_khz(dev_model_dir):
    extractor = WhisperFeatureExtractor.from_pretrained(dev_model_dir)
    assert (extractor.feature_size, extractor.sampling_rate) == (128, 16_000)
    features = extractor([0.0] * 16_000, sampling_rate=16_000, return_tensors="pt", padding=True)
    assert features["input_features"].shape[1] == 128


def test_generation_config_holds_thinker_and_talker_sampling(dev_model_dir):
    generation = GenerationConfig.from_pretrained(dev_model_dir)
    assert generation.do_sample and generation.eos_token_id == [151645, 151643]
    assert json.loads(generation.to_json_string())["talker_temperature"] == 0.9


def test_the_real_depth_dev_model_has_the_real_layer_and_expert_counts(real_depth_model_dir):
    config = AutoConfig.from_pretrained(real_depth_model_dir)
    real = instruct_config()
    thinker, talker = config.thinker_config, config.talker_config
    assert (thinker.text_config.num_hidden_layers, thinker.text_config.num_experts) == (48, 128)
    assert (thinker.text_config.num_experts_per_tok, talker.accept_hidden_layer) == (8, 24)
    assert talker.code_predictor_config.num_hidden_layers == 5
    for ours, theirs in (
        (thinker.text_config, real.thinker_config.text_config),
        (talker.text_config, real.talker_config.text_config),
    ):
        assert (ours.num_hidden_layers, ours.num_experts, ours.num_experts_per_tok) == (
            theirs.num_hidden_layers,
            theirs.num_experts,
            theirs.num_experts_per_tok,
        )
    assert talker.code_predictor_config.num_hidden_layers == real.talker_config.code_predictor_config.num_hidden_layers
    assert config.code2wav_config.num_hidden_layers == real.code2wav_config.num_hidden_layers
    assert thinker.audio_config.encoder_layers == real.thinker_config.audio_config.encoder_layers
    assert thinker.vision_config.depth == real.thinker_config.vision_config.depth
    assert thinker.vision_config.deepstack_visual_indexes == real.thinker_config.vision_config.deepstack_visual_indexes
    # The default dev model's tiny widths.
    assert thinker.text_config.hidden_size == talker.text_config.hidden_size == 32


def test_dev_model_stays_a_few_tens_of_megabytes(dev_model_dir):
    total = sum(path.stat().st_size for path in dev_model_dir.iterdir())
    assert total < 100 * 2**20
    assert (dev_model_dir / "model.safetensors").stat().st_size < 64 * 2**20


def test_ensure_reuses_a_built_model_without_rebuilding(dev_model_dir, monkeypatch):
    def refuse_to_build(*args, **kwargs):
        raise AssertionError("ensure_dev_model rebuilt a model that was already there")

    monkeypatch.setattr(pipeline.local.devmodel, "build_dev_model", refuse_to_build)
    messages = []
    assert ensure_dev_model(dev_model_dir.parent, progress=messages.append) == dev_model_dir
    assert dev_model_dir.name == DEV_MODEL_DIRNAME
    assert any("using" in message for message in messages)


def _fake_build(out_dir, *, seed=0, layout="fused", depth="tiny", progress=None):
    (out_dir / "config.json").write_text("{}")
    (out_dir / VERSION_FILE).write_text(DEV_MODEL_VERSION)
    return out_dir


def test_ensure_builds_into_place_and_leaves_no_staging_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.local.devmodel, "build_dev_model", _fake_build)
    built = ensure_dev_model(tmp_path)
    assert built == tmp_path / DEV_MODEL_DIRNAME
    assert [path.name for path in tmp_path.iterdir()] == [DEV_MODEL_DIRNAME]
    assert (built / VERSION_FILE).read_text() == DEV_MODEL_VERSION


def test_ensure_replaces_a_build_from_an_older_version(tmp_path, monkeypatch):
    outdated = tmp_path / DEV_MODEL_DIRNAME
    outdated.mkdir()
    (outdated / "config.json").write_text('{"outdated": true}')
    monkeypatch.setattr(pipeline.local.devmodel, "build_dev_model", _fake_build)
    built = ensure_dev_model(tmp_path)
    assert (built / "config.json").read_text() == "{}"
    assert [path.name for path in tmp_path.iterdir()] == [DEV_MODEL_DIRNAME]


def test_each_depth_and_layout_is_built_into_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline.local.devmodel, "build_dev_model", _fake_build)
    built = {
        (layout, depth): ensure_dev_model(tmp_path, layout=layout, depth=depth)
        for layout in ("fused", "hub")
        for depth in ("tiny", "real")
    }
    assert {path.name for path in built.values()} == {
        "dev-model",
        "dev-model-hub",
        "dev-model-real-depth",
        "dev-model-real-depth-hub",
    }
    with pytest.raises(ValueError, match="unknown depth"):
        ensure_dev_model(tmp_path, depth="shallow")  # type: ignore[arg-type]


def test_dev_model_ends_its_answer_and_its_speech_under_generate(dev_model_dir):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir)
    pcm, _ = soundfile.read(FIXTURES / "hello.wav", dtype="float32")
    inputs = PromptRenderer.from_pretrained(dev_model_dir).render(Conversation(items=(UserAudio(pcm),)))
    torch.manual_seed(0)
    sequences, wav = model.generate(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        input_features=inputs.input_features,
        feature_attention_mask=inputs.feature_attention_mask,
        # (23/24)^400 < 1e-7: a Thinker that can stop has stopped long before these caps.
        thinker_max_new_tokens=400,
        talker_max_new_tokens=800,
        speaker="ethan",
    )
    answer = sequences[0, inputs.input_ids.shape[1] :].tolist()
    assert answer[-1] == 151645  # <|im_end|>
    # The dev Talker speaks one codec frame per text token, then stops with p ~ 0.1 per frame:
    # 200 more frames would take a 0.9^200 < 1e-9 chance.
    frames = wav.shape[-1] / SAMPLES_PER_CODEC_FRAME
    assert len(answer) - 2 <= frames < len(answer) + 200


@pytest.fixture(scope="module")
def hub_layout_dir(tmp_path_factory) -> Path:
    return build_dev_model(tmp_path_factory.mktemp("hub") / "dev-model-hub", layout="hub")


def test_the_default_layout_is_transformers_own_fused_experts(dev_model_dir):
    with safe_open(dev_model_dir / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert "thinker.model.language_model.layers.0.mlp.experts.gate_up_proj" in names
    assert not any(".experts.0." in name for name in names)


def test_the_hub_layout_is_shards_an_index_and_one_tensor_per_expert(hub_layout_dir):
    index = json.loads((hub_layout_dir / "model.safetensors.index.json").read_text())
    shards = sorted(path.name for path in hub_layout_dir.glob("*.safetensors"))
    assert shards == [f"model-{i:05d}-of-{HUB_LAYOUT_SHARDS:05d}.safetensors" for i in range(1, HUB_LAYOUT_SHARDS + 1)]
    assert set(index["weight_map"].values()) == set(shards)
    names = set(index["weight_map"])
    for stored_in in shards:
        with safe_open(hub_layout_dir / stored_in, "pt") as weights:
            assert {name for name, shard in index["weight_map"].items() if shard == stored_in} == set(weights.keys())
    config = AutoConfig.from_pretrained(hub_layout_dir)
    experts, layers = config.thinker_config.text_config.num_experts, config.thinker_config.text_config.num_hidden_layers
    # The published checkpoint's names: no language_model level, one gate/up/down per expert.
    for tower in ("thinker", "talker"):
        for expert in range(experts):
            for projection in ("gate_proj", "up_proj", "down_proj"):
                assert f"{tower}.model.layers.{layers - 1}.mlp.experts.{expert}.{projection}.weight" in names
    assert {"thinker.model.embed_tokens.weight", "thinker.lm_head.weight", "thinker.audio_tower.conv2d1.weight",
            "thinker.visual.patch_embed.proj.weight", "talker.codec_head.weight",
            "code2wav.code_embedding.weight"} <= names
    assert not any("language_model" in name or "gate_up_proj" in name for name in names)


def test_the_hub_layout_names_what_transformers_itself_would_save(hub_layout_dir, tmp_path):
    """Our writer and transformers' reverse conversion agree on every name, shape and value."""
    dev_model(seed=0).save_pretrained(tmp_path, save_original_format=True)
    with safe_open(tmp_path / "model.safetensors", "pt") as theirs:
        expected = {name: theirs.get_tensor(name) for name in theirs.keys()}
    index = json.loads((hub_layout_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(expected)
    for name, shard in index["weight_map"].items():
        with safe_open(hub_layout_dir / shard, "pt") as ours:
            assert torch.equal(ours.get_tensor(name), expected[name]), name


def greedy_turn(model_dir: Path) -> tuple[str, np.ndarray]:
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).eval()
    pcm, _ = soundfile.read(FIXTURES / "hello.wav", dtype="float32")
    inputs = PromptRenderer.from_pretrained(model_dir).render(Conversation(items=(UserAudio(pcm),)))
    # The fixed chunk schedule: adaptive chunks follow the machine's speed, and a different
    # chunking changes Code2Wav's output in the last float bits (the layouts must match exactly).
    params = GenerationParams(
        temperature=0, talker_do_sample=False, max_output_tokens=12, max_audio_frames=20, adaptive_chunks=False
    )
    events = list(stream_generation(model, load_tokenizer(model_dir), inputs, params, lambda: False))
    done = events[-1]
    assert isinstance(done, GenerationDone)
    audio = np.concatenate([event.pcm for event in events if isinstance(event, AudioChunk)])
    return done.text, audio


def test_both_layouts_load_the_same_weights_and_give_identical_greedy_turns(dev_model_dir, hub_layout_dir):
    fused, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir, output_loading_info=True)
    hub, hub_info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(hub_layout_dir, output_loading_info=True)
    for loading in (info, hub_info):
        assert not loading["missing_keys"] and not loading["unexpected_keys"] and not loading["mismatched_keys"]
    fused_weights, hub_weights = fused.state_dict(), hub.state_dict()
    assert fused_weights.keys() == hub_weights.keys()
    for name, tensor in fused_weights.items():
        assert torch.equal(hub_weights[name], tensor), name

    fused_text, fused_audio = greedy_turn(dev_model_dir)
    hub_text, hub_audio = greedy_turn(hub_layout_dir)
    assert fused_text and fused_audio.size > 0
    assert hub_text == fused_text
    assert np.array_equal(hub_audio, fused_audio)
