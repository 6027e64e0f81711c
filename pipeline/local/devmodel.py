"""A tiny, randomly initialised Qwen3-Omni checkpoint with the real architecture, ids and files.

Real weights need a GPU and cannot be downloaded here, so development, tests and CI run on
this: the real ``Qwen3OmniMoeForConditionalGeneration`` class (thinker with audio encoder,
talker with code predictor, code2wav), the real special-token and codec ids, the real
tokenizer, a Whisper feature extractor and the ChatML template, all loaded through
``from_pretrained(dir)`` exactly like a real checkpoint. Only the widths and depths are tiny
(``depth="real"``: the real layer and expert counts at the same tiny widths); its words and
sounds are noise.

Two on-disk layouts (docs/MODEL.md): "fused", transformers 5's own (experts fused, loaded as
is), and "hub", the published Qwen/Qwen3-Omni-30B-A3B-Instruct layout (safetensors shards and
``model.safetensors.index.json``, the original module names, every MoE expert stored one by
one), which only loads through transformers' conversion on load, as real weights do. How it is made to
end its turns and be heard: docs/MODEL.md, "The dev model".
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from safetensors.torch import save_file
from transformers import (
    GenerationConfig,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeTalkerConfig,
    WhisperFeatureExtractor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoderConfig,
    Qwen3OmniMoeCode2WavConfig,
    Qwen3OmniMoeTalkerCodePredictorConfig,
    Qwen3OmniMoeTalkerTextConfig,
    Qwen3OmniMoeTextConfig,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeVisionEncoderConfig,
)

from pipeline.local.qwen3_omni_config import instruct_config, talker_ids, thinker_ids, turn_ids
from pipeline.local.tokenizer import build_tokenizer

logger = logging.getLogger(__name__)

DEV_MODEL_DIRNAME = "dev-model"

# Bumped whenever what build_dev_model writes changes, so that ensure_dev_model replaces older
# cached builds (version 1 left the Talker's experts uninitialised; version 2 spoke at ~1e-8 of
# full scale, digital silence once sent as 16-bit PCM; version 3 calibrated with a gain that
# depended on thread count; version 4 stored transformers' reverse-converted names in one file,
# now the explicit "fused" layout; version 5 had no image processor config).
DEV_MODEL_VERSION = "7"
# Written last by build_dev_model; ensure_dev_model renames only finished builds into place.
VERSION_FILE = "omni-rtc-dev-model-version"

Layout = Literal["fused", "hub"]
LAYOUTS: tuple[Layout, ...] = ("fused", "hub")
# The published checkpoint has 15 shards of ~4.7 GB; four shards of the ~52 MB dev model are
# enough to make the index file matter (a tensor found in the wrong shard fails the load).
HUB_LAYOUT_SHARDS = 4
# Runtime module paths (transformers 5) -> the published checkpoint's names, first match wins.
_HUB_PREFIXES = (
    ("thinker.model.language_model.", "thinker.model."),
    ("thinker.model.audio_tower.", "thinker.audio_tower."),
    ("thinker.model.visual.", "thinker.visual."),
)
_FUSED_EXPERTS = re.compile(r"(?P<experts>.+\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)")

# Widths are tiny; vocabularies, codebooks, ids and upsampling are the real model's.
# With a 32-wide thinker the two 152,064-row matrices (embedding, lm_head) are ~39 MB of the
# ~52 MB of float32 weights.
_THINKER_HIDDEN = 32
_TALKER_HIDDEN = 32
_HEAD_DIM = 16
# Multimodal RoPE splits head_dim / 2 = 8 rotary frequencies over (time, height, width);
# the real model splits 64 as (24, 20, 20).
_MROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 2, 2], "interleaved": True}



Depth = Literal["tiny", "real"]
DEPTHS: tuple[Depth, ...] = ("tiny", "real")


@dataclass(frozen=True)
class StageDepths:
    """How deep each stage is and how many experts its MoE layers route among."""

    thinker_layers: int
    thinker_experts: int
    thinker_experts_per_token: int
    # The Thinker layer whose hidden states the Talker reads for the user's audio and images.
    accept_hidden_layer: int
    talker_layers: int
    talker_experts: int
    talker_experts_per_token: int
    code_predictor_layers: int
    code2wav_layers: int
    audio_encoder_layers: int
    vision_depth: int
    deepstack_visual_indexes: tuple[int, ...]


# "tiny": every stage one or two layers deep, four experts (the dev model of every test).
# The real model feeds layer 24 of 48 to the Talker: the middle, as here (1 of 2).
TINY_DEPTHS = StageDepths(
    thinker_layers=2,
    thinker_experts=4,
    thinker_experts_per_token=2,
    accept_hidden_layer=1,
    talker_layers=2,
    talker_experts=4,
    talker_experts_per_token=2,
    code_predictor_layers=1,
    code2wav_layers=1,
    audio_encoder_layers=1,
    vision_depth=1,
    deepstack_visual_indexes=(0,),
)


def real_depths() -> StageDepths:
    """Qwen3-Omni-30B-A3B-Instruct's depths and expert counts (``qwen3_omni_config``: Thinker 48
    layers of 128 experts, 8 per token; Talker 20 of 128, 6 per token; code predictor 5; Code2Wav 8;
    audio encoder 32; vision tower 27 blocks)."""
    config = instruct_config()
    thinker = cast(Qwen3OmniMoeThinkerConfig, config.thinker_config)
    thinker_text = cast(Qwen3OmniMoeTextConfig, thinker.text_config)
    audio = cast(Qwen3OmniMoeAudioEncoderConfig, thinker.audio_config)
    vision = cast(Qwen3OmniMoeVisionEncoderConfig, thinker.vision_config)
    talker = cast(Qwen3OmniMoeTalkerConfig, config.talker_config)
    talker_text = cast(Qwen3OmniMoeTalkerTextConfig, talker.text_config)
    predictor = cast(Qwen3OmniMoeTalkerCodePredictorConfig, talker.code_predictor_config)
    code2wav = cast(Qwen3OmniMoeCode2WavConfig, config.code2wav_config)
    return StageDepths(
        thinker_layers=thinker_text.num_hidden_layers,
        thinker_experts=thinker_text.num_experts,
        thinker_experts_per_token=thinker_text.num_experts_per_tok,
        accept_hidden_layer=talker.accept_hidden_layer,
        talker_layers=talker_text.num_hidden_layers,
        talker_experts=talker_text.num_experts,
        talker_experts_per_token=talker_text.num_experts_per_tok,
        code_predictor_layers=predictor.num_hidden_layers,
        code2wav_layers=code2wav.num_hidden_layers,
        audio_encoder_layers=audio.encoder_layers,
        vision_depth=vision.depth,
        deepstack_visual_indexes=tuple(vision.deepstack_visual_indexes),
    )


def stage_depths(depth: Depth) -> StageDepths:
    if depth not in DEPTHS:
        raise ValueError(f"unknown depth {depth!r}; expected one of {', '.join(DEPTHS)}")
    return TINY_DEPTHS if depth == "tiny" else real_depths()


def _moe_text_config(
    vocab_size: int, hidden_size: int, *, layers: int, experts: int, experts_per_token: int, **shared_expert: int
) -> dict[str, Any]:
    """The Thinker's and the Talker's text model alike: the same small MoE decoder under each one's
    vocabulary, width and depth (``shared_expert``: the Talker's shared expert)."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 64,
        "moe_intermediate_size": 32,
        **shared_expert,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": _HEAD_DIM,
        "num_experts": experts,
        "num_experts_per_tok": experts_per_token,
        "max_position_embeddings": 65_536,
        "rope_parameters": dict(_MROPE),
    }


