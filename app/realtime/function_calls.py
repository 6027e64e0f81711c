"""A response's function calls: each an item of its own, its arguments streamed as the model
writes them, and done when the response is (a client runs a call at its ``output_item.done`` and
asks for the next response at once, which it may only do once this one is over; OpenAI sends a
call's done events last as well)."""

from __future__ import annotations

from app.realtime.entries import FunctionCallEntry
from app.realtime.history import History
from app.realtime.protocol import (
    ConversationItemAddedEvent,
    ConversationItemDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseStatus,
    ServerEvent,
    new_id,
)
from app.realtime.response import Response
from app.realtime.tools import arguments_problem
from pipeline.contract import FunctionCallDelta, FunctionCallEvent, FunctionCallStarted


def call_events(response: Response, event: FunctionCallEvent, history: History) -> list[ServerEvent]:
    """What a call event of the engine adds: a new call item, a piece of its arguments, or
    nothing yet (the call written whole is told when the response ends: ``close_calls``)."""
    if isinstance(event, FunctionCallStarted):
        call = FunctionCallEntry(new_id("item"), new_id("call"), event.name)
        response.output.append(call)
        return call_added_events(response, call, history.append(call))
    call = response.calls[event.index]
    if isinstance(event, FunctionCallDelta):
        call.arguments += event.delta
        return [call_delta_event(response, call, event.delta)]
    call.arguments = event.arguments
    response.written[call.id] = event
    return []


def close_calls(response: Response, status: ResponseStatus, history: History) -> list[ServerEvent]:
    """Each call done as ``response`` ends with ``status``. A call the model wrote whole is
    completed unless the response was cancelled or failed; one it did not finish is incomplete
    (and never reaches a prompt). Arguments that are not what the function takes are delivered as
    written, and ``response.done`` says so (``response.call_problems``)."""
    events: list[ServerEvent] = []
    for call in response.calls:
        written = response.written.get(call.id)
        made = written is not None and written.closed and status in ("completed", "incomplete")
        call.status = "completed" if made else "incomplete"
        if made and written is not None:
            problem = None if written.well_formed else 'the call is not {"name": …, "arguments": …}'
            if problem or (problem := arguments_problem(response.tools, call.name, call.arguments)):
                response.call_problems.append(f"{call.call_id} ({call.name or 'no name'}): {problem}")
        events.extend(call_done_events(response, call, history.previous_id(call)))
    return events


def call_added_events(response: Response, call: FunctionCallEntry, previous_item_id: str | None) -> list[ServerEvent]:
    """A function call the model began (its name known, its arguments to come)."""
    index = response.output.index(call)
    return [
        ResponseOutputItemAddedEvent(response_id=response.id, output_index=index, item=call.item()),
        ConversationItemAddedEvent(previous_item_id=previous_item_id, item=call.item()),
    ]


def call_delta_event(response: Response, call: FunctionCallEntry, delta: str) -> ServerEvent:
    return ResponseFunctionCallArgumentsDeltaEvent(**response.call_ids(call), delta=delta)


def call_done_events(response: Response, call: FunctionCallEntry, previous_item_id: str | None) -> list[ServerEvent]:
    """A call written whole (``call.status`` completed) or cut off (incomplete: no arguments done)."""
    events: list[ServerEvent] = []
    if call.status == "completed":
        events.append(ResponseFunctionCallArgumentsDoneEvent(**response.call_ids(call), name=call.name,
                                                              arguments=call.arguments))
    index = response.output.index(call)
    events.append(ResponseOutputItemDoneEvent(response_id=response.id, output_index=index, item=call.item()))
    events.append(ConversationItemDoneEvent(previous_item_id=previous_item_id, item=call.item()))
    return events
