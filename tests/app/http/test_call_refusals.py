"""The one mapping of a refused call to its answer and its count (``app.http.call_refusals``)."""

from __future__ import annotations

from app.calls.registry import CapacityError, ConnectingLimitError
from app.config import Settings
from app.http.call_refusals import call_refused, capacity_error
from app.metrics import Metrics
from app.transports.webrtc.peer_call import OfferError


def counted(metrics: Metrics, type: str, code: str) -> float:
    return metrics.registry.get_sample_value("omni_rtc_errors_total", {"type": type, "code": code}) or 0.0


def test_capacity_error_is_429_with_retry_after():
    error = capacity_error(4)
    assert error.status_code == 429
    assert int(error.headers["Retry-After"]) > 0
    assert error.to_response().status_code == 429
    assert "4 sessions" in error.message


def test_a_full_server_is_a_429_too_many_sessions_and_counted(tmp_path):
    metrics = Metrics()
    answer = call_refused(CapacityError("all 3 sessions are in use"), Settings(cache_dir=tmp_path, max_sessions=3), metrics)
    assert (answer.status_code, answer.type, answer.code) == (429, "rate_limit_error", "too_many_sessions")
    assert "3 sessions" in answer.message
    assert counted(metrics, "rate_limit_error", "too_many_sessions") == 1


def test_too_many_calls_connecting_is_a_429_that_waits_out_the_connect_timeout_and_counted(tmp_path):
    metrics = Metrics()
    settings = Settings(cache_dir=tmp_path, max_connecting_per_client=2, connect_timeout_s=12.5)
    answer = call_refused(ConnectingLimitError("10.0.0.1 has 2 calls still connecting"), settings, metrics)
    assert (answer.status_code, answer.code) == (429, "too_many_connecting_calls")
    assert answer.headers["Retry-After"] == "13"
    assert "2 calls still connecting" in answer.message
    assert counted(metrics, "rate_limit_error", "too_many_connecting_calls") == 1


def test_a_refused_offer_is_a_400_in_its_own_words_with_the_cause_only_in_the_log(tmp_path, caplog):
    metrics = Metrics()
    try:
        raise OfferError("the SDP offer could not be parsed") from KeyError("fingerprint")
    except OfferError as exc:
        refusal = exc
    with caplog.at_level("WARNING", logger="app.http.errors"):
        answer = call_refused(refusal, Settings(cache_dir=tmp_path), metrics, call_id="rtc_1")
    assert (answer.status_code, answer.type, answer.code) == (400, "invalid_request_error", "invalid_sdp")
    assert answer.message == "the SDP offer could not be parsed"
    request_id = answer.headers["x-request-id"]
    [logged] = [record.getMessage() for record in caplog.records if request_id in record.getMessage()]
    assert "call rtc_1" in logged and "fingerprint" in logged
    assert counted(metrics, "invalid_request_error", "invalid_sdp") == 1