def dev_model_config(depth: Depth = "tiny") -> Qwen3OmniMoeConfig:
    """The real Qwen3-Omni-30B-A3B-Instruct config with every width shrunk, and every depth too
    unless ``depth`` is "real" (the real layer and expert counts at the tiny widths)."""
    depths = stage_depths(depth)
    audio_config = {
        "num_mel_bins": 128,
        "encoder_layers": depths.audio_encoder_layers,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": 32,
        "downsample_hidden_size": 8,
        "output_dim": _THINKER_HIDDEN,
        "n_window": 50,
        "n_window_infer": 800,
        "conv_chunksize": 500,
        "max_source_positions": 1500,
    }
    vision_config = {
        "depth": depths.vision_depth,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "out_hidden_size": _THINKER_HIDDEN,
        "deepstack_visual_indexes": list(depths.deepstack_visual_indexes),
        "num_position_embeddings": 64,
    }
    thinker_text_config = _moe_text_config(
        vocab_size=152_064,
        hidden_size=_THINKER_HIDDEN,
        layers=depths.thinker_layers,
        experts=depths.thinker_experts,
        experts_per_token=depths.thinker_experts_per_token,
    )
    thinker_config = {
        "audio_config": audio_config,
        "vision_config": vision_config,
        "text_config": thinker_text_config,
        **thinker_ids(),
    }
    talker_text_config = _moe_text_config(
        vocab_size=3072,
        hidden_size=_TALKER_HIDDEN,
        layers=depths.talker_layers,
        experts=depths.talker_experts,
        experts_per_token=depths.talker_experts_per_token,
        shared_expert_intermediate_size=32,
    )
    code_predictor_config = {
        "vocab_size": 2048,
        "hidden_size": _TALKER_HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": depths.code_predictor_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": _HEAD_DIM,
        "num_code_groups": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    }
    talker_config = {
        "text_config": talker_text_config,
        "code_predictor_config": code_predictor_config,
        "num_code_groups": 16,
        "thinker_hidden_size": _THINKER_HIDDEN,
        "accept_hidden_layer": depths.accept_hidden_layer,
        **talker_ids(),
    }
    code2wav_config = {
        "codebook_size": 2048,
        "num_quantizers": 16,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": depths.code2wav_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "sliding_window": 72,
        # 8 * 5 * 4 * 3 * 2 * 2 = 1920 samples per codec frame: 80 ms at 24 kHz, as in the real model.
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        # Halved by each of the four decoder blocks: 32 -> 2 channels before the output conv.
        "decoder_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker_config,
        talker_config=talker_config,
        code2wav_config=code2wav_config,
        enable_audio_output=True,
        **turn_ids(),
    )


