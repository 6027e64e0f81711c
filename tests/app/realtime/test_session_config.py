"""Session objects read into a SessionConfig: hostile ones raise only protocol errors."""

from __future__ import annotations

from hypothesis import given, settings

from app.realtime.protocol import ProtocolError
from app.realtime.session_config import SessionConfig
from tests.app.realtime.test_fuzz import FUZZ_SETTINGS, session_objects

SESSION_CONFIG_EXAMPLES = 300  # session objects read as an offer's or client secret's session


@settings(FUZZ_SETTINGS, max_examples=SESSION_CONFIG_EXAMPLES)
@given(session=session_objects())
def test_session_config_reader_raises_only_protocol_errors(session):
    try:
        config = SessionConfig.from_session(session)
    except ProtocolError as exc:
        assert exc.message and exc.code
    else:
        config.to_session_object(session_id="sess_1", model="m", expires_at=0).model_dump(mode="json")


def test_an_idle_timeout_below_openais_minimum_is_refused_naming_it():
    for value in (0, 1, 4_999, -5):
        try:
            SessionConfig.from_session({"audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                                 "idle_timeout_ms": value}}}})
        except ProtocolError as exc:
            assert exc.code == "invalid_value" and exc.param.endswith("turn_detection.idle_timeout_ms")
            assert "5000" in exc.message
        else:
            raise AssertionError(f"idle_timeout_ms {value} was taken")
    taken = SessionConfig.from_session({"audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                                "idle_timeout_ms": 5_000}}}})
    assert taken.turn_detection is not None and taken.turn_detection.idle_timeout_ms == 5_000
