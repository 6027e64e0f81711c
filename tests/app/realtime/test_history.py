"""History without a session: pruning to whole turns, history as heard, client items."""

from __future__ import annotations

import numpy as np
import pytest

from app.realtime.history import (
    MAX_UNANSWERED_ITEMS,
    AssistantEntry,
    FunctionCallEntry,
    FunctionOutputEntry,
    History,
    Playback,
    UserEntry,
    pruned,
    within_budget,
)
from app.realtime.protocol import ConversationItemCreateEvent, ProtocolError
from media.rates import SPEECH_RATE
from pipeline.conversation import IMAGE_NOTE, AssistantText, HistoryLimits, UserAudio, UserImage, UserText
from tests.fakes import CODEC_FRAME_SAMPLES
from tests.pictures import encoded


def user_audio(item_id: str, seconds: float = 1.0) -> UserEntry:
    return UserEntry(item_id, (UserAudio(np.zeros(int(seconds * SPEECH_RATE), dtype=np.float32)),), [])


def user_text(item_id: str) -> UserEntry:
    return UserEntry(item_id, (UserText(item_id),), [])


def answer(item_id: str, text: str = "ok", status: str = "completed") -> AssistantEntry:
    entry = AssistantEntry(item_id, "audio", status=status)
    entry.add_delta(text)
    return entry


def ids(entries) -> list[str]:
    return [entry.id for entry in entries]


def test_pruning_drops_whole_turns_oldest_first():
    entries = [user_text("u1"), answer("a1"), user_text("u2"), answer("a2"), user_text("u3"), answer("a3")]
    assert ids(pruned(entries, HistoryLimits(max_turns=2))) == ["u2", "a2", "u3", "a3"]


def test_pruning_counts_audio_clips_across_a_turn():
    entries = [user_audio("u1"), answer("a1"), user_audio("u2"), user_audio("u3"), answer("a2")]
    assert ids(pruned(entries, HistoryLimits(max_audio_clips=2))) == ["u2", "u3", "a2"]


def test_pruning_counts_audio_seconds():
    entries = [user_audio("u1", 40), answer("a1"), user_audio("u2", 30), answer("a2")]
    assert ids(pruned(entries, HistoryLimits(max_audio_seconds=60))) == ["u2", "a2"]


def test_pruning_keeps_the_turn_being_answered_whatever_its_size():
    entries = [user_audio("u1", 90), answer("a1", status="in_progress")]
    assert ids(pruned(entries, HistoryLimits(max_audio_seconds=60))) == ["u1", "a1"]


def test_pruning_keeps_a_bounded_tail_of_unanswered_items():
    entries = [user_text(f"u{n}") for n in range(MAX_UNANSWERED_ITEMS + 3)]
    assert ids(pruned(entries, HistoryLimits())) == ids(entries[3:])


def test_conversation_holds_what_was_heard_of_an_answer():
    history = History()
    history.append(user_text("u1"))
    entry = answer("a1", "one ")
    entry.add_delta("two")
    entry.add_audio(2 * CODEC_FRAME_SAMPLES)
    history.append(entry)
    playback = Playback("a1", "r1", segment_start=0, segment_written=2 * CODEC_FRAME_SAMPLES)
    cut_short = history.settle(playback, played=CODEC_FRAME_SAMPLES)
    assert cut_short
    items = history.conversation(None, HistoryLimits()).items
    assert items == (UserText("u1"), AssistantText("one "))


@pytest.mark.parametrize("tokens_heard, heard", [(1, "ok "), (2, "ok "), (3, "ok café")])
def test_a_character_held_back_across_tokens_is_heard_once_all_of_its_tokens_are(tokens_heard, heard):
    # "ok " is one token; "café" needed two (its "é" split across UTF-8 pieces) and came as one
    # delta: hearing the first of those two voices no more text than "ok ".
    entry = answer("a1", "ok ")
    entry.add_delta("café", tokens=2)
    entry.add_audio(3 * CODEC_FRAME_SAMPLES)  # complete: the three tokens' audio, one frame each
    assert entry.heard_text(tokens_heard * CODEC_FRAME_SAMPLES, finished=True) == heard


def test_an_answer_nobody_heard_is_left_out_of_the_prompt():
    history = History()
    history.append(user_text("u1"))
    entry = answer("a1", "unheard")
    entry.heard = ""
    history.append(entry)
    assert history.conversation(None, HistoryLimits()).items == (UserText("u1"),)


