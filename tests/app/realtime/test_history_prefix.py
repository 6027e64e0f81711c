"""The history as a vLLM-Omni request, turn after turn: what of one turn's request the next one
begins with, which is what a server's prefix cache can reuse (docs/VLLM_OMNI.md "Prefix caching").

The history is the session's (``app.realtime.history.History``: answers settled as heard, pruned
as the session prunes it after each answer) and each request is ``chat_request`` on its
conversation, as ``--engine-url`` sends it. What holds, exactly:

- the system message and the tools are the same in every request (instructions and tools unchanged);
- while the history keeps its past as it is, turn N+1's messages begin with turn N's plus the
  answer as heard: the assistant message with the heard text (cut short by a barge-in), its calls,
  their outputs. An answer heard as nothing is left out, so the next user message joins turn N's
  last one: its parts then begin with that message's parts. "Keeps its past as it is": since turn
  N nothing was pruned (no ``conversation.item.deleted``: ``max_turns``, the unanswered-item
  bound, the token budget under ``auto`` or ``retention_ratio``), and the past turns stay within
  the audio limits (past them the oldest turns go as their transcripts, or leave);
- otherwise the requests share the system message and no more is promised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.realtime.history import AssistantEntry, FunctionCallEntry, FunctionOutputEntry, History, UserEntry
from app.realtime.protocol import InputTextContent
from app.realtime.session_config import Truncation
from media.rates import SPEECH_RATE, VOICE_RATE
from pipeline.contract import GenerationRequest
from pipeline.conversation import HistoryLimits, UserAudio, UserText, split_turns
from pipeline.tool_format import Tool
from pipeline.vllm_omni.chat_completions import chat_request

INSTRUCTIONS = "Answer briefly."
TOOLS = (Tool("get_weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}}),)
WORD_SECONDS = 0.3  # each answer word's audio
# Limits nothing in a short chat reaches, and limits that make pruning and the audio rule act.
ROOMY = HistoryLimits(max_turns=100, max_audio_clips=100, max_audio_seconds=1_000.0, max_prompt_tokens=1_000_000)
TIGHT = HistoryLimits(max_turns=3, max_audio_clips=2, max_audio_seconds=2.0, max_prompt_tokens=300)
TRUNCATIONS = [Truncation(), Truncation("retention_ratio", 0.5), Truncation("disabled")]


@dataclass(frozen=True)
class Turn:
    """One user turn and its answer. A call's output comes back and is answered in one more request."""

    spoken: bool  # the user speaks a clip (else types)
    seconds: float
    transcribed: bool  # the clip gets its transcript once answered
    words: int  # the answer's words (before a call: its preface)
    heard: Literal["all", "part", "none"]  # all of its audio played, a barge-in part-way, or none of it
    call: bool


turns = st.builds(
    Turn,
    spoken=st.booleans(),
    seconds=st.sampled_from([0.25, 0.5, 1.0]),
    transcribed=st.booleans(),
    words=st.integers(0, 6),
    heard=st.sampled_from(["all", "part", "none"]),
    call=st.booleans(),
)


