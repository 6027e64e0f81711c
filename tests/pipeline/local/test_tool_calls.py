"""Function calls in the Thinker's answer: found token by token, streamed, and never spoken."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import Qwen3OmniMoeForConditionalGeneration

from pipeline.contract import (
    AudioChunk,
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallStarted,
    GenerationDone,
    TextDelta,
)
from pipeline.conversation import AssistantText, Conversation, UserText
from pipeline.local.checkpoint import forced_tokens
from pipeline.local.decode_batch import DecodeBatch
from pipeline.local.generation import GenerationParams, stream_generation
from pipeline.local.prompt import PromptRenderer
from pipeline.local.tool_calls import ToolCallStream

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris", "format": {"hours": 24}}}\n</tool_call>'
SPOKEN = "Let me look at the clock."


def calls_in(tokenizer, answer: str, prefix: str = "") -> list:
    """The call events of an answer, fed as the engine feeds them (from the first call on)."""
    stream = ToolCallStream(tokenizer, prefix)
    events: list = []
    for token in tokenizer.encode(answer, add_special_tokens=False):
        if stream.speaking and not stream.opens(token):
            continue
        events += stream.push(token)
    return events + stream.end()


def deltas(events, index: int = 0) -> str:
    return "".join(e.delta for e in events if isinstance(e, FunctionCallDelta) and e.index == index)


def test_a_call_streams_its_name_first_then_its_arguments_as_written(tokenizer):
    events = calls_in(tokenizer, SPOKEN + "\n" + CALL)
    assert events[0] == FunctionCallStarted(0, "get_time")
    assert len([e for e in events if isinstance(e, FunctionCallDelta)]) > 3  # streamed, not at the end
    arguments = '{"timezone": "Europe/Paris", "format": {"hours": 24}}'
    assert events[-1] == FunctionCallDone(0, "get_time", arguments)
    assert deltas(events) == arguments


def test_several_calls_each_stream_in_turn(tokenizer):
    second = '<tool_call>\n{"name": "weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    events = calls_in(tokenizer, CALL + "\n" + second)
    done = [e for e in events if isinstance(e, FunctionCallDone)]
    assert [(d.index, d.name, d.arguments) for d in done] == [
        (0, "get_time", '{"timezone": "Europe/Paris", "format": {"hours": 24}}'),
        (1, "weather", '{"city": "Zürich"}'),
    ]
    assert deltas(events, 1) == '{"city": "Zürich"}'
    started = [events.index(e) for e in events if isinstance(e, FunctionCallStarted)]
    assert started[1] > events.index(done[0])


def test_text_after_a_call_is_not_delivered(tokenizer):
    events = calls_in(tokenizer, CALL + " Anything else?")
    assert [type(e) for e in events if not isinstance(e, FunctionCallDelta)] == [FunctionCallStarted, FunctionCallDone]


def test_a_body_that_is_not_a_call_is_delivered_as_written_and_marked(tokenizer):
    events = calls_in(tokenizer, "<tool_call>\nget the time please\n</tool_call>")
    assert events[-1] == FunctionCallDone(0, "", "get the time please", closed=True, well_formed=False)
    assert deltas(events) == "get the time please"


def test_broken_arguments_are_delivered_as_written_and_marked(tokenizer):
    events = calls_in(tokenizer, '<tool_call>\n{"name": "get_time", "arguments": {"timezone": Paris}}\n</tool_call>')
    assert events[-1] == FunctionCallDone(0, "get_time", '{"timezone": Paris}}', closed=True, well_formed=False)
    assert deltas(events) == '{"timezone": Paris}}'


def test_an_answer_that_stops_inside_a_call_still_delivers_it(tokenizer):
    events = calls_in(tokenizer, '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UT')
    assert events[-1] == FunctionCallDone(0, "get_time", '{"timezone": "UT', closed=False, well_formed=False)


def test_keys_in_another_order_still_name_the_call(tokenizer):
    events = calls_in(tokenizer, '<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>')
    assert events[0] == FunctionCallStarted(0, "f")
    assert events[-1] == FunctionCallDone(0, "f", '{"a": 1}')


@pytest.mark.parametrize(
    ("prefix", "answer"),
    [
        ('<tool_call>\n{"name": "get_time", "arguments":', ' {"timezone": "UTC"}}\n</tool_call>'),
        ("<tool_call>\n", '{"name": "get_time", "arguments": {"timezone": "UTC"}}\n</tool_call>'),
    ],
    ids=["named", "required"],
)
def test_a_forced_opening_in_the_prompt_starts_the_answer_inside_a_call(tokenizer, prefix, answer):
    stream = ToolCallStream(tokenizer, prefix)
    assert not stream.speaking
    events = [e for token in tokenizer.encode(answer, add_special_tokens=False) for e in stream.push(token)]
    assert events[0] == FunctionCallStarted(0, "get_time")
    assert events[-1] == FunctionCallDone(0, "get_time", '{"timezone": "UTC"}')


# --- through the dev model: forced answers, the Talker stopped at the call --------------------------


@pytest.fixture(scope="module")
def model(dev_model_dir):
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(dev_model_dir).eval()


@pytest.fixture(scope="module")
def inputs(dev_model_dir):
    conversation = Conversation((UserText("What time is it?"), AssistantText("Where?"), UserText("In Paris.")))
    return PromptRenderer.from_pretrained(dev_model_dir).render(conversation)


def forced_turn(model, tokenizer, inputs, reply: str, **params):
    """A sampled turn (Talker included) whose Thinker says ``reply``; chunks of a fixed size, so
    that where they fall does not depend on timing."""
    generation = GenerationParams(
        forced_tokens=forced_tokens(tokenizer, reply), temperature=0.8, seed=7, adaptive_chunks=False, **params
    )
    return list(stream_generation(model, tokenizer, inputs, generation, lambda: False))


def test_a_forced_reply_is_what_the_thinker_says(model, tokenizer, inputs):
    events = forced_turn(model, tokenizer, inputs, SPOKEN)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == SPOKEN
    assert events[-1].text == SPOKEN and events[-1].finish_reason == "stop"
    assert [e for e in events if isinstance(e, AudioChunk)]


@pytest.mark.parametrize(
    "after",
    ["", " And the date too.", "\n" + CALL.replace("get_time", "get_date")],
    ids=["call", "call-then-text", "two-calls"],
)
def test_the_call_markup_is_never_spoken(model, tokenizer, inputs, after):
    """The answer's audio with a call equals, frame for frame, the same answer without it (same seed)."""
    plain = forced_turn(model, tokenizer, inputs, SPOKEN)
    with_call = forced_turn(model, tokenizer, inputs, SPOKEN + CALL + after)

    def speech(events):
        chunks = [e for e in events if isinstance(e, AudioChunk)]
        return (
            "".join(e.text for e in events if isinstance(e, TextDelta)),
            [c.frames for c in chunks],
            np.concatenate([c.pcm for c in chunks]),
            events[-1].usage.output_audio_tokens,
        )

    text, marks, pcm, frames = speech(with_call)
    plain_text, plain_marks, plain_pcm, plain_frames = speech(plain)
    assert (text, marks, frames) == (plain_text, plain_marks, plain_frames)
    assert np.array_equal(pcm, plain_pcm)
    assert frames > 0
    assert [e.name for e in with_call if isinstance(e, FunctionCallDone)] == (
        ["get_time", "get_date"] if "get_date" in after else ["get_time"]
    )
    assert with_call[-1].text == SPOKEN  # GenerationDone's text is the speech


