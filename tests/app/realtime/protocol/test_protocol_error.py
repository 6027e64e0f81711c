"""Errors as data: a ProtocolError becomes an error event with every field."""

from __future__ import annotations

from app.realtime.protocol import ProtocolError, invalid_value


def test_error_event_has_every_field():
    event = ProtocolError("invalid_value", "bad", param="x", event_id="e1").to_event().to_json()

    assert event["type"] == "error"
    assert event["event_id"].startswith("event_")
    assert event["error"] == {
        "type": "invalid_request_error",
        "code": "invalid_value",
        "message": "bad",
        "param": "x",
        "event_id": "e1",
    }


def test_invalid_value_names_the_param_in_openais_words():
    error = invalid_value("session.voice", "must be a string or null")

    assert (error.code, error.param, error.type) == ("invalid_value", "session.voice", "invalid_request_error")
    assert error.message == "Invalid value for 'session.voice': must be a string or null."
