"""``app.turn_timelines``: a session's events and reports as per-turn marks and spans, bounded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.realtime.turn_report import PlaybackReport, SessionStart, ToolCallReport, TurnReport
from app.turn_timelines import MAX_PENDING_MARKS, MAX_TURNS, SessionTimeline, TurnTimelines


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def report(response_id: str, **fields: Any) -> TurnReport:
    base = TurnReport(
        response_id=response_id, status="completed", status_reason=None, error_code=None, output_audio=True,
        temperature=0.8, max_output_tokens=None, started_at=101.0, silence_wait_ms=500.0, engine_started_at=101.0,
        timings=None, first_audio_at=101.3, done_at=102.0, latency=None, usage=None, finish_reason="stop",
        speculative=False, tool_calls=(), audio_item_id="item_a",
    )
    return replace(base, **fields)


def kinds(turn: dict[str, Any]) -> list[str]:
    return [mark["kind"] for mark in turn["marks"]]


def started(clock: Clock) -> SessionTimeline:
    timeline = SessionTimeline("webrtc", clock=clock)
    timeline.session_started(SessionStart("sess_1", "conv_1", "scripted", at=100.0))
    return timeline


def test_a_spoken_turn_has_its_marks_in_time_order_and_both_spans():
    clock = Clock()
    timeline = started(clock)
    for at, event in [
        (100.2, {"type": "input_audio_buffer.speech_started"}),
        (101.0, {"type": "input_audio_buffer.speech_stopped"}),
        (101.0, {"type": "input_audio_buffer.committed"}),
        (101.01, {"type": "response.created", "response": {"id": "resp_1"}}),
        (101.05, {"type": "response.output_audio.delta", "response_id": "resp_1"}),  # not marked
        (101.3, {"type": "output_audio_buffer.started", "response_id": "resp_1"}),
        (102.0, {"type": "response.done", "response": {"id": "resp_1"}}),
    ]:
        clock.now = at
        timeline.record_event(event)
    call = ToolCallReport("item_c", "call_1", "lookup", started_at=101.5, ended_at=101.6, status="completed")
    timeline.turn_done(report("resp_1", tool_calls=(call,)))
    timeline.playback_over(PlaybackReport("resp_1", "item_a", ended_at=103.0, played_samples=24_000 * 2,
                                          written_samples=24_000 * 2, truncated=False, interrupted=False))
    timeline.session_closed(104.0)
    shown = timeline.to_json()
    assert shown["session_id"] == "sess_1" and shown["closed_ms"] == 4000.0
    [turn] = shown["turns"]
    assert kinds(turn) == [
        "input_audio_buffer.speech_started", "end_of_speech", "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed", "engine_started", "response.created", "output_audio_buffer.started",
        "first_audio", "function_call", "response.done", "playback_end",
    ]
    assert [mark["at_ms"] for mark in turn["marks"]][:2] == [200.0, 500.0]
    assert turn["user_speech"] == {"start_ms": 200.0, "end_ms": 500.0}
    assert turn["answer_audio"] == {"start_ms": 1300.0, "end_ms": 3000.0}
    assert turn["played_ms"] == 2000.0 and turn["status"] == "completed"


def test_a_barge_in_leaves_the_cut_on_the_answer_and_the_new_speech_on_the_next_turn():
    clock = Clock()
    timeline = started(clock)
    timeline.record_event({"type": "response.created", "response": {"id": "resp_1"}})
    clock.now = 102.0
    timeline.record_event({"type": "input_audio_buffer.speech_started"})
    timeline.record_event({"type": "output_audio_buffer.cleared", "response_id": "resp_1"})
    timeline.record_event({"type": "response.done", "response": {"id": "resp_1"}})
    timeline.playback_over(PlaybackReport("resp_1", "item_a", ended_at=102.0, played_samples=100,
                                          written_samples=24_000, truncated=True, interrupted=True))
    timeline.turn_done(report("resp_1", status="cancelled", status_reason="turn_detected", silence_wait_ms=0.0,
                              started_at=100.0, engine_started_at=100.1, first_audio_at=100.5, done_at=102.5))
    clock.now = 103.0
    timeline.record_event({"type": "response.created", "response": {"id": "resp_2"}})
    first, second = timeline.to_json()["turns"]
    assert kinds(first) == ["response.created", "engine_started", "first_audio", "output_audio_buffer.cleared",
                            "response.done", "playback_end"]
    assert first["truncated"] is True and first["answer_audio"] == {"start_ms": 500.0, "end_ms": 2000.0}
    assert first["user_speech"] is None  # no silence waited through: not a spoken turn
    assert kinds(second) == ["input_audio_buffer.speech_started", "response.created"]


def test_turns_and_marks_are_bounded():
    clock = Clock()
    timeline = started(clock)
    for _ in range(MAX_PENDING_MARKS + 5):  # speech that never got a response
        timeline.record_event({"type": "input_audio_buffer.speech_started"})
    for index in range(MAX_TURNS + 5):
        timeline.record_event({"type": "response.created", "response": {"id": f"resp_{index}"}})
    turns = timeline.to_json()["turns"]
    assert len(turns) == MAX_TURNS and turns[0]["response_id"] == "resp_5"
    timeline.turn_done(report("resp_0"))  # dropped: nothing to add it to
    assert timeline.to_json()["turns"] == turns


def test_the_ring_keeps_the_last_sessions():
    timelines = TurnTimelines(capacity=3)
    for transport in ("webrtc", "websocket", "webrtc", "websocket"):
        timelines.new_session(transport)
    assert [session["transport"] for session in timelines.to_json()] == ["websocket", "webrtc", "websocket"]
