"""What a session and its client draw on: each one's share of the engine (the prompt tokens their
work has the engine prefill and the steps it has it decode, bounded in time) and, in one registry
per process, each client's budgets (its engine share and its event rate).

Every engine generation a session causes is charged what its prompt costs to prefill (a bound
read off its conversation: audio and images exact, text by its bytes; ``prompt_estimate``):
answers, cancelled or not, speculative answers, input transcriptions and partial transcripts.
An answer is charged its decoded steps too (answer tokens and codec frames) when it ends.
The share is a token bucket of ``ENGINE_SHARE_BURST`` tokens refilled at
``ENGINE_SHARE_PER_SECOND``. Work someone waits for (a spoken turn's answer, a transcription) is
always run and charged, and may take the bucket below zero; a client's ``response.create`` is
refused past it (``engine_share_exceeded``), and throw-away work (speculation, partials) runs only
while the bucket holds its cost. A session whose client is held to a share (``ClientShares``: one
bucket per client in this process, across its sessions) is charged to both buckets, and refused
by either (``SessionShare``). ``ClientShares`` keeps each such client's event rate beside its
engine share (``ClientBudget``: the gate's bucket, ``app.realtime.gate``). docs/SESSION.md "The
engine's share".
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.realtime.gate import EventRate
from app.token_bucket import TokenBucket
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
# A client's share across its sessions (up to --max-sessions-per-client, 4): the same burst, and
# twice one session's rate. One person rarely keeps more than two sessions busy at once (a tab
# speaking, one more answering); four sessions at a session's rate each would give one address
# four visitors' share of the engine.
CLIENT_RATE_FACTOR = 2


@dataclass(frozen=True)
class ShareSize:
    """A bucket's size: ``burst`` prompt tokens at once, refilled at ``per_second``
    (``--engine-share-tokens``, ``--engine-share-tokens-per-second``: a session's)."""

    burst: int = ENGINE_SHARE_BURST
    per_second: float = ENGINE_SHARE_PER_SECOND

    def for_client(self) -> ShareSize:
        """A client's, across its sessions, when each of them has this size."""
        return ShareSize(self.burst, CLIENT_RATE_FACTOR * self.per_second)

ShareLimit = Literal["session", "client"]
# The work a share refuses: a client's response.create, and throw-away work.
RefusedWork = Literal["response", "speculative_response", "partial_transcript"]
# A refusal's report (metrics): which limit refused which work.
RefusalObserver = Callable[[ShareLimit, RefusedWork], None]


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
    """One bucket of prompt tokens (``app.token_bucket``): a session's, or a client's (``ClientShares``)."""

    def __init__(self, *, burst: int = ENGINE_SHARE_BURST, per_second: float = ENGINE_SHARE_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._bucket = TokenBucket(burst, per_second, clock=clock)
        self.burst = burst
        self.per_second = per_second
        self.charged = 0  # every token charged since the bucket was made (metrics, tests)

    @property
    def available(self) -> float:
        return self._bucket.tokens

    @property
    def full(self) -> bool:
        return self._bucket.full

    def charge(self, tokens: int) -> None:
        """Work that runs whatever the share: charged, the bucket may go below zero."""
        self._bucket.charge(tokens)
        self.charged += tokens

    def holds(self, tokens: int) -> bool:
        """The bucket holds ``tokens``, or all of a full bucket (so a prompt larger than the burst
        may run once the bucket is full)."""
        return self._bucket.holds(min(tokens, self.burst))


@dataclass(frozen=True)
class ShareRefusal:
    """Work a share did not run: the limit that refused it, and that limit's size."""

    limit: ShareLimit
    burst: int
    per_second: float


@dataclass(frozen=True)
class ClientBudget:
    """One client's buckets in this process, shared by its sessions: its share of the engine and
    its event rate."""

    engine: EngineShare
    events: TokenBucket

    @property
    def refilled(self) -> bool:
        return self.engine.full and self.events.full


class ClientShare:
    """One session's hold on its client's budget (``ClientShares.join``); ``leave`` at its close (safe twice)."""

    def __init__(self, shares: ClientShares, client: str, budget: ClientBudget) -> None:
        self.client = client
        self.budget = budget
        self._shares: ClientShares | None = shares

    def leave(self) -> None:
        shares, self._shares = self._shares, None
        if shares is not None:
            shares.left(self.client)


class ClientShares:
    """Every client's budget in this process, by client key (its address, as admission names it).

    A budget is kept while a session of its client is open, and after the last one closes until
    both its buckets have refilled (so a client that closes and reopens its sessions does not start
    afresh): the budgets are at most the open sessions' clients plus those that spent within the
    last ``burst / per_second`` seconds of either bucket (more for an engine share far below zero),
    each forgotten at the next ``join`` or ``left`` past that.
    """

    def __init__(self, size: ShareSize = ShareSize().for_client(), events: EventRate = EventRate().for_client(), *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``size``: each client's engine share (``ShareSize.for_client`` of its sessions');
        ``events``: each client's event rate (``EventRate.for_client`` of its sessions')."""
        self.burst = size.burst
        self.per_second = size.per_second
        self.events = events
        self._clock = clock
        self._budgets: dict[str, ClientBudget] = {}
        self._sessions: dict[str, int] = {}  # open sessions by client key

    def __len__(self) -> int:
        """Clients whose budget is kept."""
        return len(self._budgets)

    def join(self, client: str) -> ClientShare:
        """A session of ``client`` opens: its hold on the client's budget (a full one for a client not kept)."""
        self._forget_refilled()
        budget = self._budgets.get(client)
        if budget is None:
            budget = self._budgets[client] = ClientBudget(
                EngineShare(burst=self.burst, per_second=self.per_second, clock=self._clock),
                self.events.bucket(clock=self._clock),
            )
        self._sessions[client] = self._sessions.get(client, 0) + 1
        return ClientShare(self, client, budget)

    def left(self, client: str) -> None:
        """A session of ``client`` closed (``ClientShare.leave``)."""
        remaining = self._sessions.get(client, 0) - 1
        if remaining > 0:
            self._sessions[client] = remaining
        else:
            self._sessions.pop(client, None)
        self._forget_refilled()

    def _forget_refilled(self) -> None:
        for client, budget in list(self._budgets.items()):
            if client not in self._sessions and budget.refilled:
                del self._budgets[client]


class SessionShare:
    """What one session's work is charged to: its own bucket and, when its client is held to a
    share, its client's. Work that runs whatever the share (``charge``) is charged to both;
    work that runs only within it (``charge_within``) runs while both hold its cost."""

    def __init__(self, own: EngineShare, client: EngineShare | None = None, *,
                 on_refused: RefusalObserver | None = None) -> None:
        self._own = own
        self._client = client
        self._on_refused = on_refused

    @property
    def charged(self) -> int:
        """Every token charged to the session since it began (metrics)."""
        return self._own.charged

    def charge(self, tokens: int) -> None:
        """Work that runs whatever the share: charged to both buckets, which may go below zero."""
        self._own.charge(tokens)
        if self._client is not None:
            self._client.charge(tokens)

    def charge_within(self, tokens: int, work: RefusedWork) -> ShareRefusal | None:
        """Work that runs only within the share: charged to both and None while each bucket
        ``holds`` ``tokens``; else nothing is charged, and the refusal is reported and returned
        (the session's limit named first)."""
        refusal = _refusal(self._own, "session", tokens)
        if refusal is None and self._client is not None:
            refusal = _refusal(self._client, "client", tokens)
        if refusal is not None:
            if self._on_refused is not None:
                self._on_refused(refusal.limit, work)
            return refusal
        self.charge(tokens)
        return None


def _refusal(bucket: EngineShare, limit: ShareLimit, tokens: int) -> ShareRefusal | None:
    if bucket.holds(tokens):
        return None
    return ShareRefusal(limit, bucket.burst, bucket.per_second)