class Chat:
    """A session's history as it grows, and each request ``--engine-url`` sends for it."""

    def __init__(self, limits: HistoryLimits, truncation: Truncation) -> None:
        self.history = History()
        self.limits = limits
        self.truncation = truncation
        self.deleted = 0  # items pruned so far
        self._count = 0

    def _id(self, kind: str) -> str:
        self._count += 1
        return f"{kind}_{self._count}"

    def user(self, turn: Turn) -> UserEntry:
        if turn.spoken:
            rng = np.random.default_rng(self._count)
            pcm = (0.1 * rng.standard_normal(int(turn.seconds * SPEECH_RATE))).astype(np.float32)
            item_id = self._id("item")
            self.history.commit_audio(item_id, pcm)
            entry = self.history.find(item_id)
            assert isinstance(entry, UserEntry)
            return entry
        text = f"Question {self._count}?"
        entry = UserEntry(self._id("item"), (UserText(text),), [InputTextContent(text=text)])
        self.history.append(entry)
        return entry

    def answer(self, turn: Turn, *, call: bool) -> tuple[AssistantEntry, FunctionCallEntry | None]:
        """An answer as the session settles it: its words, its audio, what of it was heard."""
        entry = AssistantEntry(self._id("item"), "audio")
        self.history.append(entry)
        for index in range(turn.words):
            entry.add_delta(f" word{index}" if index else f"Word{self._count}")
            entry.add_audio(int(WORD_SECONDS * VOICE_RATE))
        made = None
        if call:  # a call is made only by an answer that ran to its end
            made = FunctionCallEntry(self._id("item"), self._id("call"), "get_weather", '{"city": "Paris"}',
                                     status="completed")
            self.history.append(made)
        heard = "all" if call else turn.heard
        entry.status = "completed" if heard == "all" else "incomplete"
        entry.ended_early = heard != "all"
        played = {"all": entry.audio_samples, "part": entry.audio_samples * 2 // 3, "none": 0}[heard]
        entry.heard = entry.heard_text(played, finished=heard == "all")
        return entry, made

    def output(self, call: FunctionCallEntry) -> FunctionOutputEntry:
        output = FunctionOutputEntry(self._id("item"), call.call_id, "sunny")
        self.history.append(output)
        return output

    def prune(self) -> None:
        self.deleted += len(self.history.prune(self.limits, self.truncation))

    def request(self) -> dict[str, Any]:
        conversation = self.history.conversation(INSTRUCTIONS, self.limits)
        return chat_request(GenerationRequest(dataclasses.replace(conversation, tools=TOOLS)))

    def past_as_it_is(self) -> bool:
        """The next request's past turns are all kept as they are (the audio rule and ``max_turns``)."""
        past, _ = split_turns(self.history.conversation(INSTRUCTIONS, self.limits).items)
        clips = [item for turn in past for item in turn if isinstance(item, UserAudio)]
        return (len(past) <= self.limits.max_turns and len(clips) <= self.limits.max_audio_clips
                and sum(clip.seconds for clip in clips) <= self.limits.max_audio_seconds)


def answer_messages(answer: AssistantEntry, call: FunctionCallEntry | None,
                    output: FunctionOutputEntry | None) -> list[dict[str, Any]]:
    """What an answer adds to the next request, written out: the assistant message with the text as
    heard and its call (none when nothing was heard and nothing called), then the call's output."""
    heard = answer.history_text()
    if not heard and call is None:
        return []
    message: dict[str, Any] = {"role": "assistant", "content": heard}
    if call is not None:
        message["tool_calls"] = [{"id": call.call_id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}}]
    tool = [] if output is None else [{"role": "tool", "tool_call_id": output.call_id, "content": output.output}]
    return [message, *tool]