def dev_generation_config() -> GenerationConfig:
    """Thinker sampling as Qwen recommends for Instruct, talker sampling as ``generate()`` defaults."""
    return GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        repetition_penalty=1.05,
        eos_token_id=[151645, 151643],
        pad_token_id=151643,
        talker_do_sample=True,
        talker_temperature=0.9,
        talker_top_k=50,
        talker_top_p=1.0,
        talker_repetition_penalty=1.05,
    )


def dev_feature_extractor() -> WhisperFeatureExtractor:
    """Whisper-style log-mel features as Qwen3-Omni's audio encoder takes them: 128 bins at 16 kHz."""
    return WhisperFeatureExtractor(
        feature_size=128,
        sampling_rate=16_000,
        hop_length=160,
        chunk_length=300,
        n_fft=400,
        padding_value=0.0,
        return_attention_mask=True,
    )


# The image processor's part of the published checkpoint's preprocessor_config.json (the same
# file holds the Whisper feature extractor's settings): Qwen's image processor with Qwen3-VL's
# patching (16 px patches, 2x2 merged, 2 frames per temporal patch) and normalisation.
IMAGE_PROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 3_136,
    "max_pixels": 12_845_056,
    "processor_class": "Qwen3OmniMoeProcessor",
}


def dev_image_processor() -> Qwen2VLImageProcessorPil:
    """The image processor ``preprocessor_config.json`` describes, built without a checkpoint directory."""
    settings = {key: value for key, value in IMAGE_PROCESSOR_CONFIG.items()
                if key not in ("image_processor_type", "processor_class")}
    return Qwen2VLImageProcessorPil.from_dict(settings)


def write_preprocessor_config(out_dir: Path) -> None:
    """``preprocessor_config.json`` as the published checkpoint has it: one file that both the
    Whisper feature extractor and the image processor read their settings from."""
    dev_feature_extractor().save_pretrained(out_dir)
    path = out_dir / "preprocessor_config.json"
    merged = {**json.loads(path.read_text()), **IMAGE_PROCESSOR_CONFIG}
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")


