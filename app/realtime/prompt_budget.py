"""The session's budget for its system message: instructions and tools, in Qwen tokens.

The history is bounded (``HistoryLimits.max_prompt_tokens``), but the system message came before
it unbounded: one ``session.update`` of ~241 KB (under the 256 KiB event limit) with 16 tool
descriptions of punctuation rendered to 190,035 tokens, and every response prefilled them again
(issue 34). A session's instructions and tools together may hold ``max_instructions_tokens``
(``--instructions-max-tokens``, 16,000 by default); past it ``session.update`` (or an offer's or a
client secret's session, or ``response.create``'s own instructions and tools) is refused with
``invalid_value`` naming the budget, and nothing changes.

Counted as the prompt has them (``pipeline.token_count``): the system message with the tool
block, its tools counted whatever ``tool_choice`` says (a later ``response.create`` may offer
them). Text within the budget by its UTF-8 bytes needs no counting; text past it is counted
exactly, with Qwen's BPE, in a worker thread (tens of milliseconds for the largest event).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from app.realtime.protocol import ProtocolError
from app.realtime.session_config import SessionConfig
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT
from pipeline.token_bounds import text_tokens_bound
from pipeline.token_count import MESSAGE_MARKERS, system_message_text, system_tokens_at_most
from pipeline.tool_format import Tool


async def check_system_budget(instructions: str | None, tools: Sequence[Tool], *, budget: int, param: str) -> None:
    """``ProtocolError`` ``invalid_value`` naming ``param`` when the system message of
    ``instructions`` (None: Qwen's default prompt) and ``tools`` is over ``budget`` tokens.
    Returns without suspending when its bytes are within the budget."""
    system_prompt = DEFAULT_SYSTEM_PROMPT if instructions is None else instructions
    if MESSAGE_MARKERS + text_tokens_bound(system_message_text(system_prompt, tools)) <= budget:
        return
    tokens = await asyncio.to_thread(system_tokens_at_most, system_prompt, tools, budget)
    if tokens > budget:
        raise ProtocolError(
            "invalid_value",
            f"The instructions and tools are {tokens:,} tokens; a session's budget for them is {budget:,} tokens.",
            param=param,
        )


async def check_session(config: SessionConfig, *, since: SessionConfig | None = None, param: str = "session") -> None:
    """``config``'s instructions and tools within its budget (not counted again when they are
    ``since``'s, already checked). ``param``: the session object's name in the error."""
    if since is not None and (since.instructions, since.tools) == (config.instructions, config.tools):
        return
    await check_system_budget(config.instructions, config.tools, budget=config.max_instructions_tokens, param=param)


def session_param(session: Mapping[str, Any], prefix: str = "session") -> str:
    """The field an over-budget session object is refused for: its tools when it gives them."""
    return f"{prefix}.tools" if "tools" in session else f"{prefix}.instructions"
