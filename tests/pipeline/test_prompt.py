"""Conversation → Thinker inputs: history bounds, the ChatML prompt, audio pads and features."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.conversation import (
    INPUT_SAMPLE_RATE,
    AssistantText,
    Conversation,
    HistoryLimits,
    UserAudio,
    UserText,
)
from pipeline.prompt import bound_history, split_turns


def _clip(seconds: float, seed: int = 0) -> UserAudio:
    rng = np.random.default_rng(seed)
    return UserAudio((0.1 * rng.standard_normal(int(seconds * INPUT_SAMPLE_RATE))).astype(np.float32))


def _audio_turn(seconds: float, answer: str, seed: int = 0) -> tuple:
    return (_clip(seconds, seed), AssistantText(answer))


# --- bound_history: no model needed -------------------------------------------------------------


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
