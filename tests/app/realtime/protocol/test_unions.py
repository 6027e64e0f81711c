"""The unions and the parser: strict parsing of client events, the server union round trip."""

from __future__ import annotations

import json

import pytest

from app.realtime import protocol
from app.realtime.protocol import (
    LARGE_EVENT_CHARS,
    ConversationItemCreateEvent,
    ProtocolError,
    ResponseCreateEvent,
    SessionUpdateEvent,
    parse_client_event,
    server_event_adapter,
)


def test_parses_session_update_keeping_the_session_object_for_the_tolerant_reader():
    event = parse_client_event(json.dumps({"type": "session.update", "event_id": "e1", "session": {"model": "x"}}))

    assert isinstance(event, SessionUpdateEvent)
    assert event.event_id == "e1"
    assert event.session == {"model": "x"}


def test_parses_bytes_and_ignores_unknown_keys():
    event = parse_client_event(b'{"type": "response.create", "something_new": 1}')

    assert isinstance(event, ResponseCreateEvent)
    assert event.response is None


def test_parses_user_message_with_text_and_audio_parts():
    raw = {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": "AAAA"}],
        },
    }

    event = parse_client_event(json.dumps(raw))

    assert isinstance(event, ConversationItemCreateEvent)
    assert [part.type for part in event.item.content] == ["input_text", "input_audio"]


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        ("[1, 2]", "invalid_json", None),
        ('{"event_id": "e9"}', "missing_required_parameter", "type"),
        ('{"type": "response.explode", "event_id": "e9"}', "invalid_value", "type"),
        ('{"type": "conversation.item.delete", "event_id": "e9"}', "missing_required_parameter", "item_id"),
        ('{"type": "conversation.item.delete", "item_id": 7, "event_id": "e9"}', "invalid_type", "item_id"),
        (
            '{"type": "conversation.item.truncate", "item_id": "a", "content_index": 0, "audio_end_ms": -1,'
            ' "event_id": "e9"}',
            "invalid_value",
            "audio_end_ms",
        ),
        (
            '{"type": "response.create", "response": {"max_output_tokens": 5000}, "event_id": "e9"}',
            "invalid_value",
            "response.max_output_tokens",
        ),
        (
            '{"type": "conversation.item.create", "item": {"type": "message", "role": "user",'
            ' "content": [{"type": "input_video"}]}, "event_id": "e9"}',
            "invalid_value",
            "item.content[0].type",
        ),
        ('{"type": "input_audio_buffer.append", "audio": true, "event_id": "e9"}', "invalid_type", "audio"),
    ],
)
def test_bad_client_events_raise_protocol_errors_naming_the_event(raw, code, param):
    with pytest.raises(ProtocolError) as caught:
        parse_client_event(raw)

    assert caught.value.code == code
    assert caught.value.param == param
    if "e9" in str(raw):
        assert caught.value.event_id == "e9"


def test_parses_a_function_call_output_item():
    raw = {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_1", "output": "{}"}}
    event = parse_client_event(json.dumps(raw))
    assert isinstance(event, ConversationItemCreateEvent)
    assert (event.item.type, event.item.call_id, event.item.output) == ("function_call_output", "call_1", "{}")


@pytest.mark.parametrize(
    ("item", "code", "param"),
    [
        ({"type": "function_call_output", "output": "x"}, "missing_required_parameter", "item.call_id"),
        ({"type": "function_call_output", "call_id": "c", "output": 3}, "invalid_type", "item.output"),
        ({"type": "function_call", "call_id": "c", "name": "f"}, "missing_required_parameter", "item.arguments"),
        ({"role": "user", "content": []}, "missing_required_parameter", "item.type"),
        ({"type": "mcp_call"}, "invalid_value", "item.type"),
        ("a message", "invalid_type", "item"),
    ],
)
def test_bad_items_name_the_field(item, code, param):
    with pytest.raises(ProtocolError) as caught:
        parse_client_event(json.dumps({"type": "conversation.item.create", "item": item, "event_id": "e9"}))
    assert (caught.value.code, caught.value.param, caught.value.event_id) == (code, param, "e9")


def test_strict_types_do_not_coerce_strings_to_numbers():
    with pytest.raises(ProtocolError) as caught:
        parse_client_event('{"type": "response.create", "response": {"temperature": "0.7"}}')

    assert caught.value.param == "response.temperature"


def test_server_events_round_trip_through_the_server_union():
    event = protocol.OutputAudioBufferClearedEvent(response_id="resp_1").to_json()

    parsed = server_event_adapter.validate_python(event)

    assert isinstance(parsed, protocol.OutputAudioBufferClearedEvent)
    assert parsed.to_json() == event


def test_an_image_upload_past_a_mebibyte_is_read_alike_and_its_mistakes_told_alike():
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * (LARGE_EVENT_CHARS + 10)}
    raw = json.dumps({"type": "conversation.item.create", "event_id": "big",
                      "item": {"type": "message", "role": "user", "content": [image, {"type": "input_text", "text": "é"}]}})
    event = parse_client_event(raw)
    assert isinstance(event, ConversationItemCreateEvent) and event.event_id == "big"
    assert event.image_url_chars == len(image["image_url"]) and event.item.content[1].text == "é"
    with pytest.raises(ProtocolError) as broken:
        parse_client_event(raw[:-3])
    assert broken.value.code == "invalid_json" and "(line 1, column" in broken.value.message
