"""A session's spans as its observer draws them: barge-in, a close mid-answer, a failure.

The session hears real speech through the real Silero VAD (``tests/fixtures``); the spans go to the
SDK's in-memory exporter. The collector end of the path: tests/app/test_tracing.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app.realtime.protocol import NetworkLatency
from app.realtime.session_config import SessionConfig, TurnDetection
from app.session_spans import SessionSpans, WallClock
from media.vad import SileroVad
from pipeline.contract import EngineError
from tests.fakes import CODEC_FRAME_SAMPLES, ScriptedEngine, SessionHarness
from tests.speech import load_fixture, silence

BARGE_IN = SessionConfig(turn_detection=TurnDetection(interrupt_response=True))


@pytest.fixture(scope="module")
def vad() -> SileroVad:
    return SileroVad.load()


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


def harness(engine: ScriptedEngine, vad: SileroVad, exporter: InMemorySpanExporter,
            config: SessionConfig | None = None) -> SessionHarness:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = SessionSpans(provider.get_tracer("test"), WallClock.now(), "webrtc")
    return SessionHarness(engine, vad, config, observer=spans)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()
            if span.parent is not None and span.parent.span_id == parent.context.span_id}


async def test_a_barge_in_marks_the_turn_interrupted_and_its_playback_truncated_where_it_was_cut(vad, exported):
    async with harness(ScriptedEngine("one two three four five six"), vad, exported, BARGE_IN) as h:
        h.push(load_fixture("hello"))
        h.push(silence(800))
        await h.until("response.done")
        h.output.play(3 * CODEC_FRAME_SAMPLES)  # three of the six words heard
        h.push(load_fixture("weather"))
        h.push(silence(800))
        await h.turn_done(2)
        assert len(named(exported, "omni_rtc.turn")) == 2  # the second played out: both turns are over

    cut, answered = sorted(named(exported, "omni_rtc.turn"), key=lambda span: span.start_time or 0)
    assert cut.attributes is not None and answered.attributes is not None
    assert (cut.attributes["omni_rtc.turn.interrupted"], cut.attributes["omni_rtc.turn.truncated"]) == (True, True)
    assert cut.attributes["omni_rtc.response.status"] == "completed"  # generated whole, cut while it played
    playback = children(exported, cut)["omni_rtc.playback"]
    assert playback.attributes == {
        "omni_rtc.playback.end": "truncated", "omni_rtc.playback.played_ms": 240.0,
        "omni_rtc.playback.audio_ms": 480.0, "omni_rtc.item.id": h.of_type("response.done")[0]["response"]["output"][0]["id"],
    }
    assert playback.end_time == cut.end_time
    assert (answered.attributes["omni_rtc.turn.interrupted"], answered.attributes["omni_rtc.turn.truncated"]) == (
        False, False)
    (session,) = named(exported, "omni_rtc.session")
    assert session.attributes is not None and session.attributes["omni_rtc.session.turns"] == 2
    assert cut.parent is not None and cut.parent.span_id == session.context.span_id


async def test_a_session_closed_while_its_answer_plays_ends_the_turn_at_the_close(vad, exported):
    async with harness(ScriptedEngine("one two three"), vad, exported) as h:
        h.push(load_fixture("hello"))
        h.push(silence(800))
        await h.until("response.done")
        h.output.play(CODEC_FRAME_SAMPLES)
        assert named(exported, "omni_rtc.turn") == []  # its audio is still playing

    (turn,) = named(exported, "omni_rtc.turn")
    (session,) = named(exported, "omni_rtc.session")
    assert turn.end_time == session.end_time
    assert children(exported, turn)["omni_rtc.playback"].attributes == {"omni_rtc.playback.end": "session_closed"}


async def test_a_failed_response_is_an_error_span_with_its_code(vad, exported):
    engine = ScriptedEngine("one two three")
    engine.fail_next = EngineError("the engine broke", code="engine_error")
    async with harness(engine, vad, exported) as h:
        h.push(load_fixture("hello"))
        h.push(silence(800))
        await h.until("response.done")
        h.output.play()

    (turn,) = named(exported, "omni_rtc.turn")
    assert turn.status.status_code == StatusCode.ERROR
    assert turn.attributes is not None and turn.attributes["error.type"] == "engine_error"
    assert turn.attributes["gen_ai.response.finish_reasons"] == ("error",)


NETWORK = NetworkLatency(
    inbound_packets_lost=3, inbound_packets_late=1, inbound_packets_overrun=0, inbound_frames_recovered=2,
    inbound_frames_concealed=1, inbound_jitter_ms=4.5, outbound_packets_lost=5, outbound_fec_loss_percent=10,
    rtt_ms=42.0,
)


class WebRtcLikeHarness(SessionHarness):
    """Its transport adds the call's network figures to response.done as it sends it, and tells the
    session, as a WebRTC call does (app.transports.webrtc.peer_call)."""

    def _record(self, event: dict[str, Any]) -> None:
        if event["type"] == "response.done" and isinstance(event.get("latency"), dict):
            event["latency"]["network"] = NETWORK.model_dump()
            self.session.network_reported(event["response"]["id"], NETWORK)
        super()._record(event)


async def test_a_webrtc_calls_network_figures_are_on_the_turn_span(vad, exported):
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    spans = SessionSpans(provider.get_tracer("test"), WallClock.now(), "webrtc")
    async with WebRtcLikeHarness(ScriptedEngine("one two"), vad, observer=spans) as h:
        h.push(load_fixture("hello"))
        h.push(silence(800))
        await h.turn_done()

    (turn,) = named(exported, "omni_rtc.turn")
    assert turn.attributes is not None
    network = {key.removeprefix("omni_rtc.latency.network."): value for key, value in turn.attributes.items()
               if key.startswith("omni_rtc.latency.network.")}
    assert network == NETWORK.model_dump()
    assert h.of_type("response.done")[0]["latency"]["network"] == network  # as the client got them


async def test_a_turn_without_network_figures_has_no_network_attributes(vad, exported):
    async with harness(ScriptedEngine("one two"), vad, exported) as h:
        h.push(load_fixture("hello"))
        h.push(silence(800))
        await h.turn_done()

    (turn,) = named(exported, "omni_rtc.turn")
    assert turn.attributes is not None
    assert not [key for key in turn.attributes if key.startswith("omni_rtc.latency.network.")]
    assert "omni_rtc.latency.end_of_speech_to_first_audio_ms" in turn.attributes
