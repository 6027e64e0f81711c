"""Traces over OTLP/HTTP: a real server on 127.0.0.1 sends its sessions' spans to a collector the test runs.

The collector is a plain HTTP server on 127.0.0.1 that takes ``POST /v1/traces`` and decodes each
body with opentelemetry-proto, as a collector does. The server reads the standard variables
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``); its spans are flushed
when it stops. The engine is the scripted one; the server, its VAD, the socket and the peers are real.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from app.client.webrtc import RealtimeClient
from app.client.websocket import RealtimeSocketClient
from app.config import Settings
from app.http.server import create_app
from app.http.socket_route import websocket_server_options
from app.tracing import TracingEnvironment
from pipeline.contract import (
    FunctionCallDelta,
    FunctionCallDone,
    FunctionCallStarted,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    GenerationTimings,
    Usage,
)
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.speech import load_fixture

TOLERANCE_MS = 20.0
TOKEN = "Bearer collector-token"  # sent as OTEL_EXPORTER_OTLP_HEADERS says
GET_TIME = {
    "type": "function", "name": "get_time", "description": "The current time in a timezone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}},
}
PARIS = '{"timezone": "Europe/Paris"}'
OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS",
                  "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER")


# -- the collector ----------------------------------------------------------------------------

@dataclass(frozen=True)
class CollectedSpan:
    name: str
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def ms_after(self, other: CollectedSpan) -> float:
        """This span's end, in ms after ``other`` started."""
        return (self.end_ns - other.start_ns) / 1e6


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


class Collector:
    """An OTLP/HTTP trace endpoint on 127.0.0.1 (a thread of this process): every span it was sent, decoded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[tuple[str, dict[str, str], ExportTraceServiceRequest]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                with collector._lock:
                    collector._requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, request))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp collector")

    @property
    def traces_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()

    def headers(self) -> list[dict[str, str]]:
        with self._lock:
            return [headers for _, headers, _ in self._requests]

    def paths(self) -> set[str]:
        with self._lock:
            return {path for path, _, _ in self._requests}

    def spans(self) -> list[CollectedSpan]:
        with self._lock:
            requests = [request for _, _, request in self._requests]
        return [
            CollectedSpan(span.name, span.trace_id, span.span_id, span.parent_span_id, span.start_time_unix_nano,
                          span.end_time_unix_nano, _attributes(span.attributes), _attributes(resource.resource.attributes))
            for request in requests for resource in request.resource_spans for scope in resource.scope_spans
            for span in scope.spans
        ]


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collector]:
    """The collector, and this process's OTEL_* variables pointing at it (a server started now reads them)."""
    with Collector() as running:
        for name in OTEL_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", running.traces_url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization={TOKEN.replace(' ', '%20')}")
        yield running