def check_next(before: dict[str, Any], after: dict[str, Any], answer: list[dict[str, Any]], *, kept: bool) -> None:
    """The module docstring's rules for one request and the next."""
    assert after["messages"][0] == before["messages"][0] == {"role": "system", "content": INSTRUCTIONS}
    assert after["tools"] == before["tools"]
    if not kept:
        event("the history changed its past: the system message is shared")
        return
    previous, messages = before["messages"], after["messages"]
    if answer or previous[-1]["role"] != "user":
        event("the prefix holds")
        assert messages[: len(previous) + len(answer)] == previous + answer
    else:  # nothing heard: the next user message joins the last one
        event("nothing heard: the last user message goes on")
        assert messages[: len(previous) - 1] == previous[:-1]
        joined, last = messages[len(previous) - 1], previous[-1]
        assert joined["role"] == last["role"] == "user"
        assert joined["content"][: len(last["content"])] == last["content"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(turns, min_size=2, max_size=9),
    limits=st.sampled_from([ROOMY, TIGHT, dataclasses.replace(TIGHT, max_prompt_tokens=1_000_000)]),
    truncation=st.sampled_from(TRUNCATIONS),
)
def test_each_request_begins_with_the_last_one_and_its_answer_as_heard_while_the_past_is_kept(
    script: list[Turn], limits: HistoryLimits, truncation: Truncation
) -> None:
    chat = Chat(limits, truncation)
    previous: dict[str, Any] | None = None
    deleted_then = 0  # items pruned when ``previous`` was sent
    answered: list[dict[str, Any]] = []  # what the answer to ``previous`` adds

    def sent(request: dict[str, Any]) -> None:
        nonlocal previous, deleted_then
        if previous is not None:
            check_next(previous, request, answered, kept=chat.deleted == deleted_then and chat.past_as_it_is())
        previous, deleted_then = request, chat.deleted

    for turn in script:
        user = chat.user(turn)
        sent(chat.request())
        answer, call = chat.answer(turn, call=turn.call)
        if turn.spoken and turn.transcribed:
            user.transcribed(0, f"what was said in {user.id}")
        chat.prune()
        output = chat.output(call) if call is not None and chat.history.holds(call) else None
        answered = answer_messages(answer, call, output) if chat.history.holds(answer) else []
        if output is not None:  # the client sends the output and asks again: one more request and answer
            sent(chat.request())
            answer, _ = chat.answer(dataclasses.replace(turn, heard="all"), call=False)
            chat.prune()
            answered = answer_messages(answer, None, None) if chat.history.holds(answer) else []


def spoken_turns(chat: Chat, count: int) -> list[dict[str, Any]]:
    """``count`` spoken turns, each answered in full and transcribed; the request of each."""
    bodies = []
    for _ in range(count):
        user = chat.user(Turn(spoken=True, seconds=0.5, transcribed=True, words=3, heard="all", call=False))
        bodies.append(chat.request())
        chat.answer(Turn(True, 0.5, True, 3, "all", False), call=False)
        user.transcribed(0, "what was said")
        chat.prune()
    return bodies


def test_past_four_spoken_turns_the_oldest_goes_as_its_transcript_and_only_the_system_message_is_shared() -> None:
    bodies = spoken_turns(Chat(HistoryLimits(), Truncation()), 6)  # the defaults: at most 4 past clips as audio
    shared = [common_prefix(before["messages"], after["messages"]) for before, after in zip(bodies, bodies[1:])]
    # Requests 2 to 5 carry 1 to 4 past clips: each begins with the whole of the one before it.
    assert shared[:4] == [len(bodies[n]["messages"]) for n in range(4)]
    # Request 6 carries 5 past turns: the oldest goes as text, so only the system message is shared.
    assert shared[4] == 1
    assert bodies[5]["messages"][1]["content"] == [{"type": "text", "text": "what was said"}]


def test_retention_ratio_keeps_the_prefix_between_truncations_where_auto_loses_it_every_turn() -> None:
    limits = HistoryLimits(max_turns=1_000, max_prompt_tokens=400)
    broken = {}
    for truncation in (Truncation(), Truncation("retention_ratio", 0.5)):
        chat = Chat(limits, truncation)
        bodies = []
        for _ in range(40):
            chat.user(Turn(False, 0.0, False, 5, "all", False))
            bodies.append(chat.request())
            chat.answer(Turn(False, 0.0, False, 5, "all", False), call=False)
            chat.prune()
        shared = [common_prefix(before["messages"], after["messages"]) for before, after in zip(bodies, bodies[1:])]
        broken[truncation.type] = sum(1 for n, length in enumerate(shared) if length < len(bodies[n]["messages"]))
    # auto: from the first truncation on, every turn drops the oldest items; retention_ratio 0.5 drops
    # to half the budget and then keeps the prefix for several turns.
    assert broken["auto"] > 10
    assert broken["retention_ratio"] * 3 <= broken["auto"]


def common_prefix(first: list[Any], second: list[Any]) -> int:
    """How many leading messages two requests share."""
    length = 0
    for a, b in zip(first, second):
        if a != b:
            break
        length += 1
    return length
