"""What a session refuses or turns off for what its engine cannot do (app/realtime/session_config.py).

The engine is the scripted fake with one capability off; what the client sees is the refusal (an
``error`` naming the field, nothing changed, the session going on) or the session's effective
settings, and what the engine sees is that no turn needing the capability reached it.
"""

from __future__ import annotations

import dataclasses

from app.realtime.session_config import InputTranscription, SessionConfig
from media.frames import SampledFrame
from pipeline.contract import EngineCapabilities
from pipeline.conversation import UserImage
from pipeline.tool_format import Tool, ToolChoice
from tests.app.realtime.test_session_tools import GET_TIME
from tests.fakes import FULL_CAPABILITIES, EnergyVad, ScriptedEngine, SessionHarness
from tests.pictures import data_url, encoded
from tests.settle import settle
from tests.speech import silence, tone

NO_CALLS = dataclasses.replace(FULL_CAPABILITIES, function_calls=False, forced_function_calls=False)
NO_FORCED_CALLS = dataclasses.replace(FULL_CAPABILITIES, forced_function_calls=False)  # vLLM-Omni's
NO_IMAGES = dataclasses.replace(FULL_CAPABILITIES, images=False)
NO_PREEMPTIBLE_TURNS = dataclasses.replace(FULL_CAPABILITIES, preemptible_generations=False)
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]}


async def started(capabilities: EngineCapabilities, config: SessionConfig | None = None) -> SessionHarness:
    harness = SessionHarness(ScriptedEngine("It is noon.", capabilities=capabilities), EnergyVad(), config)
    await harness.session.start()
    return harness


# -- function calls ------------------------------------------------------------------------------


async def test_without_function_calls_a_session_update_forcing_a_call_is_refused_and_nothing_changes():
    h = await started(NO_CALLS)
    await h.send(type="session.update", event_id="e1",
                 session={"instructions": "Be brief.", "tools": [GET_TIME], "tool_choice": "required"})
    error = h.last("error")["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "tools_unsupported"
    assert error["param"] == "session.tool_choice" and error["event_id"] == "e1"
    assert "session.updated" not in h.types()
    assert h.session.config.instructions is None and h.session.config.tools == ()
    await h.send(type="session.update", session={"instructions": "Be brief."})
    assert h.last("session.updated")["session"]["instructions"] == "Be brief."  # the session goes on
    await h.session.close()


async def test_without_function_calls_tools_the_model_may_leave_alone_are_kept():
    h = await started(NO_CALLS)
    await h.send(type="session.update", session={"tools": [GET_TIME], "tool_choice": "auto"})
    session = h.last("session.updated")["session"]
    assert [tool["name"] for tool in session["tools"]] == ["get_time"] and session["tool_choice"] == "auto"
    assert "error" not in h.types()
    await h.session.close()


async def test_without_function_calls_a_response_forcing_a_call_is_refused_before_it_starts():
    h = await started(NO_CALLS)
    await h.send(type="conversation.item.create", item=TEXT)
    await h.send(type="response.create", event_id="e2",
                 response={"tools": [GET_TIME], "tool_choice": {"type": "function", "name": "get_time"}})
    await settle()  # a response started despite the refusal would have reached the engine by now
    error = h.last("error")["error"]
    assert error["code"] == "tools_unsupported" and error["param"] == "response.tool_choice"
    assert error["event_id"] == "e2"
    assert "response.created" not in h.types() and not h.engine.requests
    await h.send(type="response.create")
    assert (await h.turn_done())["response"]["status"] == "completed"
    await h.session.close()


async def test_without_function_calls_a_function_call_item_is_refused_and_not_added():
    h = await started(NO_CALLS)
    await h.send(type="conversation.item.create", event_id="e3",
                 item={"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"})
    error = h.last("error")["error"]
    assert error["code"] == "tools_unsupported" and error["param"] == "item.type" and error["event_id"] == "e3"
    assert "conversation.item.added" not in h.types()
    await h.session.close()


async def test_without_function_calls_a_function_call_output_item_is_refused_for_its_type():
    h = await started(NO_CALLS)
    await h.send(type="conversation.item.create",
                 item={"type": "function_call_output", "call_id": "call_1", "output": "noon"})
    error = h.last("error")["error"]
    assert error["code"] == "tools_unsupported" and error["param"] == "item.type"
    await h.session.close()


async def test_without_function_calls_a_first_session_forcing_a_call_starts_with_auto_and_an_error():
    config = SessionConfig(tools=(Tool("get_time"),), tool_choice=ToolChoice("required"))
    h = await started(NO_CALLS, config)
    assert h.types() == ["session.created", "error"]
    assert h.last("session.created")["session"]["tool_choice"] == "auto"
    error = h.last("error")["error"]
    assert error["code"] == "tools_unsupported" and error["param"] == "session.tool_choice"
    await h.session.close()


async def test_without_forced_calls_a_tool_choice_forcing_one_is_refused_and_auto_stays():
    h = await started(NO_FORCED_CALLS)
    await h.send(type="session.update", event_id="e5", session={"tools": [GET_TIME], "tool_choice": "required"})
    error = h.last("error")["error"]
    assert error["code"] == "tools_unsupported" and error["param"] == "session.tool_choice"
    assert "start an answer with a call" in error["message"]
    await h.send(type="session.update", session={"tools": [GET_TIME]})
    assert h.last("session.updated")["session"]["tool_choice"] == "auto"
    await h.send(type="response.create", event_id="e6", response={"tool_choice": {"type": "function", "name": "get_time"}})
    assert h.last("error")["error"]["param"] == "response.tool_choice" and not h.engine.requests
    await h.session.close()


async def test_without_forced_calls_calls_and_outputs_join_the_conversation():
    h = await started(NO_FORCED_CALLS)
    await h.send(type="conversation.item.create",
                 item={"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"})
    await h.send(type="conversation.item.create",
                 item={"type": "function_call_output", "call_id": "call_1", "output": "noon"})
    assert [e["item"]["type"] for e in h.of_type("conversation.item.added")] == ["function_call", "function_call_output"]
    assert "error" not in h.types()
    await h.session.close()


async def test_with_function_calls_a_session_forcing_a_call_is_taken():
    h = await started(FULL_CAPABILITIES)
    await h.send(type="session.update", session={"tools": [GET_TIME], "tool_choice": "required"})
    assert h.last("session.updated")["session"]["tool_choice"] == "required"
    assert "error" not in h.types()
    await h.session.close()


# -- images --------------------------------------------------------------------------------------


async def test_without_images_an_input_image_is_refused_and_not_added():
    h = await started(NO_IMAGES)
    image = {"type": "input_image", "image_url": data_url(encoded(64, 48, seed=1))}
    await h.send(type="conversation.item.create", event_id="e4",
                 item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "This?"}, image]})
    error = h.last("error")["error"]
    assert error["code"] == "images_unsupported" and error["param"] == "item.content[1]"
    assert error["type"] == "invalid_request_error" and error["event_id"] == "e4"
    assert "conversation.item.added" not in h.types()
    await h.session.close()


