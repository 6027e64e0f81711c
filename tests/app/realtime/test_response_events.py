"""A response's event sequences, without a session."""

from __future__ import annotations

from app.realtime.history import AssistantEntry
from app.realtime.protocol import server_event_adapter
from app.realtime.response import Response, announce_events, delta_event, finish_events
from app.realtime.session_config import SessionConfig
from pipeline.contract import GenerationDone, GenerationTimings, Usage


def response(modality: str = "audio") -> Response:
    config = SessionConfig.from_session({"output_modalities": [modality]})
    made = Response.for_session(config, "conv_1", started_at=0.0)
    made.entry = AssistantEntry("item_1", made.modality)
    made.announced = True
    return made


def types(events) -> list[str]:
    return [event.to_json()["type"] for event in events]


def test_an_audio_response_is_announced_in_openai_order():
    assert types(announce_events(response(), previous_item_id="item_0")) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]


def test_an_audio_response_streams_transcript_deltas_and_a_text_one_text_deltas():
    assert delta_event(response("audio"), "hi").to_json()["type"] == "response.output_audio_transcript.delta"
    assert delta_event(response("text"), "hi").to_json()["type"] == "response.output_text.delta"


def test_a_completed_audio_response_closes_part_item_and_response():
    made = response()
    made.entry.add_delta("hello")
    done = GenerationDone(text="hello", usage=Usage(input_text_tokens=5, input_audio_tokens=0, output_text_tokens=1, output_audio_tokens=2), finish_reason="stop", timings=GenerationTimings())
    events = finish_events(made, "completed", previous_item_id="item_0", done=done)
    assert types(events) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert events[1].transcript == "hello"
    assert made.entry.status == "completed"


def test_a_response_cancelled_before_it_was_announced_still_gets_created_then_done():
    made = response()
    made.entry, made.announced = None, False
    events = finish_events(made, "cancelled", previous_item_id=None, reason="turn_detected")
    assert types(events) == ["response.created", "response.done"]
    assert events[-1].response.status_details.reason == "turn_detected"


def test_every_event_of_a_failed_response_is_a_valid_server_event():
    made = response("text")
    events = announce_events(made, None) + finish_events(made, "failed", previous_item_id=None, error_code="boom")
    for event in events:
        server_event_adapter.validate_python(event.to_json())
    assert events[-1].response.status_details.error.code == "boom"
    assert made.entry.status == "incomplete"
