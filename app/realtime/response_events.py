"""The server events that open, stream and close a response (``app.realtime.response``), and
its settings read from ``response.create``.

The event sequences are plain functions that return events, so the order a client sees
(``response.created`` → ``response.output_item.added`` → ``conversation.item.added`` →
``response.content_part.added`` … deltas … ``response.output_audio.done`` →
``response.output_audio_transcript.done`` → ``response.content_part.done`` →
``response.output_item.done`` → ``conversation.item.done`` → ``response.done``) is tested
without a running session.

A response that may call functions (its tools offered: ``pipeline.tool_format.offers_tools``)
opens its message item at its first text or audio, not at once: an answer that is only calls
has no message. Each call is an item of its own after it (``output_item.added``,
``conversation.item.added``, ``function_call_arguments.delta`` … as the model writes it; then,
when the response ends, ``.done``, ``output_item.done``, ``conversation.item.done``), and
``response.done`` lists them all.
"""

from __future__ import annotations

import dataclasses

from app.realtime.input_readers import checked_text
from app.realtime.protocol import (
    ConversationItemAddedEvent,
    ConversationItemDoneEvent,
    InputTokenDetails,
    OutputTokenDetails,
    ProtocolError,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseCreateParams,
    ResponseDoneEvent,
    ResponseLatency,
    ResponseOutputAudioDoneEvent,
    ResponseOutputAudioTranscriptDeltaEvent,
    ResponseOutputAudioTranscriptDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputTextDeltaEvent,
    ResponseOutputTextDoneEvent,
    ResponseStatus,
    ResponseUsage,
    ServerEvent,
    StatusDetails,
    StatusError,
)
from app.realtime.response import Response
from app.realtime.session_config import read_max_output_tokens, read_voice
from app.realtime.tools import check_choice, read_tool_choice, read_tools
from pipeline.contract import TurnDone, TurnRequest, TurnTimings, Usage
from pipeline.conversation import Conversation


def ended_as(response: Response, done: TurnDone) -> tuple[ResponseStatus, str | None]:
    """The status (and reason) of a response whose engine turn ended with ``done``."""
    if done.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if done.finish_reason == "cancelled":
        return "cancelled", response.cancel_reason or "client_cancelled"
    return "completed", None


def turn_request(response: Response, conversation: Conversation) -> TurnRequest:
    """The engine turn that answers ``conversation`` with ``response``'s settings."""
    return TurnRequest(
        conversation=dataclasses.replace(conversation, tools=response.tools, tool_choice=response.tool_choice),
        voice=response.voice,
        temperature=response.temperature,
        max_output_tokens=response.max_output_tokens,
        output_audio=response.modality == "audio",
    )


def apply_response_params(response: Response, params: ResponseCreateParams, *, max_chars: int) -> None:
    """``response.create``'s overrides of the session's settings, each checked (``ProtocolError``)."""
    if params.input is not None:
        raise ProtocolError(
            "invalid_value", "Responses always use the session's conversation; 'input' is not supported.",
            param="response.input",
        )
    modalities = params.output_modalities or params.modalities
    if modalities:
        response.modality = "audio" if "audio" in modalities else "text"
    voice = params.audio.output.voice if params.audio and params.audio.output else params.voice
    if voice is not None:
        response.voice = read_voice(voice, "response.audio.output.voice", response.voice)
    if params.temperature is not None:
        response.temperature = params.temperature
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if key in params.model_fields_set:
            response.max_output_tokens = read_max_output_tokens(getattr(params, key), f"response.{key}")
    if params.instructions is not None:
        response.instructions = checked_text(params.instructions, "response.instructions", max_chars=max_chars)
    if params.tools is not None:
        response.tools = read_tools(params.tools, "response.tools", max_chars=max_chars)
    if params.tool_choice is not None:
        response.tool_choice = read_tool_choice(params.tool_choice, "response.tool_choice")
    check_choice(response.tools, response.tool_choice, "response.tool_choice")
    response.metadata = params.metadata


def announce_events(response: Response, previous_item_id: str | None) -> list[ServerEvent]:
    """``response.created`` and the empty output item and part, once ``response.entry`` is set."""
    return [created_event(response), *message_events(response, previous_item_id)]


def created_event(response: Response) -> ServerEvent:
    response.announced = True
    return ResponseCreatedEvent(response=response.object("in_progress"))


