"""A session's share of the engine: the prompt tokens its work has the engine prefill and the
steps it has it decode, bounded in time.

Every engine generation a session causes is charged what its prompt costs to prefill (a bound
read off its conversation: audio and images exact, text by its bytes; ``prompt_estimate``):
answers, cancelled or not, speculative answers, input transcriptions and partial transcripts.
An answer is charged its decoded steps too (answer tokens and codec frames) when it ends.
The share is a token bucket of ``ENGINE_SHARE_BURST`` tokens refilled at
``ENGINE_SHARE_PER_SECOND``. Work someone waits for (a spoken turn's answer, a transcription) is
always run and charged, and may take the bucket below zero; a client's ``response.create`` is
refused past it (``engine_share_exceeded``), and throw-away work (speculation, partials) runs only
while the bucket holds its cost. docs/SESSION.md "The engine's share".
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from pipeline.contract import GenerationRequest
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, Conversation
from pipeline.token_count import prompt_tokens_at_most

# A spoken conversation re-prefills its history each turn: with the 16,000-token instructions budget
# and a long history, ~20,000 tokens every few seconds. A session looping response.create ->
# response.cancel on 15,500 tokens of instructions had 230 prefills in 35 s (~100,000 tokens a
# second) and another visitor's first words came 3.6 s late. Four of the largest prompts at once,
# then one every four seconds.
ENGINE_SHARE_BURST = 64_000
ENGINE_SHARE_PER_SECOND = 4_000


def prompt_estimate(conversation: Conversation) -> int:
    """What prefilling ``conversation`` costs, as a bound in prompt tokens; no tokenizer runs."""
    return prompt_tokens_at_most(conversation.system_prompt, conversation.items, limit=sys.maxsize)


def request_estimate(request: GenerationRequest) -> int:
    return prompt_estimate(request.conversation)


def answer_estimate(instructions: str | None, history_tokens: int) -> int:
    """An answer's prompt before its conversation is rendered: the system message (``None``: Qwen's
    spoken-chat prompt) and the history's own estimate of its items (``History.prompt_tokens``)."""
    system = DEFAULT_SYSTEM_PROMPT if instructions is None else instructions
    return prompt_tokens_at_most(system, (), limit=sys.maxsize) + history_tokens


class EngineShare:
    """One session's token bucket of prompt tokens."""

    def __init__(self, *, burst: int = ENGINE_SHARE_BURST, per_second: float = ENGINE_SHARE_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.per_second = per_second
        self._clock = clock
        self._tokens = float(burst)
        self._refilled_at = clock()
        self.charged = 0  # every token charged since the session began (metrics, tests)

    @property
    def available(self) -> float:
        self._refill()
        return self._tokens

    def charge(self, tokens: int) -> None:
        """Work that runs whatever the share: charged, the bucket may go below zero."""
        self._refill()
        self._tokens -= tokens
        self.charged += tokens

    def try_charge(self, tokens: int) -> bool:
        """Work that runs only within the share: charged and True while the bucket holds
        ``tokens`` (all of a full bucket at most, so a prompt larger than the burst may run once
        the bucket is full), else False and nothing charged."""
        self._refill()
        if self._tokens < min(tokens, self.burst):
            return False
        self.charge(tokens)
        return True

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled_at) * self.per_second)
        self._refilled_at = now
