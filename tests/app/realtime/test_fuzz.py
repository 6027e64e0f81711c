"""Fuzzing: hostile client events through the session, hostile offers through signaling.

Properties:
- the session never raises on a client event, answers every malformed one with ``error``,
  and afterwards still serves a valid turn to ``response.done`` ``completed``;
- the same over the WebSocket: the session as it carries it (``SocketSessionHarness``); hostile
  frames through a real ``GET /v1/realtime`` socket: tests/e2e/test_fuzz.py;
- ``POST /v1/realtime/calls`` never answers 500, whatever the body.

Example counts are fixed and derandomized so CI is repeatable and fast (~1 min on 2 cores
in all): see ``SESSION_EXAMPLES`` and ``SDP_EXAMPLES``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import Settings
from app.http.server import create_app
from app.realtime.protocol import CLIENT_EVENT_TYPES, SessionFinishedEvent
from tests.fakes import ScriptedEngine, SessionHarness, SocketSessionHarness
from tests.settle import settle

SESSION_EXAMPLES = 150  # event sequences through one session each (up to 12 events)
BAD_EVENT_EXAMPLES = 150  # single malformed events, each must get an error
SOCKET_SESSION_EXAMPLES = 100  # event sequences through one WebSocket-carried session each
SDP_EXAMPLES = 120  # offers posted to the signaling endpoint (1-3 per example)
CLIENT_SECRET_EXAMPLES = 100  # bodies posted to /v1/realtime/client_secrets
FUZZ_SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Not client events: things the rest of the world does between them.
PLAY = "<play all queued audio>"
SPEAK = "<0.6 s of speech, then 0.8 s of silence>"
SPEECH = np.concatenate([
    0.3 * np.sin(2 * np.pi * 220 * np.arange(9_600) / 16_000).astype(np.float32),
    np.zeros(12_800, dtype=np.float32),
])


# -- strategies ---------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
event_types = st.sampled_from(CLIENT_EVENT_TYPES)
FINISHED = SessionFinishedEvent().type
# Values chosen to break parsers and arithmetic: wrong types, huge and negative numbers,
# overlong strings, unknown ids.
hostile_values = (
    json_values
    | st.sampled_from([10**30, -(10**30), 2**63, -1, 0, 1e308, -1e308, "", "x" * 100_000, [], {}])
    | st.text(min_size=1, max_size=8).map(lambda s: "item_" + s)
)
FIELD_NAMES = [
    "session", "item", "response", "audio", "item_id", "previous_item_id", "content_index",
    "audio_end_ms", "response_id", "event_id", "instructions", "voice", "turn_detection",
    "output_modalities", "max_output_tokens", "temperature", "content", "role", "text",
]


@st.composite
def typed_garbage(draw: st.DrawFn) -> dict[str, Any]:
    """A known event type with random, often wrongly typed fields."""
    event: dict[str, Any] = {"type": draw(event_types)}
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES), max_size=4, unique=True)):
        event[name] = draw(hostile_values)
    return event


def _message(role: str, part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": role, "content": [part]}}


# Valid events, sent in whatever order: the session must cope with each in every state.
valid_events = st.sampled_from(
    [
        {"type": "response.create"},
        {"type": "response.create", "response": {"output_modalities": ["text"]}},
        {"type": "response.cancel"},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.append", "audio": "AAAA" * 1_600},  # 0.2 s of 24 kHz silence
        {"type": "input_audio_buffer.clear"},
        {"type": "output_audio_buffer.clear"},
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}},
        {"type": "session.update", "session": {"output_modalities": ["text"]}},
        {"type": "session.update", "session": {"instructions": "Be brief.", "max_output_tokens": 1}},
        {"type": "session.update", "session": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
        _message("user", {"type": "input_text", "text": "hi"}),
        _message("assistant", {"type": "output_text", "text": "earlier answer"}),
        _message("user", {"type": "input_audio", "audio": "AAAA" * 1_600}),  # 0.2 s of silence
        {**_message("user", {"type": "input_text", "text": "first"}), "previous_item_id": "root"},
        {"type": "playback.ack", "played_ms": 100_000},
        {"type": "playback.ack", "played_ms": 40, "committed_ms": 0},
    ]
)
id_events = st.builds(
    lambda kind, item_id: (
        {"type": "conversation.item.delete", "item_id": item_id}
        if kind == "delete"
        else {"type": "playback.ack", "item_id": item_id, "played_ms": 10}
        if kind == "ack"
        else {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 10}
    ),
    st.sampled_from(["delete", "truncate", "ack"]),
    st.text(max_size=10).map(lambda s: "item_" + s),
)


def encode(event: Any) -> str:
    return json.dumps(event)


# Raw messages that are not a usable event at all.
malformed_messages = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    json_values.map(encode),
    typed_garbage().map(encode),
    st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(encode),  # no usable type
    st.text(max_size=30).filter(lambda t: t not in CLIENT_EVENT_TYPES).map(lambda t: encode({"type": t})),
    st.integers(4_301, 6_000).map(lambda n: '{"type": "response.create", "x": ' + "9" * n + "}"),  # huge int
    st.integers(900, 5_000).map(lambda depth: "[" * depth + "]" * depth),  # deep nesting
    st.just('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
            '"content": [{"type": "input_text", "text": "' + "a" * 20_000 + '"}]}}'),  # too long text
)
any_message = st.one_of(
    malformed_messages, valid_events.map(encode), id_events.map(encode), st.sampled_from([PLAY, SPEAK])
)


# -- the session --------------------------------------------------------------------------


async def _drive(
    messages: list[str | bytes], *, socket: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Sends ``messages``, then a valid text turn; returns (events before it, events of it).

    The harness checks every server event against the protocol's schema as it is sent. With
    ``socket`` the session is carried as over the WebSocket, where playing is acknowledging.
    A ``session.finish`` among ``messages`` ends the session: the turn is still asked for, and
    what it gets (nothing, if the session keeps its word) is returned without waiting.
    """
    harness = SocketSessionHarness(ScriptedEngine("Hello there")) if socket else SessionHarness(ScriptedEngine("Hello there"))
    await harness.session.start()

    async def play() -> None:
        if socket:
            await harness.send(type="playback.ack", played_ms=100_000)  # whatever is playing, all of it
        else:
            harness.output.play()

    try:
        for message in messages:
            if message == PLAY:
                await play()
            elif message == SPEAK:
                harness.push(SPEECH)
            else:
                await harness.session.handle_message(message)
            await settle()
        if _finished(harness.events):
            before = len(harness.events)
            await harness.session.handle_message(encode(_message("user", {"type": "input_text", "text": "there?"})))
            await harness.send(type="response.create")
            await settle()
            return harness.events[:before], harness.events[before:]
        # Whatever state the fuzz left, a client can still have a turn: cancel, then ask.
        await harness.send(type="response.cancel")
        await settle()
        await play()
        before = len(harness.events)
        await harness.session.handle_message(encode(_message("user", {"type": "input_text", "text": "are you there?"})))
        await harness.send(type="response.create", response={"max_output_tokens": "inf"})
        await harness.until("response.done", len(harness.of_type("response.done")) + 1)
        return harness.events[:before], harness.events[before:]
    finally:
        await harness.session.close()


