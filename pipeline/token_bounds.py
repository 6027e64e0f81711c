"""Prompt tokens estimated without the tokenizer: what each conversation item adds to a prompt at most.

The session bounds its history by prompt tokens (``HistoryLimits.max_prompt_tokens``) on every
insert, in a process that has no tokenizer (loading Qwen's 151,643 ranks takes ~2 s and ~100 MB
per process). So each item says how many tokens it adds to a prompt at most (``prompt_tokens``),
from what ``pipeline.local.prompt.PromptRenderer`` renders for it:

- text: Qwen's BPE is byte-level, so every token stands for at least one UTF-8 byte and a
  text's bytes bound its tokens. A bound, not a guess: English and Chinese prose run ~4.7 bytes
  per real token (tests/pipeline/local/test_prompt.py checks both), so for ordinary text the
  estimate is ~4.7 times the real count (a 16,000-token budget holds ~3,400 real tokens of
  prose, ~2,500 English words) and for text built to cost the most (emoji, punctuation)
  ~1.7 times.
- audio: exact. Whisper features are one frame per 160 samples (10 ms at 16 kHz), and Qwen3-Omni's
  audio encoder turns each 100-frame window (``2 * n_window``, n_window = 50 in the published
  config) into 13 tokens and a shorter rest into ceil(ceil(ceil(rest / 2) / 2) / 2):
  transformers' ``_get_feat_extract_output_lengths`` (models/qwen3_omni_moe), which
  tests/pipeline/local/test_prompt.py compares with this one. 13 tokens per second of speech.
- each part is counted as a message of its own (``<|im_start|>``, the role line, ``<|im_end|>``,
  ``"\\n"``), although consecutive user parts share one: an over-count of a few tokens per part.
- images: exact, their ``<|image_pad|>`` count (``pipeline.images.image_tokens``) and the two
  ``<|vision_start|>``/``<|vision_end|>`` around it.

A new kind of part says its own ``prompt_tokens`` and ``held_bytes`` and is counted the same way.
"""

from __future__ import annotations

FEATURE_HOP = 160  # samples per Whisper feature frame at 16 kHz
AUDIO_N_WINDOW = 50  # Qwen3-Omni's audio_config.n_window: windows of 2 * 50 feature frames
AUDIO_TOKENS_PER_WINDOW = 13  # what one full window becomes (transformers hard-codes it too)
# <|im_start|>, the role line as text ("user\n": at most 5 tokens, "assistant\n": 10), <|im_end|>, "\n".
USER_MESSAGE_TOKENS = 1 + 5 + 1 + 1
ASSISTANT_MESSAGE_TOKENS = 1 + 10 + 1 + 1
AUDIO_MARKER_TOKENS = 2  # <|audio_start|> and <|audio_end|> around the pads
VISION_MARKER_TOKENS = 2  # <|vision_start|> and <|vision_end|> around an image's pads


def text_tokens_bound(text: str) -> int:
    """At most this many tokens: one per UTF-8 byte (``isascii`` is O(1) in CPython)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def audio_tokens(samples: int, n_window: int = AUDIO_N_WINDOW) -> int:
    """The audio encoder's output length for ``samples`` of 16 kHz audio: its ``<|audio_pad|>`` count."""
    frames = samples // FEATURE_HOP
    window = 2 * n_window
    rest = (frames % window - 1) // 2 + 1
    return ((rest - 1) // 2 + 1 - 1) // 2 + 1 + (frames // window) * AUDIO_TOKENS_PER_WINDOW