def test_an_answer_that_is_only_a_call_never_starts_the_talker(model, tokenizer, inputs):
    events = forced_turn(model, tokenizer, inputs, CALL)
    assert not [e for e in events if isinstance(e, AudioChunk | TextDelta)]
    done = events[-1]
    assert isinstance(done, GenerationDone) and done.usage.output_audio_tokens == 0
    assert [type(e) for e in events if not isinstance(e, FunctionCallDelta)] == [
        FunctionCallStarted, FunctionCallDone, GenerationDone,
    ]


def test_a_forced_turn_in_a_batch_leaves_the_other_turns_draws_alone(model, tokenizer, inputs):
    """Forced tokens draw no random numbers: a sampled turn beside one decodes what it does alone."""
    sampled = GenerationParams(temperature=0.8, seed=11, adaptive_chunks=False, max_output_tokens=12)
    alone = [e for e in stream_generation(model, tokenizer, inputs, sampled, lambda: False) if isinstance(e, TextDelta)]
    batch: DecodeBatch[str] = DecodeBatch(model, tokenizer)
    forced = GenerationParams(forced_tokens=forced_tokens(tokenizer, CALL), adaptive_chunks=False)
    events = batch.prefill_thinkers([("sampled", inputs, sampled), ("forced", inputs, forced)])
    batch.prefill_talkers([key for key in ("sampled", "forced") if batch.wants_talker(key)])
    while batch.keys:
        events += batch.step_thinker()
        batch.step_talker()
        if batch.chunks_due():
            events += batch.decode_chunks()
        for key in batch.finished_keys():
            events.append((key, batch.finish(key)))
    together = [e for key, e in events if key == "sampled" and isinstance(e, TextDelta)]
    assert together == alone
    assert [e.name for key, e in events if key == "forced" and isinstance(e, FunctionCallDone)] == ["get_time"]
