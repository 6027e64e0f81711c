"""Qwen tokens counted without the engine's tokenizer: byte bounds within a limit, exact counts past it.

Whether tiktoken on the dashscope ranks matches Qwen's tokenizer is tests/pipeline/local/test_tokenizer.py's."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path

import numpy as np
import pytest

from pipeline import token_count
from pipeline.conversation import AssistantText, ConversationItem, UserAudio, UserText
from pipeline.token_bounds import ASSISTANT_MESSAGE_TOKENS, USER_MESSAGE_TOKENS, text_tokens_bound
from pipeline.token_count import (
    ANSWER_OPENING_TOKENS,
    MESSAGE_MARKERS,
    prompt_tokens_at_most,
    qwen_ranks_path,
    system_message_text,
    system_tokens_at_most,
    text_tokens,
    tokens_at_most,
)
from pipeline.tool_format import Tool, pieces_text, system_content, tool_json

GET_TIME = Tool(
    name="get_time",
    description="The current local time in a timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)
CHINESE = "请用简短的句子回答。"  # 10 characters, 30 UTF-8 bytes, far fewer tokens


@pytest.fixture
def no_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any exact count fails the test: what is asked must be answered from the byte bound."""

    def refuse(text: str) -> int:
        raise AssertionError(f"counted {text!r} with the tokenizer")

    monkeypatch.setattr(token_count, "text_tokens", refuse)


def test_text_within_the_limit_by_its_bytes_is_its_byte_bound(no_tokenizer: None):
    assert tokens_at_most("Hello world", 100) == 11


def test_text_whose_bytes_are_exactly_the_limit_is_its_byte_bound(no_tokenizer: None):
    assert tokens_at_most(CHINESE, 30) == 30


def test_text_past_the_limit_by_its_bytes_is_counted_exactly():
    assert tokens_at_most("Hello world", 10) == 2  # [9707, 1879]


def test_an_exact_count_is_never_more_than_the_byte_bound():
    counted = tokens_at_most(CHINESE, 29)
    assert counted == text_tokens(CHINESE) <= text_tokens_bound(CHINESE)
    assert counted < 29


def test_the_system_message_without_tools_is_its_role_line_and_instructions():
    assert system_message_text("Be brief.", ()) == "system\nBe brief.\n"


def test_the_system_message_with_tools_ends_with_the_tool_block():
    text = system_message_text("Be brief.", [GET_TIME])
    assert text == f"system\n{pieces_text(system_content('Be brief.', (GET_TIME,)))}\n"
    assert text.startswith("system\nBe brief.\n\n# Tools\n")
    assert tool_json(GET_TIME) in text
    assert text.endswith("</tool_call>\n")


def test_the_system_tokens_add_the_two_message_markers_to_the_bound(no_tokenizer: None):
    text = system_message_text("Be brief.", ())
    assert system_tokens_at_most("Be brief.", (), 1_000) == len(text) + 2 == len(text) + MESSAGE_MARKERS


def test_the_markers_count_against_the_limit_before_the_text_is_counted():
    text = system_message_text("Be brief.", ())  # 17 bytes
    assert system_tokens_at_most("Be brief.", (), len(text) + 2) == len(text) + 2  # the bound fits
    assert system_tokens_at_most("Be brief.", (), len(text) + 1) == text_tokens(text) + 2  # counted


def test_the_system_tokens_count_the_tools_exactly_past_the_limit():
    text = system_message_text("Be brief.", (GET_TIME,))
    assert system_tokens_at_most("Be brief.", (GET_TIME,), 100) == text_tokens(text) + 2
    assert text_tokens(text) + 2 < len(text)


def test_a_prompt_within_the_limit_is_its_bound_with_no_exact_count(no_tokenizer: None):
    items: list[ConversationItem] = [UserText("Hi"), AssistantText("Hello!")]
    expected = (USER_MESSAGE_TOKENS + 2) + (ASSISTANT_MESSAGE_TOKENS + 6) + ANSWER_OPENING_TOKENS
    assert prompt_tokens_at_most(None, items, 1_000) == expected


def test_a_prompts_system_message_adds_its_markers_and_bytes(no_tokenizer: None):
    without = prompt_tokens_at_most(None, [UserText("Hi")], 1_000)
    assert prompt_tokens_at_most("Be brief.", [UserText("Hi")], 1_000) == without + 2 + len("system\nBe brief.\n")


def test_a_prompt_past_the_limit_counts_its_system_and_text_exactly():
    system = system_message_text("Be brief.", ())
    items: list[ConversationItem] = [UserText(CHINESE), AssistantText("Hello world")]
    expected = (
        MESSAGE_MARKERS + text_tokens(system)
        + USER_MESSAGE_TOKENS + text_tokens(CHINESE)
        + ASSISTANT_MESSAGE_TOKENS + 2
        + ANSWER_OPENING_TOKENS
    )
    bound = prompt_tokens_at_most("Be brief.", items, 1_000)
    assert prompt_tokens_at_most("Be brief.", items, bound - 1) == expected < bound


def test_a_prompts_audio_is_the_same_counted_or_bounded():
    audio = UserAudio(np.zeros(16_000, dtype=np.float32))  # 1 s: exact in both
    bound = prompt_tokens_at_most(None, [audio, UserText(CHINESE)], 10_000)
    counted = prompt_tokens_at_most(None, [audio, UserText(CHINESE)], bound - 1)
    assert bound - counted == text_tokens_bound(CHINESE) - text_tokens(CHINESE)


def test_the_ranks_are_found_inside_the_installed_dashscope_package():
    path = qwen_ranks_path()
    assert path.name == "qwen.tiktoken" and path.parent.name == "resources"
    assert path.is_file()


def test_the_ranks_path_names_dashscope_when_it_is_not_installed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ModuleNotFoundError, match="dashscope"):
        qwen_ranks_path()


def test_the_ranks_path_names_dashscope_when_it_is_a_module_not_a_package(monkeypatch: pytest.MonkeyPatch):
    spec = ModuleSpec("dashscope", loader=None, origin=str(Path("dashscope.py")))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: spec)
    with pytest.raises(ModuleNotFoundError, match="dashscope"):
        qwen_ranks_path()
