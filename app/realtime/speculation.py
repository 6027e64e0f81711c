"""Speculative answers: the turn starts at a candidate end of turn and is held until the commit.

At each candidate (the first quiet VAD window after confirmed speech, ``SilenceStarted``;
docs/SESSION.md "Speculative answers" says why that point and what it costs) the session says
which turn a commit *now* would start (``plan``): the audio so far as the user item, the
conversation as it stands, the session's response settings. The :class:`Speculator` starts it as
a preemptible engine turn (``pipeline.contract``) and holds everything it yields
(``app.realtime.held_generation``): no event of it reaches the client before the commit. Then:

- the commit comes while it runs (or after it ended by itself): the committed item takes the
  audio the answer was made from, and the response takes the held answer (``Speculation.use``):
  promoted to an ordinary engine turn, its events released at once, in the protocol's order, by
  the code that streams any committed turn (tool calls, half-duplex, barge-in and heard text alike);
- speech resumes first (``resumed``), the utterance is dropped, or the turn a commit would start
  changes (a conversation item, the session, the camera frames, ``input_audio_buffer.clear``, a
  client's ``response.create``: the session calls ``check`` after each): it is cancelled in the
  engine and forgotten. While the silence lasts, a changed turn is started again on the same audio;
- the engine has no spare capacity (``no_spare_capacity``) or takes its slot back for a committed
  turn (``preempted``): forgotten; the commit runs an ordinary turn, and no other speculation
  starts in that utterance. Any other engine failure is held like its events: the response that
  takes it fails as the committed turn would have.

Speculations start at most ``SPECULATION_BURST`` at once, then ``SPECULATIONS_PER_SECOND``,
whatever the utterances: speech that dips and resumes offers a candidate at every dip, and a
session that changes its turn on purpose (``session.update``, ``input_audio_buffer.clear``) would
otherwise start a prefill at each change.

The answer's input transcription (``audio.input.transcription``) is held too, started once the
held answer has its first audio (or ended), as a committed turn's transcription waits for the
answer's first audio; ``app.realtime.transcription`` takes it at the commit.

Each speculation is reported (``on_outcome``): ``started``, then one of ``used``, ``discarded``,
``refused`` or ``preempted`` with the engine seconds thrown away (from its start to its cancel or
end); a transcription thrown away reports its seconds alone (outcome None).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.realtime.held_generation import HeldGeneration
from app.realtime.protocol import new_id
from app.realtime.shares import SessionShare, request_estimate
from app.token_bucket import TokenBucket
from pipeline.contract import PREEMPTIBLE_ENDS, Engine, GenerationRequest
from pipeline.conversation import Conversation, ConversationItem, UserAudio, bound_history

logger = logging.getLogger(__name__)

# Speculative starts a session may make: 4 at once, then one every 2 s, counted in time, not per
# utterance. A speaker offers a candidate at each dip of an utterance (tests/bench/speculation.py:
# one or two an utterance on the turn-taking fixtures, an utterance every few seconds); each start
# is a prefill likely thrown away, and a session restarting its turn on purpose (session.update,
# input_audio_buffer.clear) took a prefill each time: 154 starts in 35 s, its neighbour's turns
# up to 9.3 s.
SPECULATION_BURST = 4
SPECULATIONS_PER_SECOND = 0.5

# (outcome, engine seconds thrown away): "started", "used", "discarded", "refused", "preempted";
# None: a held transcription thrown away (its seconds alone).
OutcomeObserver = Callable[[str | None, float], None]


@dataclass(frozen=True)
class SpeculativeAnswer:
    """What a commit now would start: the answer's request and, when the session transcribes, the
    user audio's transcription request (neither with a ``preemptible_id`` yet)."""

    answer: GenerationRequest
    transcription: GenerationRequest | None = None


# The fields of GenerationRequest that same_request does not compare by value: the conversation
# is compared as the prompt renders it (_same_prompt), and preemptible_id only names the held
# request (the wanted one has none yet). Every other field is a setting, compared by value, a new
# one included.
_COMPARED_APART = frozenset({"conversation", "preemptible_id"})
_SETTINGS = tuple(field.name for field in dataclasses.fields(GenerationRequest) if field.name not in _COMPARED_APART)


def same_request(held: GenerationRequest, wanted: GenerationRequest) -> bool:
    """``held`` asks the engine for what ``wanted`` asks: every setting equal and the same prompt
    (the conversation as the prompt renders it, ``bound_history``; audio compared by content)."""
    if any(getattr(held, name) != getattr(wanted, name) for name in _SETTINGS):
        return False
    return _same_prompt(held.conversation, wanted.conversation)


