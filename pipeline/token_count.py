"""Qwen tokens counted where Qwen's tokenizer is never loaded: the session's budget for its system
message (instructions and tools) and the vLLM-Omni client's prompt limit.

The session's processes (the front, the media workers) do not load the engine's tokenizer:
transformers pulls in torch (~6 s and ~500 MB on the dev box). tiktoken on the same 151,643 BPE
ranks (``dashscope``'s ``qwen.tiktoken``) with the pre-tokenizer pattern of Qwen's
``tokenizer.json`` gives the same ids for text (tests/pipeline/local/test_tokenizer.py) and loads in
~0.8 s and ~60 MB: once per process, on the first text counted exactly, in whichever worker
thread counts it.

Counting is two-step: a text's UTF-8 bytes bound its tokens (the BPE is byte-level,
``pipeline.token_bounds.text_tokens_bound``), so text whose bound is within a limit needs no
tokenizer; only text past it is counted exactly (:func:`tokens_at_most`), ~85 ms for 240 KB of
punctuation, Qwen's worst case. Where the prompt holds one of Qwen's tool tokens the count is
that token's text (2-5 tokens for one): an over-count of a few tokens per message with tools.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.conversation import AssistantText, ConversationItem, UserText
from pipeline.token_bounds import ASSISTANT_MESSAGE_TOKENS, USER_MESSAGE_TOKENS, text_tokens_bound
from pipeline.tool_format import Tool, pieces_text, system_content

if TYPE_CHECKING:
    import tiktoken

    from pipeline.contract import EngineErrorCode

# The pre-tokenizer of Qwen2/3's tokenizer.json (and dashscope's QwenTokenizer).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# The longest prompt an engine takes by default: a session's instructions and tools (16,000) and
# its history (16,000) with room to spare, half the Thinker's 65,536 positions, so that an answer
# of max_output_tokens (4,096 at most) always fits after it.
DEFAULT_MAX_PROMPT_TOKENS = 32_768
# <|im_start|> and <|im_end|> around a message; its role line and the newline after it are text.
MESSAGE_MARKERS = 2
# The end of every prompt: <|im_start|>assistant\n (3 tokens) and a forced call's opening
# (<tool_call>\n{"name": "<64 characters>", "arguments": at most ~30): what a prompt holds
# beyond its system message and its history.
ANSWER_OPENING_TOKENS = 64

_encoding: tiktoken.Encoding | None = None
_loading = threading.Lock()


class PromptTooLong(ValueError):
    """A turn's prompt is longer than the engine takes; the turn fails alone, before it is decoded."""

    code: EngineErrorCode = "prompt_too_long"


def qwen_ranks_path() -> Path:
    """The real Qwen BPE ranks, as shipped inside the ``dashscope`` wheel. Found without importing
    ``dashscope`` (its client pulls aiohttp, requests and more): the device kit carries only the
    wheel, not its dependencies."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the dashscope package (it ships qwen.tiktoken, the Qwen BPE ranks) is not installed")
    return Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"


def qwen_encoding() -> tiktoken.Encoding:
    """tiktoken on Qwen's ranks and pattern, loaded once per process (blocking, ~0.8 s the first time)."""
    global _encoding
    with _loading:
        if _encoding is None:
            import tiktoken
            from tiktoken.load import load_tiktoken_bpe

            ranks = load_tiktoken_bpe(str(qwen_ranks_path()))
            _encoding = tiktoken.Encoding("qwen", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
        return _encoding


def text_tokens(text: str) -> int:
    """Qwen's tokens for ``text`` as plain text (special and tool tokens in it are text). Blocking:
    loads the ranks the first time, and costs ~0.35 µs a byte."""
    return len(qwen_encoding().encode_ordinary(text))


def tokens_at_most(text: str, limit: int) -> int:
    """``text``'s tokens, or its byte bound when that is within ``limit`` (no tokenizer needed).
    Within ``limit`` whenever the exact count is. Blocking when counted."""
    bound = text_tokens_bound(text)
    return bound if bound <= limit else text_tokens(text)


def system_message_text(instructions: str, tools: Sequence[Tool]) -> str:
    """The system message as the prompt writes it (role line, instructions, the tool block, the
    newline after it), without its two special tokens."""
    content = pieces_text(system_content(instructions, tuple(tools))) if tools else instructions
    return f"system\n{content}\n"


def system_tokens_at_most(instructions: str, tools: Sequence[Tool], limit: int) -> int:
    """The system message's tokens (its tools counted whatever ``tool_choice`` says), or a bound
    within ``limit``; blocking when counted."""
    return MESSAGE_MARKERS + tokens_at_most(system_message_text(instructions, tools), limit - MESSAGE_MARKERS)


def prompt_tokens_at_most(
    system_prompt: str | None, items: Sequence[ConversationItem], limit: int, tools: Sequence[Tool] = ()
) -> int:
    """A prompt's tokens (its system message with the tool block of ``tools``, ``items`` as they
    are rendered, the answer's opening), or a bound within ``limit``. Audio and images are exact,
    text is counted only when the bound passes ``limit``. Blocking when counted."""
    system = 0 if system_prompt is None else MESSAGE_MARKERS + text_tokens_bound(system_message_text(system_prompt, tools))
    bound = system + sum(item.prompt_tokens() for item in items) + ANSWER_OPENING_TOKENS
    if bound <= limit:
        return bound
    system = 0 if system_prompt is None else MESSAGE_MARKERS + text_tokens(system_message_text(system_prompt, tools))
    return system + sum(_item_tokens(item) for item in items) + ANSWER_OPENING_TOKENS


def _item_tokens(item: ConversationItem) -> int:
    if isinstance(item, UserText):
        return USER_MESSAGE_TOKENS + text_tokens(item.text)
    if isinstance(item, AssistantText):
        return ASSISTANT_MESSAGE_TOKENS + text_tokens(item.text)
    return item.prompt_tokens()  # audio and images: exact already