def _finished(events: list[dict[str, Any]]) -> bool:
    """The client ended the session (``session.finish``): ``session.finished`` was sent."""
    return any(event["type"] == FINISHED for event in events)


@settings(FUZZ_SETTINGS, max_examples=SESSION_EXAMPLES)
@given(messages=st.lists(any_message, max_size=12))
def test_session_survives_any_event_sequence_and_serves_a_turn(messages):
    before, final = asyncio.run(_drive(messages))
    # server_error is what the session answers when its own code raised: a bug, whatever the input.
    assert [e for e in before if e["type"] == "error" and e["error"]["type"] == "server_error"] == []
    if _finished(before):  # the client ended it: session.finished is the last event, and stays so
        assert before[-1]["type"] == FINISHED and final == []
        return
    done = [e for e in final if e["type"] == "response.done"]
    errors = [e for e in final if e["type"] == "error"]
    assert errors == [], errors
    assert len(done) == 1, [e["type"] for e in final]
    assert done[0]["response"]["status"] == "completed"


@settings(FUZZ_SETTINGS, max_examples=SOCKET_SESSION_EXAMPLES)
@given(messages=st.lists(any_message, max_size=12))
def test_socket_session_survives_any_event_sequence_and_serves_a_turn(messages):
    before, final = asyncio.run(_drive(messages, socket=True))
    assert [e for e in before if e["type"] == "error" and e["error"]["type"] == "server_error"] == []
    if _finished(before):
        assert before[-1]["type"] == FINISHED and final == []
        return
    assert [e for e in before + final if e["type"].startswith("output_audio_buffer.")] == []
    done = [e for e in final if e["type"] == "response.done"]
    assert [e for e in final if e["type"] == "error"] == []
    assert len(done) == 1 and done[0]["response"]["status"] == "completed"


