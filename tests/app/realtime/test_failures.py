"""What a client is told of a failure: a fixed message for every engine error code that can reach it."""

from __future__ import annotations

from typing import get_args

from app.realtime.failures import FAILURE_MESSAGES, failure_message
from pipeline.contract import PREEMPTIBLE_ENDS, EngineErrorCode


def test_every_engine_error_code_a_client_can_be_told_has_its_own_message():
    told = set(get_args(EngineErrorCode)) - PREEMPTIBLE_ENDS
    assert set(FAILURE_MESSAGES) - {"server_error"} == told


def test_the_preemptible_ends_are_engine_error_codes_and_never_told():
    assert PREEMPTIBLE_ENDS <= set(get_args(EngineErrorCode))
    assert not PREEMPTIBLE_ENDS & set(FAILURE_MESSAGES)


def test_a_code_without_a_message_is_told_the_server_errors():
    assert failure_message("preempted") == FAILURE_MESSAGES["server_error"]
