"""History bounds and turns: which past turns the prompt keeps, a call kept with its output; the ASR prompt."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.conversation import (
    IMAGE_NOTE,
    AssistantText,
    Conversation,
    HistoryLimits,
    UserAudio,
    UserText,
    asr_instruction,
    bound_history,
    split_turns,
)
from pipeline.tool_format import FunctionCall, FunctionOutput
from tests.pipeline.local.test_prompt import _audio_turn, _clip, _image


def test_bound_history_keeps_everything_within_limits():
    items = (*_audio_turn(1.0, "one"), UserText("two?"), AssistantText("two"), _clip(1.0))
    assert bound_history(Conversation(items)) == items


def test_bound_history_drops_oldest_turns_beyond_max_turns():
    past = [(UserText(f"q{i}"), AssistantText(f"a{i}")) for i in range(5)]
    current = (UserText("now?"),)
    conversation = Conversation((*sum(past, ()), *current), limits=HistoryLimits(max_turns=2))
    assert bound_history(conversation) == (*past[3], *past[4], *current)


def test_bound_history_drops_oldest_turns_beyond_max_audio_clips():
    past = [_audio_turn(1.0, f"a{i}", seed=i) for i in range(4)]
    current = (_clip(1.0, seed=9),)
    conversation = Conversation((*sum(past, ()), *current), limits=HistoryLimits(max_audio_clips=3))
    assert bound_history(conversation) == (*past[1], *past[2], *past[3], *current)


def test_bound_history_drops_oldest_turns_beyond_max_audio_seconds():
    past = [_audio_turn(seconds, f"a{i}", seed=i) for i, seconds in enumerate((3.0, 2.0, 2.0))]
    current = (_clip(1.0, seed=9),)
    conversation = Conversation((*sum(past, ()), *current), limits=HistoryLimits(max_audio_seconds=4.5))
    assert bound_history(conversation) == (*past[1], *past[2], *current)


def test_bound_history_keeps_the_current_turn_beyond_every_limit():
    current = (_clip(3.0, seed=1), _clip(3.0, seed=2), UserText("and this?"))
    limits = HistoryLimits(max_turns=0, max_audio_clips=1, max_audio_seconds=1.0)
    conversation = Conversation((*_audio_turn(0.5, "old"), *current), limits=limits)
    assert bound_history(conversation) == current


def test_bound_history_stops_at_the_first_turn_over_a_limit():
    # The oldest turn would fit on its own, but keeping it would leave a hole in the history.
    past = [_audio_turn(0.5, "small", seed=1), _audio_turn(10.0, "big", seed=2), _audio_turn(0.5, "new", seed=3)]
    current = (UserText("?"),)
    conversation = Conversation((*sum(past, ()), *current), limits=HistoryLimits(max_audio_seconds=5.0))
    assert bound_history(conversation) == (*past[2], *current)


_items = st.lists(
    st.one_of(
        st.builds(lambda s: _clip(s), st.sampled_from([0.1, 0.5, 2.0])),
        st.builds(UserText, st.sampled_from(["hi", "more"])),
        st.builds(AssistantText, st.sampled_from(["ok", ""])),
    ),
    max_size=16,
)
_limits = st.builds(
    HistoryLimits,
    max_turns=st.integers(0, 5),
    max_audio_clips=st.integers(0, 5),
    max_audio_seconds=st.sampled_from([0.0, 1.0, 3.0, 60.0]),
)


@given(items=_items, limits=_limits)
def test_bound_history_keeps_a_suffix_of_whole_answered_turns_within_limits(items, limits):
    conversation = Conversation(tuple(items), limits=limits)
    kept = bound_history(conversation)

    assert tuple(items[len(items) - len(kept) :]) == kept
    past_turns, current = split_turns(kept)
    assert current == split_turns(items)[1]
    assert _within(limits, past_turns)
    if len(kept) < len(items):  # dropped only whole turns, and only because one more would not fit
        dropped_turns, dropped_current = split_turns(items[: len(items) - len(kept)])
        assert dropped_current == ()
        assert not _within(limits, [dropped_turns[-1], *past_turns])


def _within(limits: HistoryLimits, turns) -> bool:
    clips = [item for turn in turns for item in turn if isinstance(item, UserAudio)]
    return (
        len(turns) <= limits.max_turns
        and len(clips) <= limits.max_audio_clips
        and sum(clip.seconds for clip in clips) <= limits.max_audio_seconds
    )


def test_bound_history_notes_the_images_of_older_turns_beyond_the_image_budget():
    # Three past camera turns of 2 x 192 tokens; 800 tokens hold the newest two.
    past = [(_image(seed=2 * i), _image(seed=2 * i + 1), _clip(1.0, seed=i), AssistantText(f"a{i}")) for i in range(3)]
    current = (_image(seed=9), _image(seed=10), _image(seed=11), _clip(1.0, seed=9))
    limits = HistoryLimits(max_image_tokens=800)
    kept = bound_history(Conversation((*sum(past, ()), *current), limits=limits))
    assert kept == (UserText(IMAGE_NOTE), *past[0][2:], *past[1], *past[2], *current)


def test_bound_history_drops_images_before_audio():
    # Over the image budget but within the audio budget: the old turn keeps its clip.
    old = (_image(seed=1), _clip(1.0, seed=1), AssistantText("old"))
    current = (_image(seed=2), _clip(1.0, seed=2))
    kept = bound_history(Conversation((*old, *current), limits=HistoryLimits(max_image_tokens=100)))
    assert kept == (UserText(IMAGE_NOTE), old[1], old[2], *current)


def test_a_turn_holds_its_calls_and_their_outputs():
    items = (
        UserText("q1"), FunctionCall("a", "f", "{}"), FunctionOutput("a", "1"), AssistantText("r1"),
        UserText("q2"), AssistantText("r2"),
    )
    turns, current = split_turns(items)
    assert turns == [items[:4], items[4:]] and current == ()


def test_an_output_after_later_turns_keeps_them_with_its_call():
    # The user spoke (and was answered) before the client returned the call's output.
    items = (
        UserText("q1"), AssistantText("checking"), FunctionCall("a", "f", "{}"),
        UserText("q2"), AssistantText("r2"),
        FunctionOutput("a", "1"), AssistantText("r3"),
        UserText("q4"),
    )
    turns, current = split_turns(items)
    assert turns == [items[:2], items[2:7]] and current == (items[7],)
    # The history bound keeps or drops them together.
    kept = bound_history(Conversation(items, limits=HistoryLimits(max_turns=1)))
    assert kept == items[2:]


def test_asr_instruction_follows_qwens_readme():
    assert asr_instruction(None) == asr_instruction("xx") == "Transcribe the audio into text."
    assert asr_instruction("EN") == "Transcribe the English audio into text."
    assert asr_instruction("zh") == "请将这段中文语音转换为纯文本。"
