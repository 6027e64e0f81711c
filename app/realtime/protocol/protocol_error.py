"""Errors as data: a client's mistake is a ``ProtocolError``, answered with an ``error`` event."""

from __future__ import annotations

from app.realtime.protocol.server_events import ErrorDetails, ErrorEvent


class ProtocolError(Exception):
    """A client mistake; the session answers it with an ``error`` event and goes on."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.type = type

    def for_event(self, event_id: str | None) -> ProtocolError:
        """The same error naming the client event that caused it."""
        return ProtocolError(self.code, self.message, param=self.param, event_id=event_id, type=self.type)

    def to_event(self) -> ErrorEvent:
        return ErrorEvent(
            error=ErrorDetails(
                type=self.type, code=self.code, message=self.message, param=self.param, event_id=self.event_id
            )
        )


def invalid_value(param: str, why: str) -> ProtocolError:
    """``invalid_value`` for ``param``, in OpenAI's words: "Invalid value for 'param': why."."""
    return ProtocolError("invalid_value", f"Invalid value for {param!r}: {why}.", param=param)