async def test_without_images_a_pushed_camera_frame_is_refused():
    h = await started(NO_IMAGES)
    await h.send(type="input_image_buffer.append", image="aGVsbG8=", event_id="e5")
    error = h.last("error")["error"]
    assert error["code"] == "images_unsupported" and error["param"] == "image" and error["event_id"] == "e5"
    await h.session.close()


async def test_without_images_camera_frames_are_not_sampled_and_never_join_a_turn():
    h = await started(NO_IMAGES)
    await h.send(type="session.update", session={"video": {"frames_per_turn": 4}})
    assert h.last("session.updated")["session"]["video"]["frames_per_turn"] == 0
    assert h.session.video_plan() is None
    h.session.add_video_frame(SampledFrame(encoded(64, 48, seed=1), 64, 48))
    h.push(tone(600))
    h.push(silence(700))
    await h.turn_done()
    assert h.session.stats()["images"] == 0
    assert not [item for request in h.engine.requests for item in request.conversation.items
                if isinstance(item, UserImage)]
    await h.session.close()


# -- preemptible turns ---------------------------------------------------------------------------


async def test_without_preemptible_generations_a_session_has_no_speculative_answers_or_partial_transcripts():
    config = SessionConfig(transcription=InputTranscription(model="any"))
    h = await started(NO_PREEMPTIBLE_TURNS, config)
    session = h.last("session.created")["session"]
    assert session["audio"]["input"]["turn_detection"]["speculative_response"] is False
    assert session["audio"]["input"]["transcription"]["partials"] is False
    await h.send(type="session.update", session={"audio": {"input": {
        "turn_detection": {"type": "server_vad", "speculative_response": True},
        "transcription": {"model": "any", "partials": True}}}})
    session = h.last("session.updated")["session"]
    assert session["audio"]["input"]["turn_detection"]["speculative_response"] is False
    assert session["audio"]["input"]["transcription"]["partials"] is False
    for _ in range(15):  # 3 s of speech, in pieces: partials would be due every second
        h.push(tone(200))
        await settle()
    h.push(silence(700))
    await h.turn_done()
    assert h.engine.requests and all(request.preemptible_id is None for request in h.engine.requests)
    assert h.speculations == [] and h.partials == []
    await h.session.close()


async def test_with_preemptible_generations_a_pause_starts_a_speculative_answer():
    h = await started(FULL_CAPABILITIES)
    h.push(tone(600))
    h.push(silence(200))
    await settle()
    assert [request.preemptible_id is not None for request in h.engine.requests] == [True]
    await h.session.close()