def dev_model(*, seed: int = 0, depth: Depth = "tiny") -> Qwen3OmniMoeForConditionalGeneration:
    """The dev model's weights: random from ``seed``, wired to end its turns (same seed and depth,
    same weights)."""
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(dev_model_config(depth))
    initialise_talker_experts(model)
    _wire_turn_endings(model)
    _calibrate_loudness(model)
    model.generation_config = dev_generation_config()
    return model


@torch.no_grad()
def initialise_talker_experts(model: Qwen3OmniMoeForConditionalGeneration) -> None:
    """transformers 5.24's ``_init_weights`` covers the Thinker's MoE blocks but not the Talker's:
    its experts keep ``torch.empty`` memory (seen: 1e29, denormals, NaN logits) and its router zeros."""
    std = cast(Qwen3OmniMoeTalkerConfig, model.config.talker_config).initializer_range
    for layer in model.talker.model.layers:
        torch.nn.init.normal_(layer.mlp.experts.gate_up_proj, mean=0.0, std=std)
        torch.nn.init.normal_(layer.mlp.experts.down_proj, mean=0.0, std=std)
        torch.nn.init.normal_(layer.mlp.gate.weight, mean=0.0, std=std)


# Random weights never say <|im_end|> or codec EOS, so every turn would run to its caps (4096
# tokens, then minutes of speech). The dev model is wired to end like a trained one, through
# marker channels that no layer writes to (zeroed output rows), read by one lm_head/codec_head row:
# - the Thinker says <|im_end|> right after a token whose id is a multiple of 24 (a random
#   Thinker samples effectively random ids): answers of 24 tokens on average, at least 2, since
#   the prompt's last token "\n" (198) is not one;
# - the Talker says codec EOS only once its text input is <tts_text_eod> or <tts_pad>, i.e.
#   when the Thinker's text has been spoken (one codec frame per text token), and then with
#   probability ~0.1 per frame: ~10 frames (0.8 s) of trailing speech on average.
THINKER_STOP_EVERY = 24
_MARKER = 0  # the residual channel that carries a marker (thinker: stop token; talker: text done)
_TEXT_DONE = 1  # the Thinker embedding channel that tells the Talker's text projection "text done"
# The final RMSNorm scales a marker that dominates the residual to sqrt(32) ~ 5.7 (and the
# other channels to ~0). Thinker: 3 * 5.7 = 17 against random logits spread ~0.1, a certain
# stop. Talker: 0.27 * 5.7 = 1.55 against the ~0 logits of the other 49 of top_k=50 at its
# temperature 0.9 gives e^(1.55/0.9) / (e^(1.55/0.9) + 49) ~ 0.1.
_THINKER_STOP_LOGIT_WEIGHT = 3.0
_TALKER_STOP_LOGIT_WEIGHT = 0.27
# text_projection's hidden unit that turns the Thinker's text-done channel into the Talker
# marker: silu(8 * 1) ~ 8 when the text is done, silu(0) = 0 otherwise.
_TEXT_DONE_UNIT = 0
_TEXT_DONE_GAIN = 8.0