def _same_prompt(a: Conversation, b: Conversation) -> bool:
    if (a.instructions, a.limits, a.tools, a.tool_choice) != (b.instructions, b.limits, b.tools, b.tool_choice):
        return False
    items_a, items_b = bound_history(a), bound_history(b)
    return len(items_a) == len(items_b) and all(map(_same_item, items_a, items_b))


def _same_item(a: ConversationItem, b: ConversationItem) -> bool:
    if isinstance(a, UserAudio) and isinstance(b, UserAudio):  # rendered as audio: its transcript is unused
        return a.pcm is b.pcm or np.array_equal(a.pcm, b.pcm)
    return type(a) is type(b) and a == b


class Speculation:
    """One speculative answer (and its transcription) on one candidate's audio. It owns its held
    turns until it hands one on (``use``, ``take_transcription``); ``wait`` awaits the rest."""

    def __init__(self, engine: Engine, turn: SpeculativeAnswer, pcm: np.ndarray, *, session_id: str,
                 report: OutcomeObserver, on_failed: Callable[[Speculation], None]) -> None:
        self.id = new_id("spec")
        self.pcm = pcm  # the audio it answers: the committed item's, if it is used
        self.outcome: str | None = None
        self.transcription: HeldGeneration | None = None
        self._engine = engine
        self._session_id = session_id
        self._report = report
        self._on_failed = on_failed
        self._transcription_request = turn.transcription
        self._committed = False  # taken at the commit: no transcription starts any more
        self._owned: list[HeldGeneration] = []
        self.answer = self._hold(turn.answer, f"speculation {self.id}", answer=True)

    @property
    def request(self) -> GenerationRequest:
        return self.answer.request

    @property
    def stopped(self) -> bool:
        """Nothing it still owns runs."""
        return all(held.stopped for held in self._owned)

    def committed(self) -> None:
        """Its utterance was committed: its transcription is taken now, or the commit starts its own."""
        self._committed = True

    def cancel(self, outcome: str = "discarded") -> None:
        """Forgets it: its turns are cancelled in the engine (``wait`` awaits them)."""
        for held in self._owned:
            if held is self.transcription:
                self._report(None, held.engine_seconds())
            held.cancel()
        self.transcription = None
        self._finish(outcome)

    async def wait(self) -> None:
        """Until the turns it owns are gone (cancelling those still running)."""
        for held in self._owned:
            await held.close()

    async def use(self, wanted: GenerationRequest) -> HeldGeneration | None:
        """At the commit: the held answer, promoted, when it asks what ``wanted`` asks; else None,
        and the speculation is discarded. The caller owns the answer it gets."""
        if not same_request(self.answer.request, wanted):
            logger.info("session %s: speculation %s answered another turn than the one committed",
                        self._session_id, self.id)
            self.cancel()
            return None
        try:
            usable = await self.answer.promote()
        except BaseException:  # cancelled meanwhile (barge-in, close): nothing of it is used
            self.cancel()
            raise
        if not usable:
            self.cancel("preempted" if self.answer.engine_code == "preempted" else "discarded")
            return None
        self._owned.remove(self.answer)
        self._finish("used")
        return self.answer

    def take_transcription(self, wanted: GenerationRequest | None) -> HeldGeneration | None:
        """At the commit: the held transcription when it transcribes what ``wanted`` asks (the
        caller promotes and owns it); otherwise it is cancelled, and None."""
        held, self.transcription = self.transcription, None
        if held is None:
            return None
        if wanted is not None and held.error is None and same_request(held.request, wanted):
            self._owned.remove(held)
            return held
        self._report(None, held.engine_seconds())
        held.cancel()
        return None

    def _hold(self, request: GenerationRequest, name: str, *, answer: bool) -> HeldGeneration:
        held = HeldGeneration(self._engine, dataclasses.replace(request, preemptible_id=new_id("spec")), name=name,
                        on_output=self._start_transcription if answer else None,
                        on_end=self._answer_ended if answer else None)
        self._owned.append(held)
        return held

    def _start_transcription(self) -> None:
        """The held answer has its first output: its transcription may start (it must not delay it)."""
        request = self._transcription_request
        if request is not None and not self._committed and self.outcome is None and self.transcription is None:
            self.transcription = self._hold(request, f"speculation {self.id} transcription", answer=False)

    def _answer_ended(self, answer: HeldGeneration) -> None:
        """Refused or preempted: forgotten. Any other failure is held like the rest of the turn: the
        response that takes it fails as a committed turn would have."""
        code = answer.engine_code
        if code in PREEMPTIBLE_ENDS and self.outcome is None:
            self.cancel(code)
            self._on_failed(self)

    def _finish(self, outcome: str) -> None:
        if self.outcome is not None:
            return
        self.outcome = "refused" if outcome == "no_spare_capacity" else outcome
        thrown_away = 0.0 if self.outcome in ("used", "refused") else self.answer.engine_seconds()
        self._report(self.outcome, thrown_away)