@settings(FUZZ_SETTINGS, max_examples=BAD_EVENT_EXAMPLES)
@given(message=malformed_messages)
def test_every_malformed_event_gets_an_error(message):
    before, _ = asyncio.run(_drive([message]))
    replies = before[1:]  # after session.created
    assert any(e["type"] == "error" for e in replies), (message[:200], replies)
    error = next(e for e in replies if e["type"] == "error")["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]


# -- session configs (session.update, the offer's session, client secrets) -----------------

SESSION_KEYS = [
    "type", "model", "instructions", "voice", "output_modalities", "modalities", "temperature",
    "max_output_tokens", "max_response_output_tokens", "turn_detection", "input_audio_format",
    "output_audio_format", "tools", "tracing", "audio",
]
TURN_DETECTION_KEYS = [
    "type", "threshold", "prefix_padding_ms", "silence_duration_ms", "create_response",
    "interrupt_response", "idle_timeout_ms", "eagerness",
]


@st.composite
def session_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Session objects with known keys (GA nesting and beta names) holding hostile values."""
    turn_detection = draw(
        st.none() | hostile_values | st.fixed_dictionaries({}, optional={k: hostile_values for k in TURN_DETECTION_KEYS})
    )
    audio = draw(
        hostile_values
        | st.fixed_dictionaries(
            {},
            optional={
                "input": st.fixed_dictionaries(
                    {}, optional={"turn_detection": st.just(turn_detection), "format": hostile_values}
                ) | hostile_values,
                "output": st.fixed_dictionaries({}, optional={"voice": hostile_values, "format": hostile_values})
                | hostile_values,
            },
        )
    )
    session = draw(st.fixed_dictionaries({}, optional={k: hostile_values for k in SESSION_KEYS}))
    if draw(st.booleans()):
        session["audio"] = audio
    if draw(st.booleans()):
        session["turn_detection"] = turn_detection
    return session


# -- signaling ----------------------------------------------------------------------------

OFFER_LINES = [
    "v=0",
    "o=- 4611731400430051336 2 IN IP4 127.0.0.1",
    "s=-",
    "t=0 0",
    "a=group:BUNDLE 0 1",
    "a=msid-semantic:WMS *",
    "m=audio 9 UDP/TLS/RTP/SAVPF 111 0",
    "c=IN IP4 0.0.0.0",
    "a=rtcp:9 IN IP4 0.0.0.0",
    "a=ice-ufrag:abcd",
    "a=ice-pwd:abcdefghijklmnopqrstuvwx",
    "a=ice-options:trickle",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
    "a=setup:actpass",
    "a=mid:0",
    "a=sendrecv",
    "a=rtcp-mux",
    "a=rtpmap:111 opus/48000/2",
    "a=fmtp:111 minptime=10;useinbandfec=1",
    "a=rtpmap:0 PCMU/8000",
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
    "c=IN IP4 0.0.0.0",
    "a=ice-ufrag:abcd",
    "a=ice-pwd:abcdefghijklmnopqrstuvwx",
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
    "a=setup:actpass",
    "a=mid:1",
    "a=sctp-port:5000",
    "a=max-message-size:262144",
]

line_mutations = st.sampled_from(["drop", "duplicate", "garble", "truncate", "swap"])


@st.composite
def mutated_offers(draw: st.DrawFn) -> bytes:
    """The valid offer with a few lines dropped, duplicated, garbled, truncated or swapped."""
    lines = list(OFFER_LINES)
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(lines) - 1))
        mutation = draw(line_mutations)
        if mutation == "drop":
            del lines[index]
        elif mutation == "duplicate":
            lines.insert(index, lines[index])
        elif mutation == "garble":
            head, _, _ = lines[index].partition(":")
            lines[index] = head + ":" + draw(st.text(max_size=20).filter(lambda t: "\r" not in t and "\n" not in t))
        elif mutation == "truncate":
            lines[index] = lines[index][: draw(st.integers(0, len(lines[index])))]
        else:
            other = draw(st.integers(0, len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        if not lines:
            break
    return ("\r\n".join(lines) + "\r\n").encode()


offer_bodies = st.one_of(
    mutated_offers(),
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: ("v=0\r\n" + t).encode()),
    st.just(b"v=0\r\n" + b"a=x\r\n" * 20_000),  # over the size limit
)


class FuzzServer:
    """The real app with the instant engine, its lifespan running on a loop in its own thread.

    One server serves every example (starting one per example would cost most of the run);
    examples post to it through an ASGI transport on that loop.
    """

    def __init__(self, api_key: str | None = None) -> None:
        settings = Settings(ice_loopback=True, max_sessions=1_000, api_key=api_key)
        self.app = create_app(settings, engine=ScriptedEngine())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzz server")

    def __enter__(self) -> FuzzServer:
        self._thread.start()
        self._lifespan = self.app.router.lifespan_context(self.app)
        self._run(self._lifespan.__aenter__())
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        self._client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._run(self._client.aclose())
        self._run(self._lifespan.__aexit__(None, None, None))
        self._run(self._drain())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @staticmethod
    async def _drain() -> None:
        """Waits (up to 5 s) for aiortc's own tasks of closed calls to notice the close and end."""
        for _ in range(100):
            if asyncio.all_tasks() == {asyncio.current_task()}:
                return
            await asyncio.sleep(0.05)

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        response = self._run(self._client.post(path, content=body, headers=headers))
        return response.status_code, response.text

    def post_offers(self, bodies: list[tuple[bytes, str]]) -> list[tuple[int, str]]:
        return self._run(self._post_offers(bodies))

    async def _post_offers(self, bodies: list[tuple[bytes, str]]) -> list[tuple[int, str]]:
        answers = []
        for body, content_type in bodies:
            response = await self._client.post(
                "/v1/realtime/calls", content=body, headers={"Content-Type": content_type}
            )
            answers.append((response.status_code, response.text))
            if response.status_code == 201:
                await self._client.delete(response.headers["location"])
        return answers


@pytest.fixture(scope="module")
def fuzz_server():
    with FuzzServer() as server:
        yield server


FUZZ_API_KEY = "sk-fuzz"


@pytest.fixture(scope="module")
def keyed_fuzz_server():
    with FuzzServer(api_key=FUZZ_API_KEY) as server:
        yield server


@settings(FUZZ_SETTINGS, max_examples=SDP_EXAMPLES)
@given(
    offers=st.lists(
        st.tuples(offer_bodies, st.sampled_from(["application/sdp", "text/plain", "application/json"])),
        min_size=1,
        max_size=3,
    )
)
def test_signaling_never_answers_500(fuzz_server, offers):
    for status, text in fuzz_server.post_offers(offers):
        assert status in (201, 400, 413, 415), (status, text[:300])
        if status != 201:
            assert json.loads(text)["error"]["message"]


def test_the_unmutated_offer_is_answered(fuzz_server):
    offer = ("\r\n".join(OFFER_LINES) + "\r\n").encode()
    [(status, text)] = fuzz_server.post_offers([(offer, "application/sdp")])
    assert status == 201, text
    assert text.startswith("v=0")


def test_offer_whose_audio_has_no_usable_codec_is_400(fuzz_server):
    """Found by fuzzing: the codecs' rtpmap lines moved to the data channel's section."""
    codec_lines = ["a=fmtp:111 minptime=10;useinbandfec=1", "a=rtpmap:0 PCMU/8000", "a=rtpmap:111 opus/48000/2"]
    lines = [line for line in OFFER_LINES if line not in codec_lines]
    lines += codec_lines
    [(status, text)] = fuzz_server.post_offers([(("\r\n".join(lines) + "\r\n").encode(), "application/sdp")])
    assert status == 400, text
    assert json.loads(text)["error"]["code"] == "invalid_sdp"


client_secret_bodies = st.one_of(
    st.binary(max_size=64),
    json_values.map(encode).map(str.encode),
    st.builds(
        lambda seconds, session: encode({"expires_after": {"anchor": "created_at", "seconds": seconds}, "session": session}),
        hostile_values,
        session_objects() | hostile_values,
    ).map(str.encode),
)


@settings(FUZZ_SETTINGS, max_examples=CLIENT_SECRET_EXAMPLES)
@given(body=client_secret_bodies)
def test_client_secrets_never_answer_500(keyed_fuzz_server, body):
    status, text = keyed_fuzz_server.post(
        "/v1/realtime/client_secrets", body, {"Authorization": f"Bearer {FUZZ_API_KEY}", "Content-Type": "application/json"}
    )
    assert status in (200, 400), (status, text[:300])
    if status == 200:
        assert json.loads(text)["value"].startswith("ek_")
    else:
        assert json.loads(text)["error"]["message"]