def test_create_item_after_an_unknown_item_names_previous_item_id():
    event = ConversationItemCreateEvent.model_validate(
        {"type": "conversation.item.create", "previous_item_id": "nope",
         "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}
    )
    with pytest.raises(ProtocolError) as caught:
        History().create_item(event, max_chars=100)
    assert caught.value.param == "previous_item_id"


def test_create_item_at_root_goes_first():
    history = History()
    history.append(user_text("u1"))
    event = ConversationItemCreateEvent.model_validate(
        {"type": "conversation.item.create", "previous_item_id": "root",
         "item": {"id": "first", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}
    )
    added, done = history.create_item(event, max_chars=100)
    assert ids(history) == ["first", "u1"]
    assert added.previous_item_id is None and done.item.id == "first"


def test_a_long_turns_segments_are_kept_or_evicted_together():
    segments = [user_audio(f"s{n}", 30) for n in range(3)] + [user_audio("s3", 29)]  # 119 s, at the maximum
    entries = [user_audio("u1", 5), answer("a1"), *segments, answer("a2")]
    # The whole long turn fits the default budget (120 s, 4 clips); the turn before it does not.
    assert ids(pruned(entries, HistoryLimits())) == ["s0", "s1", "s2", "s3", "a2"]
    later = [*entries, user_audio("u3", 2), answer("a3")]
    assert ids(pruned(later, HistoryLimits())) == ["u3", "a3"]  # never some of its segments


def insert_text(history: History, text: str, *, previous_item_id: str | None = None, item_id: str | None = None):
    event = ConversationItemCreateEvent.model_validate(
        {"type": "conversation.item.create", "previous_item_id": previous_item_id,
         "item": {"id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}
    )
    history.create_item(event, max_chars=16_000)


def test_items_inserted_at_root_into_an_answered_turn_are_bounded_by_the_token_budget():
    history, limits = History(), HistoryLimits(max_prompt_tokens=1_000)
    history.append(user_text("u1"))
    history.append(answer("a1"))
    deleted = []
    for n in range(200):  # each joins the first, answered turn: the turn limits alone never bind
        insert_text(history, "word " * 40, previous_item_id="root", item_id=f"r{n}")
        deleted += [event.item_id for event in history.prune(limits)]
    assert sum(entry.prompt_tokens() for entry in history) <= 1_000
    assert ids(history)[-2:] == ["u1", "a1"]  # the oldest went: the items put first
    assert deleted == [f"r{n}" for n in range(200) if f"r{n}" not in ids(history)]  # each announced once


def test_the_budget_drops_the_oldest_items_but_never_the_newest():
    history = History()
    for n in range(3):
        insert_text(history, "x" * 600, item_id=f"t{n}")
    deleted = [event.item_id for event in history.prune(HistoryLimits(max_prompt_tokens=1_000))]
    assert deleted == ["t0", "t1"] and ids(history) == ["t2"]
    insert_text(history, "y" * 2_000, item_id="big")  # alone over the budget: what the next turn answers
    assert [event.item_id for event in history.prune(HistoryLimits(max_prompt_tokens=1_000))] == ["t2"]
    assert ids(history) == ["big"]


def test_the_budget_keeps_a_response_being_generated():
    entries = [user_text("u1"), answer("a1", "z" * 5_000, status="in_progress"), user_text("late")]
    assert ids(within_budget(entries, HistoryLimits(max_prompt_tokens=1_000))) == ["a1", "late"]


def test_the_budget_bounds_items_and_bytes_too():
    many = [user_text(f"u{n}") for n in range(20)]
    assert ids(within_budget(many, HistoryLimits(max_items=5))) == ids(many[-5:])
    clips = [user_audio(f"c{n}", 10) for n in range(4)]  # 640 KB of float32 PCM each
    assert ids(within_budget(clips, HistoryLimits(max_bytes=1_500_000))) == ["c2", "c3"]


def test_the_budget_takes_older_items_images_before_any_item():
    picture = UserImage(encoded(448, 448), 448, 448, max_pixels=448 * 448)  # 196 image tokens
    shown = UserEntry("shown", (picture, UserText("look")), [])
    entries = [shown, answer("a1"), user_text("u2"), answer("a2"), user_text("u3")]
    budget = HistoryLimits(max_prompt_tokens=sum(entry.prompt_tokens() for entry in entries) - 100)
    assert ids(within_budget(entries, budget)) == ids(entries)  # every item stays...
    assert shown.parts == (UserText(IMAGE_NOTE), UserText("look"))  # ...the image became a note


def test_the_budget_drops_a_function_call_with_its_output():
    call = FunctionCallEntry("call", "c1", "get_time", "{}", status="completed")
    output = FunctionOutputEntry("output", "c1", "x" * 600)
    entries = [call, answer("a1"), output, user_text("u2")]
    assert ids(within_budget(entries, HistoryLimits(max_prompt_tokens=100))) == ["a1", "u2"]
