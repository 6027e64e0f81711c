"""Server events: complete GA-shaped, every field present (optional ones as null), ids unique."""

from __future__ import annotations

from app.realtime import protocol


def test_transcript_delta_has_every_ga_field():
    event = protocol.ResponseOutputAudioTranscriptDeltaEvent(
        response_id="resp_1", item_id="item_1", output_index=0, content_index=0, delta="Hi"
    ).to_json()

    assert set(event) == {"type", "event_id", "response_id", "item_id", "output_index", "content_index", "delta"}
    assert event["type"] == "response.output_audio_transcript.delta"


def test_optional_ga_fields_are_present_as_null():
    committed = protocol.InputAudioBufferCommittedEvent(item_id="item_1", previous_item_id=None).to_json()
    added = protocol.ConversationItemAddedEvent(
        previous_item_id=None,
        item=protocol.MessageItem(id="item_1", status="completed", role="user", content=[protocol.InputAudioContent()]),
    ).to_json()

    assert committed["previous_item_id"] is None
    assert added["item"] == {
        "id": "item_1",
        "type": "message",
        "object": "realtime.item",
        "status": "completed",
        "role": "user",
        "content": [{"type": "input_audio", "transcript": None}],
    }


def test_event_ids_are_unique():
    ids = {protocol.InputAudioBufferClearedEvent().event_id for _ in range(1000)}

    assert len(ids) == 1000