@torch.no_grad()
def _wire_turn_endings(model: Qwen3OmniMoeForConditionalGeneration) -> None:
    config = model.config
    thinker_text = model.thinker.model.language_model
    regular_ids = torch.arange(151_643)

    embeddings = thinker_text.embed_tokens.weight
    embeddings[:, _MARKER] = 0.0
    embeddings[regular_ids[regular_ids % THINKER_STOP_EVERY == 0], _MARKER] = 1.0
    embeddings[:, _TEXT_DONE] = 0.0
    embeddings[[config.tts_eos_token_id, config.tts_pad_token_id], _TEXT_DONE] = 1.0
    for layer in thinker_text.layers:
        _silence_channel(layer)
    lm_head = model.thinker.lm_head.weight
    lm_head[config.im_end_token_id] = 0.0
    lm_head[config.im_end_token_id, _MARKER] = _THINKER_STOP_LOGIT_WEIGHT

    talker = model.talker
    fc1, fc2 = talker.text_projection.linear_fc1, talker.text_projection.linear_fc2
    fc1.weight[_TEXT_DONE_UNIT] = 0.0
    fc1.weight[_TEXT_DONE_UNIT, _TEXT_DONE] = _TEXT_DONE_GAIN
    fc1.bias[_TEXT_DONE_UNIT] = 0.0
    fc2.weight[:, _TEXT_DONE_UNIT] = 0.0
    fc2.weight[_MARKER] = 0.0
    fc2.weight[_MARKER, _TEXT_DONE_UNIT] = 1.0
    fc2.bias[_MARKER] = 0.0
    talker.hidden_projection.linear_fc2.weight[_MARKER] = 0.0
    talker.hidden_projection.linear_fc2.bias[_MARKER] = 0.0
    talker.model.codec_embedding.weight[:, _MARKER] = 0.0
    for embedding in talker.code_predictor.model.codec_embedding:
        embedding.weight[:, _MARKER] = 0.0
    for layer in talker.model.layers:
        _silence_channel(layer)
        layer.mlp.shared_expert.down_proj.weight[_MARKER] = 0.0
    codec_head = talker.codec_head.weight
    codec_eos = cast(Qwen3OmniMoeTalkerConfig, config.talker_config).codec_eos_token_id
    codec_head[codec_eos] = 0.0
    codec_head[codec_eos, _MARKER] = _TALKER_STOP_LOGIT_WEIGHT


# Randomly initialised Code2Wav shrinks its signal through ~20 layers of std-0.02 weights to an
# RMS of ~1.4e-8: below one step of 16-bit PCM (3e-5), so WebRTC peers would hear exact silence.
# Its last layer is a convolution, so scaling its weights sets the output level: -20 dBFS RMS,
# the level of ordinary speech recordings, measured on 50 frames of seeded random codes.
_TARGET_RMS = 0.1
_CALIBRATION_FRAMES = 50


@torch.no_grad()
def _calibrate_loudness(model: Qwen3OmniMoeForConditionalGeneration) -> None:
    code2wav = model.code2wav
    config = code2wav.config
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(
        0, config.codebook_size, (1, config.num_quantizers, _CALIBRATION_FRAMES), generator=generator
    )
    rms = code2wav(codes).pow(2).mean().sqrt().item()
    # A power of two: scaling by it is exact in float32, so the weights do not depend on the last
    # bits of ``rms`` (which vary with the number of threads summing it). Lands within 3 dB of target.
    gain = 2.0 ** round(math.log2(_TARGET_RMS / rms))
    last = code2wav.decoder[-1].conv
    last.weight.mul_(gain)
    if last.bias is not None:
        last.bias.mul_(gain)


def _silence_channel(layer) -> None:
    """Keep a decoder layer from writing to the marker channel of the residual stream."""
    layer.self_attn.o_proj.weight[_MARKER] = 0.0
    layer.mlp.experts.down_proj[:, _MARKER] = 0.0


def hub_state_dict(model: Qwen3OmniMoeForConditionalGeneration) -> dict[str, torch.Tensor]:
    """The model's weights under the published checkpoint's names, one tensor per expert projection.

    A fused ``mlp.experts.gate_up_proj`` is ``[experts, 2 * intermediate, hidden]``: gate rows
    then up rows (transformers' ``qwen2_moe`` conversion concatenates them in that order);
    ``mlp.experts.down_proj`` is ``[experts, hidden, intermediate]``. Each expert's slice is a
    ``Linear`` weight, ``[out, in]``, as the hub stores it.
    """
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        for runtime, hub in _HUB_PREFIXES:
            if name.startswith(runtime):
                name = hub + name.removeprefix(runtime)
                break
        fused = _FUSED_EXPERTS.fullmatch(name)
        if fused is None:
            tensors[name] = tensor.detach().clone()
            continue
        experts = fused["experts"]
        for expert, weight in enumerate(tensor.detach()):
            if fused["kind"] == "gate_up_proj":
                gate, up = weight.chunk(2, dim=0)
                tensors[f"{experts}.{expert}.gate_proj.weight"] = gate.clone()
                tensors[f"{experts}.{expert}.up_proj.weight"] = up.clone()
            else:
                tensors[f"{experts}.{expert}.down_proj.weight"] = weight.clone()
    return tensors


