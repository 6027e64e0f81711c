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