class ToolEngine(ScriptedEngine):
    """The scripted engine; a turn offered tools calls get_time instead of speaking."""

    async def run_generation(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        if not request.conversation.tools:
            async for event in super().run_generation(request):
                yield event
            return
        self.requests.append(request)
        yield FunctionCallStarted(0, "get_time")
        await asyncio.sleep(0.05)  # the model writing the arguments
        yield FunctionCallDelta(0, PARIS)
        yield FunctionCallDone(0, "get_time", PARIS)
        yield GenerationDone(text="", usage=Usage(input_text_tokens=40, input_audio_tokens=0, output_text_tokens=12),
                             finish_reason="stop", timings=GenerationTimings(first_text=0.001, total=0.06))


@dataclass(frozen=True)
class Tree:
    """One session's spans: the session, its turns in order, each turn's children by name."""

    session: CollectedSpan
    turns: list[CollectedSpan]
    children: dict[bytes, dict[str, list[CollectedSpan]]]

    @classmethod
    def of(cls, spans: list[CollectedSpan], session_id: str) -> Tree:
        (session,) = [s for s in spans if s.name == "omni_rtc.session" and s.attributes["session.id"] == session_id]
        turns = sorted((s for s in spans if s.parent_span_id == session.span_id), key=lambda s: s.start_ns)
        children: dict[bytes, dict[str, list[CollectedSpan]]] = {}
        for turn in turns:
            below = children.setdefault(turn.span_id, {})
            for span in spans:
                if span.parent_span_id == turn.span_id:
                    below.setdefault(span.name, []).append(span)
        return cls(session, turns, children)

    def child(self, turn: CollectedSpan, name: str) -> CollectedSpan:
        (span,) = self.children[turn.span_id][name]
        return span


def assert_timed_as_latency(tree: Tree, turn: CollectedSpan, latency: dict[str, Any]) -> None:
    """The turn and its children last what response.done's latency block says, within TOLERANCE_MS."""
    end_of_turn = tree.child(turn, "omni_rtc.end_of_turn")
    first_audio = tree.child(turn, "omni_rtc.first_audio")
    engine = tree.child(turn, "omni_rtc.engine.prefill")
    assert end_of_turn.start_ns == turn.start_ns and end_of_turn.end_ns == first_audio.start_ns
    assert end_of_turn.duration_ms == pytest.approx(latency["silence_wait_ms"], abs=TOLERANCE_MS)
    assert first_audio.ms_after(turn) == pytest.approx(latency["end_of_speech_to_first_audio_ms"], abs=TOLERANCE_MS)
    assert first_audio.duration_ms == pytest.approx(
        latency["end_of_speech_to_first_audio_ms"] - latency["silence_wait_ms"], abs=TOLERANCE_MS)
    assert engine.duration_ms == pytest.approx(
        latency["engine_first_audio_ms"] + latency["speculation_hidden_ms"], abs=TOLERANCE_MS)
    assert turn.attributes["omni_rtc.turn.speculative"] == latency["speculative"]
    for field in ("end_of_speech_to_first_audio_ms", "silence_wait_ms", "engine_first_audio_ms", "queue_wait_ms",
                  "other_ms", "speculation_hidden_ms"):
        assert turn.attributes[f"omni_rtc.latency.{field}"] == latency[field], field


async def test_a_websocket_sessions_turns_reach_the_collector_nested_and_timed_as_their_latency(tmp_path, collector):
    settings = Settings(cache_dir=tmp_path, media_workers=1)
    app = create_app(settings, engine=ToolEngine("Hello there friend"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with RealtimeSocketClient(url) as client:
            spoken = await client.speak(load_fixture("hello"))
            start = len(client.events)
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Time in Paris?"}]}})
            await client.send({"type": "response.create", "response": {"tools": [GET_TIME]}})
            called = (await client.wait_for("response.done", start=start))["response"]
        session_id = client.call_location
    # The server has stopped: its spans were sent as it shut down.

    tree = Tree.of(collector.spans(), str(session_id))
    session = tree.session
    assert session.resource["service.name"] == "omni-rtc" and session.resource["omni_rtc.process"] == "front"
    assert session.attributes["omni_rtc.transport"] == "websocket"
    assert session.attributes["gen_ai.request.model"] == "scripted-engine"
    assert session.attributes["gen_ai.conversation.id"] == spoken.response["conversation_id"]
    assert session.attributes["omni_rtc.session.turns"] == 2
    assert [turn.attributes["gen_ai.response.id"] for turn in tree.turns] == [spoken.response["id"], called["id"]]
    assert all(turn.trace_id == session.trace_id for turn in tree.turns)
    assert session.start_ns < tree.turns[0].start_ns and tree.turns[-1].end_ns <= session.end_ns
    assert {TOKEN} == {headers["authorization"] for headers in collector.headers()}
    assert collector.paths() == {"/v1/traces"}

    first, second = tree.turns
    assert set(tree.children[first.span_id]) == {
        "omni_rtc.end_of_turn", "omni_rtc.engine.prefill", "omni_rtc.first_audio", "omni_rtc.playback"}
    done = next(e for e in spoken.events if e["type"] == "response.done")
    assert_timed_as_latency(tree, first, done["latency"])
    usage = spoken.response["usage"]
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert first.attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
    assert first.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert first.attributes["gen_ai.output.type"] == "speech"
    assert (first.attributes["omni_rtc.turn.interrupted"], first.attributes["omni_rtc.turn.truncated"]) == (False, False)
    # Over the WebSocket the answer counts as played once sent (no playback.ack): the turn ended there.
    playback = tree.child(first, "omni_rtc.playback")
    assert playback.start_ns == tree.child(first, "omni_rtc.first_audio").end_ns and playback.end_ns == first.end_ns
    assert playback.attributes["omni_rtc.playback.end"] == "played_out"
    assert playback.attributes["omni_rtc.playback.played_ms"] == playback.attributes["omni_rtc.playback.audio_ms"] > 0

    (call_item,) = called["output"]
    call = tree.child(second, "omni_rtc.tool_call")
    assert set(tree.children[second.span_id]) == {"omni_rtc.engine.prefill", "omni_rtc.tool_call"}
    assert (call.attributes["gen_ai.tool.name"], call.attributes["gen_ai.tool.call.id"]) == ("get_time",
                                                                                             call_item["call_id"])
    assert call.attributes["omni_rtc.tool_call.status"] == "completed" and call.duration_ms >= 40
    assert second.attributes["gen_ai.output.type"] == "speech" and "omni_rtc.latency.other_ms" not in second.attributes


@pytest.mark.e2e
async def test_a_webrtc_call_on_a_media_worker_sends_its_own_spans(tmp_path, collector):
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=2),
                     engine=ScriptedEngine("Hi there"))
    async with serving_in_process(app) as url:
        async with RealtimeClient(url, ice_loopback=True) as client:
            turn = await client.speak(load_fixture("hello"))
            created = await client.wait_for("session.created")
    # The workers stopped with the server, each sending its spans first.

    assert turn.status == "completed"
    tree = Tree.of(collector.spans(), created["session"]["id"])
    assert tree.session.resource["omni_rtc.process"].startswith("media-worker-")
    assert tree.session.attributes["omni_rtc.transport"] == "webrtc"
    (answer,) = tree.turns
    done = next(e for e in turn.events if e["type"] == "response.done")
    assert answer.attributes["gen_ai.response.id"] == done["response"]["id"]
    assert_timed_as_latency(tree, answer, done["latency"])
    playback = tree.child(answer, "omni_rtc.playback")  # the paced track played it out
    assert playback.attributes["omni_rtc.playback.end"] == "played_out" and playback.end_ns == answer.end_ns
    # The worker took the front's variables, the collector's token among them.
    assert {TOKEN} == {headers["authorization"] for headers in collector.headers()}


async def test_without_an_endpoint_no_tracing_is_set_up(tmp_path, monkeypatch):
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    settings = Settings(cache_dir=tmp_path, media_workers=1)
    app = create_app(settings, engine=ScriptedEngine("Hello there"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with RealtimeSocketClient(url) as client:
            turn = await client.speak(load_fixture("hello"))
            assert app.state.runtime.tracing is None
            assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("OtelBatch")]
    assert turn.status == "completed"


def test_the_standard_variables_turn_tracing_on_and_off():
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert TracingEnvironment.of({}) is None
    assert TracingEnvironment.of({"OTEL_SERVICE_NAME": "voice", "PATH": "/bin"}) is None
    assert TracingEnvironment.of({**endpoint, "PATH": "/bin"}) == TracingEnvironment(endpoint)
    traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}
    assert TracingEnvironment.of(traces) == TracingEnvironment(traces)
    assert TracingEnvironment.of({**endpoint, "OTEL_SDK_DISABLED": "true"}) is None
    # A media worker's environment becomes the front's: its own stale OTEL_* variables go.
    worker = {"OTEL_EXPORTER_OTLP_HEADERS": "stale=1", "PATH": "/bin"}
    TracingEnvironment(traces).apply_to(worker)
    assert worker == {**traces, "PATH": "/bin"}
