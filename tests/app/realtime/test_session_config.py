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


def _noise_reduction_of(config: SessionConfig) -> object:
    session = config.to_session_object(session_id="sess_1", model="m", expires_at=0).model_dump(mode="json")
    return session["audio"]["input"]["noise_reduction"]


def test_noise_reduction_is_taken_reported_and_turned_off_by_null():
    near = SessionConfig.from_session({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}})
    assert near.noise_reduction == "near_field"
    assert _noise_reduction_of(near) == {"type": "near_field"}
    far = near.updated({"input_audio_noise_reduction": {"type": "far_field"}})  # the beta's flat key
    assert far.noise_reduction == "far_field"
    off = far.updated({"audio": {"input": {"noise_reduction": None}}})
    assert off.noise_reduction is None and _noise_reduction_of(off) is None


def test_a_session_that_says_nothing_keeps_the_servers_noise_reduction():
    server_default = SessionConfig(noise_reduction="far_field")
    assert server_default.updated({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}).noise_reduction \
        == "far_field"


def test_an_unknown_noise_reduction_type_is_refused_naming_it():
    for value in ({"type": "studio"}, {}, "near_field"):
        try:
            SessionConfig.from_session({"audio": {"input": {"noise_reduction": value}}})
        except ProtocolError as exc:
            assert exc.code == "invalid_value" and "noise_reduction" in (exc.param or "")
        else:
            raise AssertionError(f"noise_reduction {value!r} was taken")


def _recording_of(config: SessionConfig) -> dict[str, bool]:
    return config.to_session_object(session_id="sess_1", model="m", expires_at=0).model_dump()["recording"]


def test_a_session_is_reported_recorded_when_the_server_records_and_it_did_not_refuse():
    assert _recording_of(SessionConfig()) == {"enabled": False}  # the server keeps no recordings
    recording_server = SessionConfig(record_sessions=True)
    assert _recording_of(recording_server) == {"enabled": True}
    assert _recording_of(recording_server.updated({"recording": {}})) == {"enabled": True}
    refused = recording_server.updated({"recording": {"enabled": False}})
    assert _recording_of(refused) == {"enabled": False}
    assert _recording_of(refused.updated({"instructions": "Be brief."})) == {"enabled": False}


def test_a_session_that_refused_recording_cannot_turn_it_back_on_and_bad_values_are_named():
    refused = SessionConfig(record_sessions=True).updated({"recording": {"enabled": False}})
    for session, param in (({"recording": {"enabled": True}}, "session.recording.enabled"),
                           ({"recording": {"enabled": "no"}}, "session.recording.enabled"),
                           ({"recording": False}, "session.recording")):
        try:
            refused.updated(session)
        except ProtocolError as exc:
            assert (exc.code, exc.param) == ("invalid_value", param)
        else:
            raise AssertionError(f"{session} was taken")
