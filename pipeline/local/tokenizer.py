"""Qwen's tokenizer: built offline from the real BPE ranks, loaded from any checkpoint directory.

Qwen2, Qwen2.5 and Qwen3(-Omni) share one byte-level BPE: 151,643 regular ranks (shipped by
the PyPI package ``dashscope`` as ``qwen.tiktoken``) followed by special tokens at fixed ids.
Built with the same normaliser, pre-tokenizer regex and decoder as the published
``tokenizer.json``, it produces the ids the real checkpoint was trained on.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import AddedToken
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import TikTokenConverter

from pipeline.token_count import qwen_ranks_path

logger = logging.getLogger(__name__)

REGULAR_VOCAB_SIZE = 151_643

# id -> (content, special). Qwen3 marks the tool/think/FIM markup as non-special so that it
# survives decode(skip_special_tokens=True); Qwen3-Omni adds the audio and TTS tokens 151669-151675.
SPECIAL_TOKENS: dict[int, tuple[str, bool]] = {
    151643: ("<|endoftext|>", True),
    151644: ("<|im_start|>", True),
    151645: ("<|im_end|>", True),
    151646: ("<|object_ref_start|>", True),
    151647: ("<|object_ref_end|>", True),
    151648: ("<|box_start|>", True),
    151649: ("<|box_end|>", True),
    151650: ("<|quad_start|>", True),
    151651: ("<|quad_end|>", True),
    151652: ("<|vision_start|>", True),
    151653: ("<|vision_end|>", True),
    151654: ("<|vision_pad|>", True),
    151655: ("<|image_pad|>", True),
    151656: ("<|video_pad|>", True),
    151657: ("<tool_call>", False),
    151658: ("</tool_call>", False),
    151659: ("<|fim_prefix|>", False),
    151660: ("<|fim_middle|>", False),
    151661: ("<|fim_suffix|>", False),
    151662: ("<|fim_pad|>", False),
    151663: ("<|repo_name|>", False),
    151664: ("<|file_sep|>", False),
    151665: ("<tool_response>", False),
    151666: ("</tool_response>", False),
    151667: ("<think>", False),
    151668: ("</think>", False),
    151669: ("<|audio_start|>", True),
    151670: ("<|audio_end|>", True),
    151671: ("<tts_pad>", True),
    151672: ("<tts_text_bos>", True),
    151673: ("<tts_text_eod>", True),
    151674: ("<tts_text_bos_single>", True),
    151675: ("<|audio_pad|>", True),
}

MULTIMODAL_TOKENS: dict[str, str | AddedToken] = {
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
    "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}

# ChatML as Qwen3-Omni renders it: string content, or a list of text/audio/image/video parts;
# no default system message is injected (the caller passes Qwen's speech system prompt).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'audio' %}{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer() -> Qwen2Tokenizer:
    """Qwen's tokenizer from the ``dashscope`` ranks plus the special tokens at their real ids."""
    ranks_path = qwen_ranks_path()
    logger.info("building the Qwen tokenizer from %s", ranks_path)
    vocab, merges = TikTokenConverter().extract_vocab_merges_from_model(str(ranks_path))
    if len(vocab) != REGULAR_VOCAB_SIZE:
        raise ValueError(f"{ranks_path} holds {len(vocab)} ranks, expected {REGULAR_VOCAB_SIZE}")
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        # Set below, once the special tokens exist at their ids: naming them here would add
        # them first, at 151643 and 151644. (transformers' annotations say str; None leaves them unset.)
        unk_token=None,  # type: ignore[arg-type]
        bos_token=None,
        eos_token=None,  # type: ignore[arg-type]
        pad_token=None,  # type: ignore[arg-type]
        errors="replace",
        model_max_length=131_072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    # Added in id order, so each lands at REGULAR_VOCAB_SIZE + its position.
    for token_id in sorted(SPECIAL_TOKENS):
        content, special = SPECIAL_TOKENS[token_id]
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tokenizer.add_special_tokens({"additional_special_tokens": [token]}, replace_extra_special_tokens=False)
        else:
            tokenizer.add_tokens([token])
        actual = tokenizer.convert_tokens_to_ids(content)
        if actual != token_id:
            raise ValueError(f"{content} got id {actual}, expected {token_id}")
    # The multimodal tokens by name: Qwen3OmniMoeProcessor reads them off the tokenizer
    # (image_token, audio_bos_token, ...), so the published tokenizer_config.json names them.
    # Named at construction they would be added first, at 151643-151649, as eos would; this is
    # what construction does with such names, once the tokens have their ids.
    tokenizer._set_model_specific_special_tokens(MULTIMODAL_TOKENS)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a checkpoint (a directory or a Hugging Face id)."""
    return AutoTokenizer.from_pretrained(str(model_dir))
