"""One ResponseRun against a scripted engine and a recorded port: a response's lifecycle without a session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.realtime.history import History
from app.realtime.playback import AnswerAudio
from app.realtime.response import Response, ResponseContext, ResponseRun
from app.realtime.session_config import SessionConfig
from app.realtime.turn_report import TurnReport
from pipeline.contract import EngineError, GenerationEvent, GenerationRequest, TextDelta
from tests.fakes import ScriptedEngine, VirtualAudioOutput
from tests.settle import settle


class RecordedOwner:
    """A session as the run sees it: every event it emits and every call it makes, in order."""

    def __init__(self, engine: ScriptedEngine, config: SessionConfig) -> None:
        self.events: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self.reports: list[TurnReport] = []
        self.config = config
        self.history = History()
        self.output = VirtualAudioOutput()
        self.audio = AnswerAudio(self.output)
        self.context = ResponseContext("sess_test", engine, self.history, self.audio)

    def emit(self, event: Any) -> None:
        self.events.append(event.to_json())

    def prune_history(self) -> None:
        self.calls.append("prune")

    def release_speculation(self, speculation: Any) -> None:
        self.calls.append("release")

    def response_done(self, run: ResponseRun, report: TurnReport) -> None:
        self.calls.append(f"finished {run.id}")
        self.reports.append(report)

    def response_over(self, run: ResponseRun) -> None:
        self.calls.append(f"over {run.id}")

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    def done(self) -> dict[str, Any]:
        (done,) = [event for event in self.events if event["type"] == "response.done"]
        return done["response"]


def start(engine: ScriptedEngine, config: SessionConfig) -> tuple[ResponseRun, RecordedOwner]:
    recorded = RecordedOwner(engine, config)
    response = Response.for_session(config, "conv_test", started_at=0.0)
    run = ResponseRun(response, recorded.context, recorded)
    run.start(None)
    return run, recorded


async def test_a_run_streams_its_answer_and_ends_completed_with_usage():
    run, recorded = start(ScriptedEngine("two words"), SessionConfig.from_session({"output_modalities": ["text"]}))
    await asyncio.wait({run.task})

    assert recorded.types() == [
        "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "conversation.item.done", "response.done",
    ]
    assert recorded.done()["status"] == "completed" and recorded.done()["usage"]["output_tokens"] > 0
    assert recorded.calls == ["prune", f"finished {run.id}", f"over {run.id}"]  # text: heard as written


async def test_an_audio_answer_goes_to_the_output_and_its_item_waits_to_be_heard():
    run, recorded = start(ScriptedEngine("one two three"), SessionConfig())
    await asyncio.wait({run.task})

    assert recorded.output.queued_samples > 0
    assert len(recorded.audio.ledger) == 1  # written, not yet played: history settles it as heard later
    assert recorded.done()["status"] == "completed"
    # What the session's observer hears: response.done's latency, from the times the report carries.
    (report,) = recorded.reports
    done = recorded.done()
    assert report.response_id == done["id"] and report.audio_item_id == done["output"][0]["id"]
    latency = [event for event in recorded.events if event["type"] == "response.done"][0]["latency"]
    assert report.latency is not None and report.latency.model_dump(mode="json") == latency
    assert report.first_audio_at is not None and report.engine_started_at is not None
    assert latency["end_of_speech_to_first_audio_ms"] == round((report.first_audio_at - report.started_at) * 1000, 1)
    assert report.engine_started_at <= report.first_audio_at <= report.done_at


async def test_a_turn_cut_by_max_output_tokens_is_incomplete():
    config = SessionConfig.from_session({"output_modalities": ["text"], "max_output_tokens": 1})
    engine = ScriptedEngine("one two three")
    run, recorded = start(engine, config)
    await asyncio.wait({run.task})

    done = recorded.done()
    assert done["status"] == "incomplete" and done["status_details"]["reason"] == "max_output_tokens"


async def test_a_cancelled_run_says_the_reason_and_its_task_ends_cancelled():
    engine = ScriptedEngine("one two three")
    engine.hold = asyncio.Event()  # the turn waits after its first word
    run, recorded = start(engine, SessionConfig.from_session({"output_modalities": ["text"]}))
    while "response.output_text.delta" not in recorded.types():
        await asyncio.sleep(0)

    task = run.cancel("turn_detected")
    await asyncio.wait({task})

    assert task.cancelled() and run.cancelling
    done = recorded.done()
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"


async def test_an_engine_failure_fails_the_response_with_its_code_and_an_error_event():
    engine = ScriptedEngine("one two three")
    engine.fail_next = EngineError("the engine broke", code="engine_error")
    run, recorded = start(engine, SessionConfig.from_session({"output_modalities": ["text"]}))
    await asyncio.wait({run.task})

    done = recorded.done()
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "engine_error"
    assert recorded.types()[-1] == "error"
    (report,) = recorded.reports
    assert (report.status, report.error_code, report.usage) == ("failed", "engine_error", None)


class SlowToCancelEngine(ScriptedEngine):
    """Its turns say one word, then wait; a cancelled one ends only once ``released`` is set."""

    def __init__(self) -> None:
        super().__init__("one")
        self.released = asyncio.Event()

    async def run_generation(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        try:
            yield TextDelta("one")
            await asyncio.Event().wait()
        finally:
            await self.released.wait()


async def test_a_run_waits_for_the_cancelled_run_before_it_to_send_its_response_done():
    engine = SlowToCancelEngine()
    config = SessionConfig.from_session({"output_modalities": ["text"]})
    first, recorded = start(engine, config)
    while "response.output_text.delta" not in recorded.types():
        await asyncio.sleep(0)
    first.cancel("client_cancelled")
    second = ResponseRun(Response.for_session(config, "conv_test", started_at=0.0), recorded.context, recorded)
    second.start(first)
    await settle()  # the second run would be announced by now if it did not wait
    engine.released.set()
    await asyncio.wait({first.task})
    await second.close()

    announced = [(event["type"], event["response"]["id"]) for event in recorded.events
                 if event["type"] in ("response.created", "response.done")]
    assert announced[:3] == [("response.created", first.id), ("response.done", first.id),
                             ("response.created", second.id)]


async def test_close_cancels_and_awaits_and_is_safe_twice():
    engine = ScriptedEngine("one two three")
    engine.hold = asyncio.Event()
    run, recorded = start(engine, SessionConfig.from_session({"output_modalities": ["text"]}))
    while "response.output_text.delta" not in recorded.types():
        await asyncio.sleep(0)

    await run.close()
    await run.close()

    assert run.task.done() and recorded.done()["status"] == "cancelled"


def test_a_run_never_started_has_no_task_to_await():
    config = SessionConfig()
    owner = RecordedOwner(ScriptedEngine(), config)
    run = ResponseRun(Response.for_session(config, "conv_test", started_at=0.0), owner.context, owner)

    with pytest.raises(RuntimeError, match="never started"):
        run.task  # noqa: B018
