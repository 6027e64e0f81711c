"""How the headless clients read a turn out of the server events they received."""

from __future__ import annotations

import numpy as np

from app.client.turn import TurnResult, committed_item, session_transcribes, transcription_ended


def turn(*events: dict) -> TurnResult:
    return TurnResult(events=list(events), response={"status": "completed"}, audio=np.zeros(0, np.float32), latency_s=None)


def committed(item_id: str) -> dict:
    return {"type": "input_audio_buffer.committed", "item_id": item_id}


def transcribed(item_id: str, transcript: str) -> dict:
    return {"type": "conversation.item.input_audio_transcription.completed", "item_id": item_id, "transcript": transcript}


def test_the_transcript_is_the_answer_audio_transcript() -> None:
    result = turn({"type": "response.output_audio_transcript.done", "transcript": "Hello there."})
    assert result.transcript == "Hello there."


def test_a_text_only_answer_is_its_text() -> None:
    assert turn({"type": "response.output_text.done", "text": "Hi."}).transcript == "Hi."


def test_the_user_transcript_is_the_committed_items_not_an_earlier_ones() -> None:
    result = turn(committed("item_2"), transcribed("item_1", "earlier"), transcribed("item_2", "what I said"))
    assert result.user_transcript == "what I said"


def test_an_untranscribed_turn_has_no_user_transcript() -> None:
    assert turn(committed("item_2")).user_transcript is None


def test_images_shown_counts_the_committed_items_input_images() -> None:
    item = {"id": "item_2", "content": [{"type": "input_audio"}, {"type": "input_image"}, {"type": "input_image"}]}
    other = {"id": "item_1", "content": [{"type": "input_image"}]}
    result = turn(
        committed("item_2"),
        {"type": "conversation.item.done", "item": other},
        {"type": "conversation.item.done", "item": item},
    )
    assert result.images_shown == 2


def test_the_first_commit_names_the_turns_item() -> None:
    assert committed_item([{"type": "session.created"}, committed("item_3"), committed("item_4")]) == "item_3"
    assert committed_item([{"type": "session.created"}]) is None


def test_whether_a_session_transcribes_is_what_it_last_announced() -> None:
    on = {"type": "session.created", "session": {"audio": {"input": {"transcription": {"model": "qwen3-omni"}}}}}
    off = {"type": "session.updated", "session": {"audio": {"input": {"transcription": None}}}}
    assert session_transcribes([on])
    assert not session_transcribes([on, off])
    assert not session_transcribes([])


def test_a_transcription_ends_completed_or_failed_for_its_own_item() -> None:
    failed = {"type": "conversation.item.input_audio_transcription.failed", "item_id": "item_1"}
    assert transcription_ended(transcribed("item_1", "hi"), "item_1")
    assert transcription_ended(failed, "item_1")
    assert not transcription_ended(failed, "item_2")
    assert not transcription_ended({"type": "conversation.item.input_audio_transcription.delta", "item_id": "item_1"}, "item_1")
