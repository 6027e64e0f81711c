"""What a client is told when the server fails: a code, a fixed message, and an id for the log.

Exception text never reaches a client: it can name files, addresses, the model's internals, or
repeat what another caller sent. The client gets the failure's code and the fixed message below;
the event that tells it carries an ``event_id``, and the server logs the cause beside that id,
so "what was ``event_…``?" is one search of the log away.
"""

from __future__ import annotations

import logging
from typing import Literal

from app.realtime.protocol import (
    ConversationItemInputAudioTranscriptionFailedEvent,
    ErrorEvent,
    ProtocolError,
    TranscriptionError,
)
from pipeline.contract import EngineErrorCode

logger = logging.getLogger(__name__)

# An engine's failure by its code, or "server_error": one the server did not expect.
FailureCode = EngineErrorCode | Literal["server_error"]

# Every FailureCode but the preemptible ends (pipeline.contract.PREEMPTIBLE_ENDS), which are
# counted and never told: the fallback is for those, should one ever reach a client.
FAILURE_MESSAGES: dict[FailureCode, str] = {
    "engine_timeout": "The model produced nothing for too long; the response was stopped.",
    "engine_unavailable": "The model is not running right now; try again shortly.",
    "engine_died": "The model's process ended during the turn; it is being restarted.",
    "engine_load_failed": "The model could not be loaded.",
    "engine_protocol_error": "The model ended the turn without finishing it.",
    "engine_error": "The model failed on this turn.",
    "engine_stream_error": "The model server's stream broke off during the turn.",
    "engine_http_error": "The model server refused the turn.",
    "turn_too_large": "The conversation is too large to send to the model.",
    "context_length_exceeded": "The conversation is past its token budget and truncation is disabled: "
    "delete items, or set truncation to 'auto' or a retention_ratio.",
    "prompt_too_long": "The conversation's prompt is longer than the model takes; the response was not started.",
    "turn_event_too_large": "A part of the answer was too large to send.",
    "server_error": "The server failed to handle this; the session goes on.",
}


def failure_message(code: FailureCode) -> str:
    return FAILURE_MESSAGES.get(code, FAILURE_MESSAGES["server_error"])


def failure_event(code: FailureCode, cause: BaseException | str, *, where: str, client_event_id: str | None = None) -> ErrorEvent:
    """An ``error`` event (type ``server_error``) for a failure; its cause goes to the log with the event's id.

    ``where`` says what failed ("session sess_…: response resp_…"); ``cause`` is an expected
    failure's text (an ``EngineError``'s) or an unexpected exception, logged with its traceback.
    """
    event = ProtocolError(code, failure_message(code), event_id=client_event_id, type="server_error").to_event()
    _log(where, code, event.event_id, cause)
    return event


def transcription_failed_event(
    code: FailureCode, cause: BaseException | str, *, where: str, item_id: str, content_index: int
) -> ConversationItemInputAudioTranscriptionFailedEvent:
    """``conversation.item.input_audio_transcription.failed`` for a failure, logged with its event's id."""
    event = ConversationItemInputAudioTranscriptionFailedEvent(
        item_id=item_id,
        content_index=content_index,
        error=TranscriptionError(type="server_error", code=code, message=failure_message(code)),
    )
    _log(where, code, event.event_id, cause)
    return event


def _log(where: str, code: str, event_id: str, cause: BaseException | str) -> None:
    if isinstance(cause, BaseException):  # not a failure we expect: with its traceback
        logger.error("%s failed (%s, told in %s): %s", where, code, event_id, cause, exc_info=cause)
    else:
        logger.warning("%s failed (%s, told in %s): %s", where, code, event_id, cause)
