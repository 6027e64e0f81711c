"""Qwen3-Omni-30B-A3B-Instruct's configuration, value by value, for models built without its weights.

Source: the checkpoint's ``config.json`` (huggingface.co/Qwen/Qwen3-Omni-30B-A3B-Instruct; the
file whose sha256 begins ``eab5093d``), as transformers 5 loads it. It cannot be downloaded
here; the values below were transcribed from public copies of it (a transformers 5.7 dump of
the loaded config, and independent copies of its ``talker_config`` and ``code2wav_config``),
which agree value by value; transformers' own ``Qwen3OmniMoeCode2WavConfig`` defaults equal the
``code2wav_config``. Keys that transformers' classes do not read (``codebook_dim``,
``num_semantic_quantizers``, ``semantic_codebook_size``, ``vector_quantization_hidden_dimension``
in ``code2wav_config``) are left out. docs/MODEL.md says what each stage's size costs.

The speed of a decoding step does not depend on the weights' values, so a model built from
this configuration with random weights measures what the real one costs (``scripts/gpu_check.py
--size full``); and Code2Wav's streaming exactness depends only on its layout, which these
values fix (``tests/pipeline/local/test_code2wav.py``).
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeCode2WavConfig,
    Qwen3OmniMoeVisionEncoderConfig,
)

# Multimodal RoPE of the Thinker and the Talker: 64 rotary frequencies split over
# (time, height, width), interleaved.
_MROPE = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [24, 20, 20], "interleaved": True}

CODE2WAV: dict[str, Any] = {
    "codebook_size": 2048,
    "num_quantizers": 16,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "attention_bias": False,
    "hidden_act": "silu",
    "sliding_window": 72,
    "max_position_embeddings": 8000,
    "rms_norm_eps": 1e-5,
    "layer_scale_initial_scale": 0.01,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
    # 8 * 5 * 4 * 3 * 2 * 2 = 1920 samples per codec frame: 80 ms at 24 kHz.
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 1536,
}

_AUDIO_ENCODER: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 32,
    "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "d_model": 1280,
    "activation_function": "gelu",
    "scale_embedding": False,
    "max_source_positions": 1500,
    "n_window": 50,
    "n_window_infer": 800,
    "conv_chunksize": 500,
    "downsample_hidden_size": 480,
    "output_dim": 2048,
}

_VISION_ENCODER: dict[str, Any] = {
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 2048,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}

_THINKER_TEXT: dict[str, Any] = {
    "vocab_size": 152_064,
    "hidden_size": 2048,
    "intermediate_size": 768,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 65_536,
    "router_aux_loss_coef": 0.001,
    "tie_word_embeddings": False,
    "rope_parameters": dict(_MROPE),
}

_TALKER_TEXT: dict[str, Any] = {
    "vocab_size": 3072,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 384,
    "shared_expert_intermediate_size": 768,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 6,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 65_536,
    "router_aux_loss_coef": 0.001,
    "rope_parameters": dict(_MROPE),
}

_CODE_PREDICTOR: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_code_groups": 16,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32_768,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}

SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}


def thinker_ids() -> dict[str, Any]:
    """The Thinker's prompt token ids and audio timing, the same in every Qwen3-Omni checkpoint
    (the dev model's config takes them too)."""
    return {
        "audio_token_id": 151675,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "user_token_id": 872,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
    }


def turn_ids() -> dict[str, Any]:
    """The chat turn's and the Talker's text markers (``<|im_start|>``, ``<tts_pad>``...), the same
    in every Qwen3-Omni checkpoint (the dev model's config takes them too)."""
    return {
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "system_token_id": 8948,
        "user_token_id": 872,
        "assistant_token_id": 77091,
    }


def talker_ids() -> dict[str, Any]:
    """The Talker's codec, speaker and prompt token ids, the same in every Qwen3-Omni checkpoint
    (the dev model's config takes them too)."""
    return {
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": dict(SPEAKERS),
        "audio_token_id": 151675,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "spatial_merge_size": 2,
        "position_id_per_seconds": 13,
    }


def instruct_config() -> Qwen3OmniMoeConfig:
    """Qwen3-Omni-30B-A3B-Instruct's configuration (Thinker, Talker, Code2Wav)."""
    thinker = {
        "audio_config": dict(_AUDIO_ENCODER),
        "vision_config": dict(_VISION_ENCODER),
        "text_config": dict(_THINKER_TEXT),
        **thinker_ids(),
        "tie_word_embeddings": False,
    }
    talker = {
        "text_config": dict(_TALKER_TEXT),
        "code_predictor_config": dict(_CODE_PREDICTOR),
        "num_code_groups": 16,
        "thinker_hidden_size": 2048,
        # The Thinker layer whose hidden states the Talker reads for the user's audio and images.
        "accept_hidden_layer": 24,
        **talker_ids(),
        "seconds_per_chunk": 2,
        "tie_word_embeddings": False,
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=dict(CODE2WAV),
        enable_audio_output=True,
        **turn_ids(),
    )


def code2wav_config(**overrides: Any) -> Qwen3OmniMoeCode2WavConfig:
    """The real ``code2wav_config``, with ``overrides`` (tests narrow its widths, never its layout)."""
    return Qwen3OmniMoeCode2WavConfig(**(CODE2WAV | overrides))


def vision_encoder_config() -> Qwen3OmniMoeVisionEncoderConfig:
    """The real ``thinker_config.vision_config`` (the vision bench builds the tower alone)."""
    return Qwen3OmniMoeVisionEncoderConfig(**_VISION_ENCODER)