class Speculator:
    """One session's speculation: the current candidate, the speculation on it, the bound.

    ``plan(pcm)`` is the session's: the turn a commit of ``pcm`` now would start, or None when the
    session would not answer one now (busy, speculation off, no ``create_response``).
    """

    def __init__(self, engine: Engine, plan: Callable[[np.ndarray], SpeculativeAnswer | None], *,
                 session_id: str, share: SessionShare, on_outcome: OutcomeObserver | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = engine
        self._plan = plan
        self._session_id = session_id
        self._on_outcome = on_outcome
        self._candidate: np.ndarray | None = None  # the utterance at its candidate end; None: speech goes on
        self._current: Speculation | None = None
        self._share = share
        self._starts = TokenBucket(SPECULATION_BURST, SPECULATIONS_PER_SECOND, clock=clock)
        self._capacity_lost = False  # refused or preempted in this utterance: none starts again
        self._stopping: list[Speculation] = []  # cancelled, their turns maybe still stopping
        self._closed = False

    def __len__(self) -> int:
        """Speculations that still hold engine turns (stats)."""
        return int(self._current is not None) + sum(not speculation.stopped for speculation in self._stopping)

    def candidate(self, pcm: np.ndarray) -> None:
        """A candidate end of turn: the utterance so far (``SilenceStarted``)."""
        self._candidate = pcm
        self.check()

    def resumed(self) -> None:
        """Speech came back: the candidate is void."""
        self._candidate = None
        self._discard()

    def utterance_over(self) -> None:
        """The utterance was committed (its speculation taken first) or dropped."""
        self._candidate = None
        self._capacity_lost = False
        self._discard()

    def check(self) -> None:
        """Keep, replace, start or drop the speculation: it answers what a commit now would, or none runs."""
        if self._closed or self._candidate is None:
            return
        turn = self._plan(self._candidate)
        current = self._current
        if current is not None and turn is not None and same_request(current.request, turn.answer):
            return
        self._discard()
        if turn is None or self._capacity_lost or not self._take_start():
            return
        if (refusal := self._share.charge_within(request_estimate(turn.answer), "speculative_response")) is not None:
            logger.debug("session %s: no speculation: the %s's share of the engine is spent", self._session_id,
                         refusal.limit)
            return
        self._report("started", 0.0)
        self._current = Speculation(self._engine, turn, self._candidate, session_id=self._session_id,
                                    report=self._report, on_failed=self._failed)

    def _take_start(self) -> bool:
        if not self._starts.take(1):
            logger.debug("session %s: no speculative start left (%g a second)", self._session_id,
                         SPECULATIONS_PER_SECOND)
            return False
        return True

    def take(self) -> Speculation | None:
        """At the commit: the speculation (running, or ended by itself), now the caller's to ``use``;
        whatever the caller does not use it discards (``release``)."""
        current, self._current = self._current, None
        self._candidate = None
        if current is not None:
            current.committed()
        return current

    def release(self, speculation: Speculation) -> None:
        """A taken speculation that will not be used: cancelled, and awaited at ``close``."""
        speculation.cancel()
        self._stop(speculation)

    async def close(self) -> None:
        """Cancel the speculation and await every turn it started; safe to call twice."""
        self._closed = True
        self._discard()
        stopping, self._stopping = self._stopping, []
        for speculation in stopping:
            await speculation.wait()

    def _discard(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.cancel()
            self._stop(current)

    def _failed(self, speculation: Speculation) -> None:
        """Refused or preempted in the engine: forgotten; no other starts in this utterance."""
        if speculation is self._current:
            self._current = None
            self._stop(speculation)
        self._capacity_lost = True

    def _stop(self, speculation: Speculation) -> None:
        # Those already stopped leave; the list stays as short as the speculations still stopping.
        self._stopping = [other for other in self._stopping if not other.stopped]
        self._stopping.append(speculation)

    def _report(self, outcome: str | None, engine_seconds: float) -> None:
        if outcome not in (None, "started"):
            logger.debug("session %s: a speculation %s (%.0f ms of engine time thrown away)",
                         self._session_id, outcome, engine_seconds * 1000)
        if self._on_outcome is not None:
            self._on_outcome(outcome, engine_seconds)
