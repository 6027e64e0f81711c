"""A response's function calls without a session: call items streamed as the engine writes them,
then completed or left incomplete when the response ends."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.realtime.history import AssistantEntry, FunctionCallEntry, History, UserEntry
from app.realtime.protocol import InputTextContent, ResponseStatus, ServerEvent, server_event_adapter
from app.realtime.response import Response, call_events, check_arguments, close_calls
from app.realtime.session_config import SessionConfig
from pipeline.contract import FunctionCallDelta, FunctionCallDone, FunctionCallStarted
from pipeline.conversation import UserText
from pipeline.tool_format import Tool

GET_TIME = Tool(
    name="get_time",
    description="The current local time in a timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)
PARIS = '{"timezone": "Europe/Paris"}'


def response(*, with_message: bool = True) -> Response:
    made = Response.for_session(SessionConfig(), "conv_1", started_at=0.0)
    made.tools = (GET_TIME,)
    if with_message:
        made.entry = AssistantEntry("item_answer", made.modality)
    made.announced = True
    return made


def history_with(made: Response) -> History:
    """The user's item, then the response's message (if it has one)."""
    history = History()
    history.append(UserEntry("item_user", (UserText("What time is it?"),), [InputTextContent(text="What time is it?")]))
    if made.entry is not None:
        history.append(made.entry)
    return history


def types(events: Sequence[ServerEvent]) -> list[str]:
    return [event.to_json()["type"] for event in events]


def written_call(made: Response, history: History, *, name: str = "get_time", arguments: str = PARIS,
                 closed: bool = True, well_formed: bool = True) -> FunctionCallEntry:
    """A call the engine started, streamed and finished (as ``closed`` and ``well_formed`` say)."""
    index = len(made.calls)
    call_events(made, FunctionCallStarted(index, name), history)
    call_events(made, FunctionCallDelta(index, arguments), history)
    call_events(made, FunctionCallDone(index, name, arguments, closed=closed, well_formed=well_formed), history)
    return made.calls[index]


def test_a_started_call_is_a_new_item_after_the_responses_message():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    (call,) = made.calls
    assert made.output == [made.entry, call]
    assert (call.name, call.arguments, call.status) == ("get_time", "", "in_progress")
    assert call.id.startswith("item_") and call.call_id.startswith("call_")


def test_a_started_call_joins_the_history_last():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    assert list(history)[-1] is made.calls[0]
    assert len(history) == 3


def test_a_started_call_is_announced_as_an_output_item_and_a_conversation_item():
    made = response()
    history = history_with(made)
    events = call_events(made, FunctionCallStarted(0, "get_time"), history)
    call = made.calls[0]
    assert types(events) == ["response.output_item.added", "conversation.item.added"]
    added, item_added = (event.to_json() for event in events)
    assert (added["response_id"], added["output_index"]) == (made.id, 1)
    assert added["item"] == item_added["item"] == {
        "id": call.id, "type": "function_call", "object": "realtime.item", "status": "in_progress",
        "call_id": call.call_id, "name": "get_time", "arguments": "",
    }
    assert item_added["previous_item_id"] == "item_answer"


def test_a_call_with_no_message_before_it_is_the_first_output():
    made = response(with_message=False)
    history = history_with(made)
    events = call_events(made, FunctionCallStarted(0, "get_time"), history)
    assert events[0].to_json()["output_index"] == 0
    assert events[1].to_json()["previous_item_id"] == "item_user"


def test_each_started_call_is_an_item_of_its_own():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    events = call_events(made, FunctionCallStarted(1, "get_time"), history)
    first, second = made.calls
    assert first.id != second.id and first.call_id != second.call_id
    assert events[0].to_json()["output_index"] == 2
    assert events[1].to_json()["previous_item_id"] == first.id


def test_a_delta_grows_the_calls_arguments():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    call_events(made, FunctionCallDelta(0, '{"timezone": '), history)
    call_events(made, FunctionCallDelta(0, '"Europe/Paris"}'), history)
    assert made.calls[0].arguments == PARIS


def test_a_delta_is_one_arguments_delta_event_naming_its_call():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    events = call_events(made, FunctionCallDelta(0, '{"timezone": '), history)
    call = made.calls[0]
    assert types(events) == ["response.function_call_arguments.delta"]
    delta = events[0].to_json()
    assert (delta["response_id"], delta["item_id"], delta["call_id"], delta["output_index"]) == (
        made.id, call.id, call.call_id, 1,
    )
    assert delta["delta"] == '{"timezone": '


def test_a_delta_goes_to_the_call_of_its_index():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    call_events(made, FunctionCallStarted(1, "get_time"), history)
    call_events(made, FunctionCallDelta(1, "{}"), history)
    assert [call.arguments for call in made.calls] == ["", "{}"]


def test_a_done_call_emits_nothing_and_takes_the_arguments_as_written():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    call_events(made, FunctionCallDelta(0, '{"timezone": "Eur'), history)
    done = FunctionCallDone(0, "get_time", PARIS)
    assert call_events(made, done, history) == []
    call = made.calls[0]
    assert call.arguments == PARIS and call.status == "in_progress"
    assert made.written == {call.id: done}


@pytest.mark.parametrize(("response_status", "call_status"), [
    ("completed", "completed"),
    ("incomplete", "completed"),  # cut at its token limit after the call was written whole
    ("failed", "incomplete"),
])
def test_a_closed_call_is_completed_only_when_its_response_completed_or_was_cut_at_its_limit(
    response_status: ResponseStatus, call_status: str
):
    made = response()
    history = history_with(made)
    call = written_call(made, history)
    close_calls(made, response_status, history, check_arguments(made))
    assert call.status == call_status
    assert made.call_problems == []


def test_a_completed_call_gets_arguments_done_then_its_item_done_events():
    made = response()
    history = history_with(made)
    call = written_call(made, history)
    events = close_calls(made, "completed", history, check_arguments(made))
    assert types(events) == [
        "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done",
    ]
    arguments_done, output_done, item_done = (event.to_json() for event in events)
    assert (arguments_done["item_id"], arguments_done["call_id"], arguments_done["output_index"]) == (
        call.id, call.call_id, 1,
    )
    assert (arguments_done["name"], arguments_done["arguments"]) == ("get_time", PARIS)
    assert output_done["output_index"] == 1 and output_done["response_id"] == made.id
    assert output_done["item"]["status"] == item_done["item"]["status"] == "completed"
    assert item_done["previous_item_id"] == "item_answer"


def test_a_call_the_model_did_not_close_is_incomplete_without_arguments_done():
    made = response()
    history = history_with(made)
    call = written_call(made, history, arguments='{"timezone": "Eur', closed=False)
    events = close_calls(made, "completed", history, check_arguments(made))
    assert call.status == "incomplete"
    assert types(events) == ["response.output_item.done", "conversation.item.done"]
    assert events[0].to_json()["item"]["arguments"] == '{"timezone": "Eur'
    assert made.call_problems == []


def test_a_call_the_engine_never_finished_is_incomplete():
    made = response()
    history = history_with(made)
    call_events(made, FunctionCallStarted(0, "get_time"), history)
    call_events(made, FunctionCallDelta(0, '{"time'), history)
    events = close_calls(made, "completed", history, check_arguments(made))
    assert made.calls[0].status == "incomplete"
    assert types(events) == ["response.output_item.done", "conversation.item.done"]


def test_every_call_of_a_cancelled_response_is_incomplete():
    made = response()
    history = history_with(made)
    written_call(made, history)
    written_call(made, history)
    events = close_calls(made, "cancelled", history, check_arguments(made))
    assert [call.status for call in made.calls] == ["incomplete", "incomplete"]
    assert "response.function_call_arguments.done" not in types(events)
    assert types(events).count("response.output_item.done") == 2


def test_calls_are_closed_in_output_order_each_after_its_predecessor():
    made = response()
    history = history_with(made)
    first = written_call(made, history)
    second = written_call(made, history)
    events = [event.to_json() for event in close_calls(made, "completed", history, check_arguments(made))]
    item_done = [event for event in events if event["type"] == "conversation.item.done"]
    assert [event["item"]["id"] for event in item_done] == [first.id, second.id]
    assert [event["previous_item_id"] for event in item_done] == ["item_answer", first.id]


def test_a_call_that_is_not_well_formed_is_delivered_and_named_a_problem():
    made = response()
    history = history_with(made)
    call = written_call(made, history, name="", arguments="get_time Paris", well_formed=False)
    events = close_calls(made, "completed", history, check_arguments(made))
    assert call.status == "completed"
    assert events[0].to_json()["arguments"] == "get_time Paris"
    assert made.call_problems == [f'{call.call_id} (no name): the call is not {{"name": …, "arguments": …}}']


def test_a_call_whose_arguments_do_not_fit_its_function_is_named_a_problem():
    made = response()
    history = history_with(made)
    call = written_call(made, history, arguments='{"city": "Paris"}')
    close_calls(made, "completed", history, check_arguments(made))
    (problem,) = made.call_problems
    assert problem.startswith(f"{call.call_id} (get_time): the arguments do not match the parameters of 'get_time'")


def test_a_call_of_a_function_that_is_not_a_tool_is_named_a_problem():
    made = response()
    history = history_with(made)
    call = written_call(made, history, name="get_weather", arguments="{}")
    close_calls(made, "completed", history, check_arguments(made))
    assert made.call_problems == [f"{call.call_id} (get_weather): the function 'get_weather' is not one of the tools"]


def test_a_call_that_was_never_made_is_no_problem():
    made = response()
    history = history_with(made)
    written_call(made, history, arguments="get_time Paris", well_formed=False)
    close_calls(made, "cancelled", history, check_arguments(made))
    assert made.call_problems == []


def test_every_call_event_is_a_valid_server_event():
    made = response()
    history = history_with(made)
    events = call_events(made, FunctionCallStarted(0, "get_time"), history)
    events += call_events(made, FunctionCallDelta(0, PARIS), history)
    events += call_events(made, FunctionCallDone(0, "get_time", PARIS), history)
    events += call_events(made, FunctionCallStarted(1, "get_time"), history)
    events += close_calls(made, "completed", history, check_arguments(made))
    for event in events:
        server_event_adapter.validate_python(event.to_json())