def write_hub_layout(
    model: Qwen3OmniMoeForConditionalGeneration, out_dir: Path, *, shards: int = HUB_LAYOUT_SHARDS
) -> None:
    """Write the weights as the published checkpoint stores them: shards plus their index file."""
    tensors = hub_state_dict(model)
    sizes = {name: tensor.numel() * tensor.element_size() for name, tensor in tensors.items()}
    total = sum(sizes.values())
    # Consecutive tensors fill each shard up to an equal share of the total (the last takes the rest).
    groups: list[list[str]] = [[]]
    filled = 0
    for name in tensors:
        if groups[-1] and len(groups) < shards and filled + sizes[name] > total * len(groups) / shards:
            groups.append([])
        groups[-1].append(name)
        filled += sizes[name]
    weight_map = {}
    for index, names in enumerate(groups, start=1):
        filename = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: tensors[name] for name in names}, out_dir / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, filename))
    index_file = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=2) + "\n")
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)


def build_dev_model(
    out_dir: Path,
    *,
    seed: int = 0,
    layout: Layout = "fused",
    depth: Depth = "tiny",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write a complete dev checkpoint into ``out_dir`` (created if missing; its files are overwritten)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    stage_depths(depth)  # refuses an unknown depth before anything is written
    report = progress or logger.info
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    report("building the Qwen tokenizer from the dashscope BPE ranks")
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out_dir)

    report("writing the preprocessor config (Whisper features, Qwen's image processor)")
    write_preprocessor_config(out_dir)

    report(f"initialising a tiny-width Qwen3OmniMoeForConditionalGeneration of {depth} depth (seed {seed})")
    model = dev_model(seed=seed, depth=depth)
    parameters = sum(p.numel() for p in model.parameters())
    report(f"saving {parameters / 1e6:.1f} M parameters in the {layout} layout")
    if layout == "hub":
        write_hub_layout(model, out_dir)
    else:
        model.save_pretrained(out_dir, save_original_format=False)
    (out_dir / VERSION_FILE).write_text(DEV_MODEL_VERSION + "\n")
    return out_dir


def _is_current(model_dir: Path) -> bool:
    version_file = model_dir / VERSION_FILE
    return version_file.is_file() and version_file.read_text().strip() == DEV_MODEL_VERSION


def dev_model_dirname(layout: Layout = "fused", depth: Depth = "tiny") -> str:
    """``dev-model``, with ``-real-depth`` for the real depths and ``-hub`` for the hub layout."""
    return DEV_MODEL_DIRNAME + ("-real-depth" if depth == "real" else "") + ("" if layout == "fused" else f"-{layout}")


def ensure_dev_model(
    cache_dir: Path,
    *,
    layout: Layout = "fused",
    depth: Depth = "tiny",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """``cache_dir/dev-model`` (``dev_model_dirname``: another name for the hub layout or the real
    depths), built on first use (into a temp dir, then renamed), reused afterwards.

    A build from an older ``DEV_MODEL_VERSION`` is replaced.
    """
    stage_depths(depth)  # refuses an unknown depth
    report = progress or logger.info
    cache_dir = Path(cache_dir)
    dirname = dev_model_dirname(layout, depth)
    target = cache_dir / dirname
    if _is_current(target):
        report(f"using the dev model in {target}")
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Either depth: ~15 s on a 2-core box, mostly the tokenizer (docs/MODEL.md, "The dev model").
    report(f"building the dev model into {target} (once; about 15 s)")
    staging = Path(tempfile.mkdtemp(prefix=f".{dirname}-", dir=cache_dir))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the checkpoint from other users
    stale = cache_dir / f"{staging.name}-stale"
    try:
        build_dev_model(staging, layout=layout, depth=depth, progress=report)
        if target.exists() and not _is_current(target):
            report(f"replacing the outdated dev model in {target}")
            os.rename(target, stale)
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished first (rename onto a non-empty dir fails): use theirs.
            if not _is_current(target):
                raise
            report(f"another process built {target} first; using it")
    finally:
        for leftover in (staging, stale):
            if leftover.exists():
                shutil.rmtree(leftover)
    report(f"dev model ready in {target}")
    return target
