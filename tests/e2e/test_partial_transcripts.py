"""Partial transcripts end to end: the real server (dev model, server VAD), a WebSocket client
saying the 5 s fixture in real time with input transcription on.

While the user speaks, ``…input_audio_transcription.delta`` events marked ``partial`` arrive for
the item ``speech_started`` announced, before the speech stops; each one's ``transcript`` is a
new hypothesis that replaces the previous one, and ``delta`` only ever appends (what a client
that concatenates deltas shows is a prefix of the newest hypothesis). After the commit the
final transcription's deltas (``partial`` false) go on from there, and ``…completed`` carries
the final text. One utterance, one shared server (tests/e2e/conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.cli import read_utterance
from app.client.websocket import RealtimeSocketClient

pytestmark = pytest.mark.e2e

FIVE_SECOND_STORY = Path(__file__).resolve().parents[1] / "fixtures" / "five_second_story.wav"
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
SESSION = {"type": "realtime", "max_output_tokens": 8, "output_modalities": ["text"],
           "audio": {"input": {"transcription": {"model": "qwen3-omni"}}}}
TURN_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
async def spoken(server_url: str) -> list[dict[str, Any]]:
    """Every server event of one session that says the 5 s fixture once."""
    async with RealtimeSocketClient(server_url, session=SESSION, timeout_s=TURN_TIMEOUT_S) as client:
        await client.speak(read_utterance(FIVE_SECOND_STORY))
        return list(client.events)


def index_of(events: list[dict[str, Any]], event_type: str) -> int:
    return next(i for i, event in enumerate(events) if event["type"] == event_type)


def item_deltas(events: list[dict[str, Any]], item_id: str) -> list[tuple[int, dict[str, Any]]]:
    return [(i, event) for i, event in enumerate(events) if event["type"] == DELTA and event["item_id"] == item_id]


async def test_partial_deltas_arrive_while_the_user_still_speaks(spoken: list[dict[str, Any]]) -> None:
    item_id = spoken[index_of(spoken, "input_audio_buffer.speech_started")]["item_id"]
    stopped = index_of(spoken, "input_audio_buffer.speech_stopped")
    partials = [(i, event) for i, event in item_deltas(spoken, item_id) if event["partial"]]
    # The first partial is due at 1 s of the 5 s utterance, the next ones every second after it.
    during_speech = [event for i, event in partials if i < stopped]
    assert len(during_speech) >= 2
    assert all(event["transcript"] for event in during_speech)
    assert all(i < index_of(spoken, "input_audio_buffer.committed") for i, _ in partials)


async def test_each_partial_supersedes_the_previous_and_deltas_only_append(spoken: list[dict[str, Any]]) -> None:
    item_id = spoken[index_of(spoken, "input_audio_buffer.committed")]["item_id"]
    partials = [event for _, event in item_deltas(spoken, item_id) if event["partial"]]
    hypotheses = [event["transcript"] for event in partials]
    assert len(hypotheses) >= 2 and all(a != b for a, b in zip(hypotheses, hypotheses[1:], strict=False))
    shown = ""
    for event in partials:
        shown += event["delta"]
        assert event["transcript"].startswith(shown)  # what a concatenating client shows is never wrong
        assert event["content_index"] == 0


async def test_the_final_transcript_comes_after_the_commit(spoken: list[dict[str, Any]]) -> None:
    committed = index_of(spoken, "input_audio_buffer.committed")
    item_id = spoken[committed]["item_id"]
    completed = index_of(spoken, COMPLETED)
    assert spoken[completed]["item_id"] == item_id and spoken[completed]["transcript"]
    assert committed < completed
    finals = [(i, event) for i, event in item_deltas(spoken, item_id) if not event["partial"]]
    assert all(committed < i < completed for i, _ in finals)
    shown = "".join(event["delta"] for _, event in item_deltas(spoken, item_id))
    final = spoken[completed]["transcript"]
    if finals:  # the final text went on from the partials' words: the deltas now say all of it
        assert finals[-1][1]["transcript"] == final == shown
    else:  # it revised them (or said no more): only .completed tells
        assert not (final.startswith(shown) and len(final) > len(shown))
