"""Metrics read from server events and engine timings."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from app.metrics import Metrics
from app.serving.engines import MeteredEngine
from pipeline.contract import (
    AudioChunk,
    EngineError,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    GenerationTimings,
    TextDelta,
    Usage,
)
from pipeline.conversation import Conversation
from tests.fakes import FULL_CAPABILITIES


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def test_end_of_utterance_delay_is_the_silence_wait_plus_the_vad_lag():
    metrics = Metrics()
    observer = metrics.observer(Clock())
    session = {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}}
    observer.on_server_event({"type": "session.created", "session": session})
    observer.on_input_audio(16_000 * 3)  # 3 s received when the VAD decided at 2.9 s
    observer.on_server_event({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2_900})
    assert sample(metrics, "omni_rtc_end_of_utterance_delay_seconds_sum") == pytest.approx(0.6)


def test_time_to_first_audio_runs_from_speech_stopped_to_playback_start():
    metrics, clock = Metrics(), Clock()
    observer = metrics.observer(clock)
    observer.on_server_event({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 0})
    clock.now += 0.25
    observer.on_server_event({"type": "input_audio_buffer.committed"})
    observer.on_server_event({"type": "response.created", "response": {"id": "resp_1"}})
    clock.now += 1.0
    observer.on_server_event({"type": "output_audio_buffer.started", "response_id": "resp_1"})
    clock.now += 2.0
    observer.on_server_event({"type": "response.done", "response": {"id": "resp_1", "status": "completed"}})
    assert sample(metrics, "omni_rtc_time_to_first_audio_seconds_sum") == pytest.approx(1.25)
    assert sample(metrics, "omni_rtc_turn_duration_seconds_sum") == pytest.approx(3.0)
    assert sample(metrics, "omni_rtc_turns_total", transport="webrtc", status="completed") == 1


def test_a_text_answer_records_no_first_audio_and_does_not_skew_the_next_turn():
    metrics, clock = Metrics(), Clock()
    observer = metrics.observer(clock)
    observer.on_server_event({"type": "response.created", "response": {"id": "resp_1"}})
    observer.on_server_event({"type": "response.done", "response": {"id": "resp_1", "status": "completed"}})
    clock.now += 60.0
    observer.on_server_event({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 0})
    observer.on_server_event({"type": "response.created", "response": {"id": "resp_2"}})
    clock.now += 0.5
    observer.on_server_event({"type": "output_audio_buffer.started", "response_id": "resp_2"})
    assert sample(metrics, "omni_rtc_time_to_first_audio_seconds_count") == 1
    assert sample(metrics, "omni_rtc_time_to_first_audio_seconds_sum") == pytest.approx(0.5)


@pytest.mark.parametrize(("report", "family", "reports", "once", "engine_seconds"), [
    ("speculation", "omni_rtc_speculative_responses",  # the engine time thrown away
     (("started", 0.0), ("used", 0.0), ("started", 0.0), ("discarded", 0.25), (None, 0.1), ("started", 0.0),
      ("refused", 0.0)),
     ("used", "discarded", "refused"), "omni_rtc_speculative_discarded_engine_seconds_total 0.35"),
    ("partial_transcript", "omni_rtc_partial_transcripts",  # the engine time, shown or not
     (("started", 0.0), ("done", 0.125), ("started", 0.0), ("superseded", 0.5), ("started", 0.0),
      ("refused", 0.0)),
     ("done", "superseded", "refused"), "omni_rtc_partial_transcript_engine_seconds_total 0.625"),
])
def test_speculations_and_partial_transcripts_are_counted_by_outcome_with_their_engine_time(
    report: str, family: str, reports: tuple[tuple[str | None, float], ...], once: tuple[str, ...], engine_seconds: str
):
    metrics = Metrics()
    for outcome, seconds in reports:
        getattr(metrics, report)(outcome, seconds)
    text = metrics.render().decode()

    assert f'{family}_total{{outcome="started"}} 3.0' in text
    for outcome in once:
        assert f'{family}_total{{outcome="{outcome}"}} 1.0' in text
    assert f'{family}_total{{outcome="preempted"}} 0.0' in text  # shown before it happens
    assert engine_seconds in text


def test_engine_share_refusals_are_counted_by_limit_and_work_never_by_client():
    metrics = Metrics()
    metrics.share_refused("client", "response")
    metrics.share_refused("client", "response")
    metrics.share_refused("session", "speculative_response")
    text = metrics.render().decode()

    family = "omni_rtc_engine_share_refusals_total"
    assert f'{family}{{limit="client",work="response"}} 2.0' in text
    assert f'{family}{{limit="session",work="speculative_response"}} 1.0' in text
    assert f'{family}{{limit="client",work="partial_transcript"}} 0.0' in text  # shown before it happens


def test_event_rate_refusals_are_counted_by_limit_never_by_client():
    metrics = Metrics()
    metrics.rate_refused("client")
    metrics.rate_refused("client")
    text = metrics.render().decode()

    assert 'omni_rtc_event_rate_refusals_total{limit="client"} 2.0' in text
    assert 'omni_rtc_event_rate_refusals_total{limit="session"} 0.0' in text  # shown before it happens


def test_error_events_are_counted_by_type_and_code():
    metrics = Metrics()
    observer = metrics.observer(Clock())
    error = {"type": "error", "error": {"type": "invalid_request_error", "code": "unknown_event"}}
    observer.on_server_event(error)
    observer.on_server_event(error)
    assert sample(metrics, "omni_rtc_errors_total", type="invalid_request_error", code="unknown_event") == 2


class TimedEngine:
    name = "timed"
    capabilities = FULL_CAPABILITIES

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.closed_early = False

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run_generation(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        try:
            yield TextDelta("hi")
            if self.fail:
                raise EngineError("boom", code="engine_boom")
            yield AudioChunk(np.zeros(1920, dtype=np.float32))
            yield GenerationDone(
                text="hi", usage=Usage(1, 0, 1), finish_reason="stop",
                timings=GenerationTimings(queue_wait=0.5, first_text=0.75, first_audio=1.0, total=2.0),
            )
        except GeneratorExit:
            self.closed_early = True
            raise


async def test_metered_engine_records_queue_wait_and_first_token():
    metrics = Metrics()
    events = [event async for event in MeteredEngine(TimedEngine(), metrics).run_generation(GenerationRequest(Conversation()))]
    assert isinstance(events[-1], GenerationDone)
    assert sample(metrics, "omni_rtc_engine_queue_wait_seconds_sum", task="respond") == pytest.approx(0.5)
    assert sample(metrics, "omni_rtc_thinker_first_token_seconds_sum", task="respond") == pytest.approx(0.75)


async def test_metered_engine_records_first_audio():
    metrics = Metrics()
    _ = [event async for event in MeteredEngine(TimedEngine(), metrics).run_generation(GenerationRequest(Conversation()))]
    assert sample(metrics, "omni_rtc_engine_first_audio_seconds_sum", task="respond") == pytest.approx(1.0)


async def test_metered_engine_records_each_turns_engine_time():
    metrics = Metrics()
    _ = [event async for event in MeteredEngine(TimedEngine(), metrics).run_generation(GenerationRequest(Conversation()))]
    assert sample(metrics, "omni_rtc_engine_turn_seconds_sum", task="respond") == pytest.approx(2.0)


async def test_metered_engine_records_the_engine_time_of_a_turn_closed_early():
    metrics = Metrics()
    turn = MeteredEngine(TimedEngine(), metrics).run_generation(GenerationRequest(Conversation()))
    assert isinstance(await anext(turn), TextDelta)
    await turn.aclose()
    assert sample(metrics, "omni_rtc_engine_turn_seconds_count", task="respond") == 1
    assert 0 < sample(metrics, "omni_rtc_engine_turn_seconds_sum", task="respond") < 2.0


async def test_metered_engine_keeps_transcriptions_apart_from_answers():
    metrics = Metrics()
    request = GenerationRequest(Conversation(), task="transcribe")
    _ = [event async for event in MeteredEngine(TimedEngine(), metrics).run_generation(request)]
    assert sample(metrics, "omni_rtc_engine_queue_wait_seconds_sum", task="transcribe") == pytest.approx(0.5)
    assert sample(metrics, "omni_rtc_engine_queue_wait_seconds_count", task="respond") == 0


async def test_metered_engine_counts_engine_errors_and_reraises():
    metrics = Metrics()
    turn = MeteredEngine(TimedEngine(fail=True), metrics).run_generation(GenerationRequest(Conversation()))
    with pytest.raises(EngineError, match="boom"):
        async for _ in turn:
            pass
    assert sample(metrics, "omni_rtc_errors_total", type="engine_error", code="engine_boom") == 1


async def test_closing_a_metered_turn_closes_the_engine_turn():
    engine = TimedEngine()
    turn = MeteredEngine(engine, Metrics()).run_generation(GenerationRequest(Conversation()))
    assert isinstance(await anext(turn), TextDelta)
    await turn.aclose()
    assert engine.closed_early


def test_network_samples_move_the_packet_counters_and_the_end_observes_the_call():
    from app.transports.webrtc.network import NetworkFigures

    metrics = Metrics()
    observer = metrics.observer(Clock())
    observer.on_network_sample(NetworkFigures(inbound_packets_received=95, inbound_packets_lost=5,
                                              inbound_frames_recovered=4, inbound_frames_concealed=1))
    observer.on_network_sample(NetworkFigures(inbound_packets_received=190, inbound_packets_lost=4,  # one turned up
                                              inbound_packets_late=1, inbound_packets_overrun=2, inbound_frames_recovered=8,
                                              inbound_frames_concealed=3, inbound_jitter_ms=12.0))
    assert sample(metrics, "omni_rtc_inbound_audio_packets_total", outcome="received") == 190
    assert sample(metrics, "omni_rtc_inbound_audio_packets_total", outcome="lost") == 5  # counters only rise
    assert sample(metrics, "omni_rtc_inbound_audio_packets_total", outcome="late") == 1
    assert sample(metrics, "omni_rtc_inbound_audio_packets_total", outcome="overrun") == 2
    assert sample(metrics, "omni_rtc_inbound_audio_frames_repaired_total", method="fec") == 8
    assert sample(metrics, "omni_rtc_inbound_audio_frames_repaired_total", method="plc") == 3

    observer.on_network_closed(NetworkFigures(inbound_packets_received=190, inbound_packets_lost=10,
                                              inbound_jitter_ms=12.0, outbound_packets_sent=200,
                                              outbound_packets_lost=20, rtt_ms=40.0))
    assert sample(metrics, "omni_rtc_inbound_audio_packets_total", outcome="lost") == 10
    assert sample(metrics, "omni_rtc_call_packet_loss_ratio_sum", direction="inbound") == pytest.approx(0.05)
    assert sample(metrics, "omni_rtc_call_packet_loss_ratio_sum", direction="outbound") == pytest.approx(0.1)
    assert sample(metrics, "omni_rtc_call_jitter_seconds_sum") == pytest.approx(0.012)
    assert sample(metrics, "omni_rtc_call_rtt_seconds_count") == 1


def test_metrics_of_workers_add_up_and_keep_their_worker_labels() -> None:
    front, first, second = Metrics(), Metrics(worker="0"), Metrics(worker="1")
    front.pacing_snapshots = dict  # the front paces nothing
    front.calls.labels(transport="webrtc", reason="hangup").inc()
    first.calls.labels(transport="webrtc", reason="hangup").inc(2)
    second.calls.labels(transport="webrtc", reason="peer_gone").inc()
    first.pacing.record(0.5, skipped=24)
    text = front.render([first.samples(), second.samples()]).decode()
    assert 'omni_rtc_calls_total{reason="hangup",transport="webrtc"} 3.0' in text
    assert 'omni_rtc_calls_total{reason="peer_gone",transport="webrtc"} 1.0' in text
    assert 'omni_rtc_outbound_frames_skipped_total{worker="0"} 24.0' in text
    assert 'omni_rtc_outbound_frames_skipped_total{worker="1"} 0.0' in text
    assert "_created" not in text