def message_events(response: Response, previous_item_id: str | None) -> list[ServerEvent]:
    """The message item, empty, and its part, once ``response.entry`` is set."""
    entry = response.entry
    assert entry is not None
    index = response.output.index(entry)
    return [
        ResponseOutputItemAddedEvent(response_id=response.id, output_index=index, item=entry.item()),
        ConversationItemAddedEvent(previous_item_id=previous_item_id, item=entry.item()),
        ResponseContentPartAddedEvent(**response.content_ids(), part=response.part("")),
    ]


def delta_event(response: Response, text: str) -> ServerEvent:
    if response.modality == "audio":
        return ResponseOutputAudioTranscriptDeltaEvent(**response.content_ids(), delta=text)
    return ResponseOutputTextDeltaEvent(**response.content_ids(), delta=text)


def finish_events(
    response: Response,
    status: ResponseStatus,
    *,
    previous_item_id: str | None,
    reason: str | None = None,
    done: TurnDone | None = None,
    error_code: str | None = None,
) -> list[ServerEvent]:
    """The events that close the response; marks its item completed or incomplete.

    A response cancelled before it was announced (``response.entry`` unset) gets its
    ``response.created`` here, so every ``response.done`` has one before it. Sets
    ``output_started``: work waiting for the answer's first output need wait no longer.
    """
    response.output_started.set()
    entry = response.entry
    events: list[ServerEvent] = []
    if not response.announced:
        events.append(created_event(response))
    if entry is not None:
        ids = response.content_ids()
        if response.modality == "audio":
            events.append(ResponseOutputAudioDoneEvent(**ids))
            events.append(ResponseOutputAudioTranscriptDoneEvent(**ids, transcript=entry.text))
        else:
            events.append(ResponseOutputTextDoneEvent(**ids, text=entry.text))
        events.append(ResponseContentPartDoneEvent(**ids, part=response.part(entry.text)))
        entry.status = "completed" if status == "completed" else "incomplete"
        index = response.output.index(entry)
        events.append(ResponseOutputItemDoneEvent(response_id=response.id, output_index=index, item=entry.item()))
        events.append(ConversationItemDoneEvent(previous_item_id=previous_item_id, item=entry.item()))
    details = None
    if status != "completed":
        details = StatusDetails(
            type=status,
            reason=reason,
            error=StatusError(type="server_error", code=error_code) if error_code else None,
        )
    elif response.call_problems:  # delivered as the model wrote them; the client should know
        details = StatusDetails(
            type="completed",
            error=StatusError(
                type="invalid_function_call", code="invalid_function_arguments",
                message="; ".join(response.call_problems),
            ),
        )
    events.append(
        ResponseDoneEvent(
            response=response.object(
                status,
                status_details=details,
                output=[item.item() for item in response.output],
                usage=response_usage(done.usage) if done is not None else None,
            ),
            latency=latency(response, done.timings if done is not None else None),
        )
    )
    return events


def response_usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        input_token_details=InputTokenDetails(
            text_tokens=usage.input_text_tokens,
            audio_tokens=usage.input_audio_tokens,
            image_tokens=usage.input_image_tokens,
        ),
        output_token_details=OutputTokenDetails(
            text_tokens=usage.output_text_tokens, audio_tokens=usage.output_audio_tokens
        ),
    )


def latency(response: Response, timings: TurnTimings | None) -> ResponseLatency | None:
    """Where the time from end of speech to first audio went; None for a response without audio.

    First audio is the first frame handed to the transport when the output reported it (a paced
    WebRTC track), else the first chunk handed to the output. A speculative answer's engine time
    is split at the commit (``ResponseLatency``).
    """
    if response.first_audio_at is None:
        return None
    first_audio_at = response.first_frame_sent_at or response.first_audio_at
    to_first_audio_ms = response.silence_wait_ms + (first_audio_at - response.started_at) * 1000
    engine_ms = timings.first_audio * 1000 if timings is not None and timings.first_audio is not None else None
    hidden_ms = 0.0
    if response.speculation_started_at is not None and engine_ms is not None:
        hidden_ms = min(engine_ms, max(0.0, (response.started_at - response.speculation_started_at) * 1000))
        engine_ms -= hidden_ms
    return ResponseLatency(
        end_of_speech_to_first_audio_ms=round(to_first_audio_ms, 1),
        silence_wait_ms=round(response.silence_wait_ms, 1),
        engine_first_audio_ms=None if engine_ms is None else round(engine_ms, 1),
        queue_wait_ms=round(timings.queue_wait * 1000, 1) if timings is not None else 0.0,
        other_ms=round(to_first_audio_ms - response.silence_wait_ms - (engine_ms or 0.0), 1),
        speculative=response.speculation_started_at is not None,
        speculation_hidden_ms=round(hidden_ms, 1),
    )
