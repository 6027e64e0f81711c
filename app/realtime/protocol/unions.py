"""The unions, one per direction (``ClientEvent``, ``ServerEvent``), and the client events'
strict parser (``parse_client_event``), which turns pydantic's errors into OpenAI's codes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any, get_args

import pydantic_core
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from app.realtime.protocol.client_events import (
    ConversationItemCreateEvent,
    ConversationItemDeleteEvent,
    ConversationItemRetrieveEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferAppendEvent,
    InputAudioBufferClearEvent,
    InputAudioBufferCommitEvent,
    InputImageBufferAppendEvent,
    OutputAudioBufferClearEvent,
    PlaybackAckEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    SessionFinishEvent,
    SessionUpdateEvent,
)
from app.realtime.protocol.protocol_error import ProtocolError
from app.realtime.protocol.server_events import (
    ConversationItemAddedEvent,
    ConversationItemDeletedEvent,
    ConversationItemDoneEvent,
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    ConversationItemInputAudioTranscriptionFailedEvent,
    ConversationItemRetrievedEvent,
    ConversationItemTruncatedEvent,
    ErrorEvent,
    InputAudioBufferClearedEvent,
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStartedEvent,
    InputAudioBufferSpeechStoppedEvent,
    InputAudioBufferTimeoutTriggeredEvent,
    OutputAudioBufferClearedEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
    PlaybackAcknowledgedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputAudioDeltaEvent,
    ResponseOutputAudioDoneEvent,
    ResponseOutputAudioTranscriptDeltaEvent,
    ResponseOutputAudioTranscriptDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputTextDeltaEvent,
    ResponseOutputTextDoneEvent,
    SessionCreatedEvent,
    SessionFinishedEvent,
    SessionUpdatedEvent,
)

ClientEvent = Annotated[
    SessionUpdateEvent
    | InputAudioBufferAppendEvent
    | InputAudioBufferCommitEvent
    | InputAudioBufferClearEvent
    | ConversationItemCreateEvent
    | ConversationItemDeleteEvent
    | ConversationItemRetrieveEvent
    | ConversationItemTruncateEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
    | OutputAudioBufferClearEvent
    | PlaybackAckEvent
    | InputImageBufferAppendEvent
    | SessionFinishEvent,
    Field(discriminator="type"),
]
_client_event_adapter: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES: tuple[str, ...] = tuple(
    get_args(model.model_fields["type"].annotation)[0] for model in get_args(get_args(ClientEvent)[0])
)
# The wire type of an audio append, which the event gate meets before the event is parsed.
APPEND_EVENT_TYPE: str = get_args(InputAudioBufferAppendEvent.model_fields["type"].annotation)[0]

# pydantic error types → OpenAI's error codes.
_MISSING_CODES = {"missing"}
_TYPE_CODES = {"string_type", "int_type", "float_type", "bool_type", "list_type", "dict_type", "model_type"}


def _param_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, str) and not part.isidentifier():
            continue  # a union member's tag ("constrained-int", "literal['inf']"), not a field
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += part if not path else f".{part}"
    return path


# Past this an event is parsed by pydantic-core's parser (jiter): only image uploads are let in
# that large, and they are parsed on the loop like any event; jiter reads a 14 MB one in ~8 ms
# where the json module takes ~49 (the loaded dev box). Both read valid JSON alike.
LARGE_EVENT_CHARS = 1024 * 1024
_JITER_POSITION = re.compile(r"at line (\d+) column (\d+)")


def _load_large(text: str) -> Any:
    try:
        return pydantic_core.from_json(text, cache_strings=False)  # an image upload's keys are few
    except ValueError as exc:
        where = _JITER_POSITION.search(str(exc))
        position = f" (line {where[1]}, column {where[2]})" if where else ""
        raise ProtocolError("invalid_json", f"The message is not valid JSON{position}.") from None


def parse_client_event(raw: str | bytes) -> ClientEvent:
    """One client event from its JSON text; raises ``ProtocolError`` naming the event's ``event_id``."""
    # The parser's own words never reach the client (errors carry fixed messages): where it
    # stopped is what helps.
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
        data = json.loads(text) if len(text) <= LARGE_EVENT_CHARS else _load_large(text)
    except UnicodeDecodeError:
        raise ProtocolError("invalid_json", "The message is not UTF-8 text.") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(
            "invalid_json", f"The message is not valid JSON (line {exc.lineno}, column {exc.colno})."
        ) from None
    # Valid JSON that Python refuses to hold: an integer over 4300 digits (ValueError, CPython's
    # int_max_str_digits) or nesting deeper than the recursion limit (~1000 levels).
    except (ValueError, RecursionError):
        raise ProtocolError(
            "invalid_json", "The message cannot be decoded: a number over 4,300 digits, or nesting over ~1,000 levels."
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_json", "A client event must be a JSON object.")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    event_type = data.get("type")
    if event_type is None:
        raise ProtocolError("missing_required_parameter", "Missing required parameter: 'type'.", param="type",
                            event_id=event_id)
    if event_type not in CLIENT_EVENT_TYPES:
        raise ProtocolError(
            "invalid_value",
            f"Invalid value: {event_type!r}. Supported values are: {', '.join(CLIENT_EVENT_TYPES)}.",
            param="type",
            event_id=event_id,
        )
    try:
        return _client_event_adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = tuple(first["loc"][1:])  # the first element is the union tag (the event type)
        param = _param_path(loc)
        if first["type"] == "union_tag_not_found" and not isinstance(first["input"], dict):
            code, message = "invalid_type", f"Invalid type for {param!r}: Input should be an object."
        elif first["type"] == "union_tag_not_found":
            param = f"{param}.type"
            code, message = "missing_required_parameter", f"Missing required parameter: {param!r}."
        elif first["type"] == "union_tag_invalid":
            param = f"{param}.type"
            expected = first.get("ctx", {}).get("expected_tags", "").replace("'", "").split(", ")
            tags = ", ".join(repr(tag.split(":", 1)[-1]) for tag in expected)
            code, message = "invalid_value", f"Invalid value for {param!r}: supported values are {tags}."
        elif first["type"] in _MISSING_CODES:
            code, message = "missing_required_parameter", f"Missing required parameter: {param!r}."
        elif first["type"] in _TYPE_CODES:
            code, message = "invalid_type", f"Invalid type for {param!r}: {first['msg']}."
        else:
            code, message = "invalid_value", f"Invalid value for {param!r}: {first['msg']}."
        raise ProtocolError(code, message, param=param or None, event_id=event_id) from None


ServerEvent = Annotated[
    ErrorEvent
    | SessionCreatedEvent
    | SessionUpdatedEvent
    | InputAudioBufferSpeechStartedEvent
    | InputAudioBufferSpeechStoppedEvent
    | InputAudioBufferCommittedEvent
    | InputAudioBufferClearedEvent
    | InputAudioBufferTimeoutTriggeredEvent
    | ConversationItemAddedEvent
    | ConversationItemDoneEvent
    | ConversationItemTruncatedEvent
    | ConversationItemDeletedEvent
    | ConversationItemRetrievedEvent
    | ConversationItemInputAudioTranscriptionDeltaEvent
    | ConversationItemInputAudioTranscriptionCompletedEvent
    | ConversationItemInputAudioTranscriptionFailedEvent
    | ResponseCreatedEvent
    | ResponseDoneEvent
    | ResponseOutputItemAddedEvent
    | ResponseOutputItemDoneEvent
    | ResponseFunctionCallArgumentsDeltaEvent
    | ResponseFunctionCallArgumentsDoneEvent
    | ResponseContentPartAddedEvent
    | ResponseContentPartDoneEvent
    | ResponseOutputAudioTranscriptDeltaEvent
    | ResponseOutputAudioTranscriptDoneEvent
    | ResponseOutputAudioDeltaEvent
    | ResponseOutputAudioDoneEvent
    | ResponseOutputTextDeltaEvent
    | ResponseOutputTextDoneEvent
    | OutputAudioBufferStartedEvent
    | OutputAudioBufferStoppedEvent
    | OutputAudioBufferClearedEvent
    | PlaybackAcknowledgedEvent
    | SessionFinishedEvent,
    Field(discriminator="type"),
]
server_event_adapter: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)
# How a session's parts send an event toward the client: the session's ``emit``.
EmitEvent = Callable[[ServerEvent], None]


def event_type(event: type[BaseModel]) -> str:
    """The wire ``type`` of a server event model, for code that reads events as JSON dicts."""
    return event.model_fields["type"].default
