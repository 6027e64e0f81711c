"""The limit checks on their own: SDP offers, capacity, event size and rate."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from aiortc import RTCPeerConnection

from app.config import Settings
from app.http.errors import ApiError
from app.http.server import create_app
from app.http.signaling import check_offer_sdp
from app.realtime.session_config import SessionConfig
from app.serving.engines import StallTimeoutEngine
from app.transports.webrtc.ice import loopback_candidates, rtc_configuration
from pipeline.contract import EngineError, EngineHealth, GenerationDone, GenerationRequest, TextDelta, Usage
from pipeline.conversation import Conversation, UserText
from tests.fakes import FULL_CAPABILITIES, ScriptedEngine, SessionHarness
from tests.hostile import punctuation_tools

OFFER = (
    "v=0\r\n"
    "o=- 4611731400430051336 2 IN IP4 127.0.0.1\r\n"
    "s=-\r\n"
    "t=0 0\r\n"
    "a=group:BUNDLE 0\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    "c=IN IP4 0.0.0.0\r\n"
    "a=mid:0\r\n"
    "a=sendrecv\r\n"
    "a=rtpmap:111 opus/48000/2\r\n"
    "a=ice-ufrag:abcd\r\n"
    "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    "a=fingerprint:sha-256 "
    + ":".join(["AB"] * 32)
    + "\r\n"
    "a=setup:actpass\r\n"
)


def test_valid_offer_is_returned_as_text():
    assert check_offer_sdp(OFFER.encode(), max_bytes=65_536) == OFFER


def test_offer_over_the_limit_is_413():
    with pytest.raises(ApiError) as raised:
        check_offer_sdp(OFFER.encode(), max_bytes=100)
    assert raised.value.status_code == 413
    assert "limit is 100" in raised.value.message


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"hello",
        b"\xff\xfe\x00garbage",
        b"v=0\r\n",
        b"v=0\r\nm=audio x UDP/TLS/RTP/SAVPF 111\r\n",
        b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111\r\n",
        b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=fmtp:111 minptime=10\r\n",  # fmtp without rtpmap
    ],
)
def test_garbage_offer_is_400_with_a_message(body):
    with pytest.raises(ApiError) as raised:
        check_offer_sdp(body, max_bytes=65_536)
    assert raised.value.status_code == 400
    assert raised.value.code == "invalid_sdp"
    assert raised.value.message.startswith("SDP offer")


def test_the_sdp_parsers_own_words_stay_in_the_log_under_the_request_id(caplog):
    with pytest.raises(ApiError) as raised:
        check_offer_sdp(b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111\r\n", max_bytes=65_536)
    assert raised.value.message == "SDP offer could not be parsed."
    request_id = raised.value.headers["x-request-id"]
    [logged] = [record.getMessage() for record in caplog.records if request_id in record.getMessage()]
    assert "ValueError: not enough values to unpack" in logged  # what aiortc said, for the operator only


async def test_a_bug_in_a_route_is_a_500_with_a_request_id_and_no_exception_text():
    app = create_app(Settings(media_workers=1), engine=ScriptedEngine())

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail")

    app.router.routes.insert(0, app.router.routes.pop())  # before the page's catch-all mount

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            response = await http.get("/boom")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "server_error"
    assert "secret" not in response.text
    assert response.headers["x-request-id"].startswith("req_")


def test_bundle_group_naming_a_missing_mid_is_400():
    offer = OFFER.replace("a=group:BUNDLE 0", "a=group:BUNDLE 1 0")
    with pytest.raises(ApiError) as raised:
        check_offer_sdp(offer.encode(), max_bytes=65_536)
    assert raised.value.status_code == 400
    assert "mid 1" in raised.value.message


@pytest.mark.parametrize(
    "line",
    ["a=setup:actpass\r\n", "a=ice-ufrag:abcd\r\n", "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n", "a=sendrecv\r\n"],
)
def test_offer_without_ice_dtls_or_direction_is_400(line):
    with pytest.raises(ApiError) as raised:
        check_offer_sdp(OFFER.replace(line, "").encode(), max_bytes=65_536)
    assert raised.value.status_code == 400
    assert "m=audio section #1" in raised.value.message


class ScriptedTurnEngine:
    """Yields ``events``; then stalls forever if ``stall``; records whether it was cancelled."""

    name = "scripted"
    capabilities = FULL_CAPABILITIES

    def __init__(self, events: list, *, stall: bool = False, error: Exception | None = None) -> None:
        self.events = events
        self.stall = stall
        self.error = error
        self.cancelled = False
    def health(self) -> EngineHealth:
        return EngineHealth(alive=True, restarts=3)

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run_generation(self, request: GenerationRequest):
        for event in self.events:
            yield event
        if self.error is not None:
            raise self.error
        if self.stall:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise


def request() -> GenerationRequest:
    return GenerationRequest(conversation=Conversation(items=(UserText("hi"),)))


DONE = GenerationDone(text="hi", usage=Usage(1, 0, 1), finish_reason="stop")


async def collect(engine) -> list:
    return [event async for event in engine.run_generation(request())]


async def test_stall_guard_passes_a_healthy_turn_through():
    engine = StallTimeoutEngine(ScriptedTurnEngine([TextDelta("hi"), DONE]), stall_timeout_s=5)
    assert await collect(engine) == [TextDelta("hi"), DONE]


async def test_stalled_turn_fails_with_engine_timeout_and_is_cancelled():
    inner = ScriptedTurnEngine([TextDelta("hi")], stall=True)
    engine = StallTimeoutEngine(inner, stall_timeout_s=0.05)
    seen = []
    with pytest.raises(EngineError) as raised:
        async for event in engine.run_generation(request()):
            seen.append(event)
    assert raised.value.code == "engine_timeout"
    assert seen == [TextDelta("hi")]
    assert inner.cancelled


async def test_engine_error_passes_through_the_guard():
    inner = ScriptedTurnEngine([], error=EngineError("boom"))
    with pytest.raises(EngineError, match="boom"):
        await collect(StallTimeoutEngine(inner, stall_timeout_s=5))


async def test_guard_exposes_the_wrapped_engine():
    engine = StallTimeoutEngine(ScriptedTurnEngine([]), stall_timeout_s=5)
    assert engine.name == "scripted"
    assert engine.health() == EngineHealth(alive=True, restarts=3)


# -- the limits in a session and a server --------------------------------------------------


def text_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_oversized_event_gets_an_error_and_the_session_goes_on():
    harness = SessionHarness(ScriptedEngine(), config=SessionConfig(max_event_bytes=1_024))
    await harness.send(type="conversation.item.create", item=text_item("x" * 2_000))
    assert harness.last("error")["error"]["code"] == "event_too_large"
    await harness.send(type="conversation.item.create", item=text_item("short"))
    assert harness.last("conversation.item.done")["item"]["content"][0]["text"] == "short"


async def test_event_flood_gets_errors_and_the_session_goes_on():
    # One token per 1000 s: nothing refills while the test runs (refilling: the gate's own tests).
    harness = SessionHarness(ScriptedEngine(), config=SessionConfig(max_events_per_second=0.001, max_event_burst=2))
    for number in range(4):
        await harness.send(type="conversation.item.create", item=text_item(f"item {number}"))
    assert [e["error"]["code"] for e in harness.of_type("error")] == ["rate_limit_exceeded"] * 2
    assert len(harness.of_type("conversation.item.done")) == 2


async def test_overlong_text_gets_an_error_naming_the_limit():
    harness = SessionHarness(ScriptedEngine(), config=SessionConfig(max_text_chars=10))
    await harness.send(type="conversation.item.create", item=text_item("x" * 11))
    error = harness.last("error")["error"]
    assert error["param"] == "item.content[0].text"
    assert "10 characters" in error["message"]


async def test_server_settings_reach_the_sessions_it_starts():
    settings = Settings(ice_loopback=True, api_key="sk-test", max_text_chars=10)
    app = create_app(settings, engine=ScriptedEngine())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            response = await http.post(
                "/v1/realtime/client_secrets",
                json={"session": {"instructions": "x" * 11}},
                headers={"Authorization": "Bearer sk-test"},
            )
    assert response.status_code == 400
    assert "10 characters" in response.json()["error"]["message"]


async def mint_with_session(session: dict) -> httpx.Response:
    app = create_app(Settings(ice_loopback=True, api_key="sk-test"), engine=ScriptedEngine())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post(
                "/v1/realtime/client_secrets", json={"session": session}, headers={"Authorization": "Bearer sk-test"}
            )


async def test_a_client_secret_binds_tools_and_tool_choice():
    tool = {"type": "function", "name": "get_time", "description": "Now.", "parameters": {"type": "object"}}
    response = await mint_with_session({"tools": [tool], "tool_choice": "required"})
    assert response.status_code == 200
    assert response.json()["session"]["tools"] == [tool]
    assert response.json()["session"]["tool_choice"] == "required"


async def test_a_client_secret_with_a_bad_tool_schema_is_400():
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "required": "timezone"}}
    response = await mint_with_session({"tools": [tool]})
    assert response.status_code == 400
    assert "session.tools[0].parameters" in response.json()["error"]["message"]


async def test_a_client_secret_over_the_instructions_budget_is_400_naming_it():
    # The session a secret binds is a session like any other.
    response = await mint_with_session({"tools": punctuation_tools(count=2)})
    assert response.status_code == 400
    assert "budget for them is 16,000 tokens" in response.json()["error"]["message"]


async def post_to_calls(content, content_type: str = "application/sdp") -> httpx.Response:
    app = create_app(Settings(ice_loopback=True, max_sdp_bytes=4_096, media_workers=1), engine=ScriptedEngine())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/v1/realtime/calls", content=content, headers={"Content-Type": content_type})


async def test_offer_declared_too_large_is_413_before_it_is_read():
    response = await post_to_calls(b"v=0\r\n" + b"a=x\r\n" * 2_000)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "sdp_too_large"


async def test_streamed_offer_is_cut_off_at_the_limit_with_413():
    async def endless():  # chunked: no Content-Length to go by
        for _ in range(10_000):
            yield b"a=x" * 1_000

    response = await post_to_calls(endless())
    assert response.status_code == 413
    assert "over 4096 bytes" in response.json()["error"]["message"]


async def test_a_200_mb_multipart_offer_is_refused_before_it_is_read():
    sent = 0

    async def two_hundred_megabytes():  # streamed: chunked, no Content-Length, one 64 KiB chunk reused
        nonlocal sent
        head = b'--b\r\nContent-Disposition: form-data; name="sdp"; filename="offer.sdp"\r\n\r\n'
        chunk = b"a=x-padding\r\n" * 4_681  # 64 KiB
        yield head
        while sent < 200 * 1024 * 1024:
            sent += len(chunk)
            yield chunk
        yield b"\r\n--b--\r\n"

    response = await post_to_calls(two_hundred_megabytes(), "multipart/form-data; boundary=b")
    assert sent < 1024 * 1024  # the limit (the SDP, a session, the framing) and a chunk, not 200 MB
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "offer_too_large"


async def test_a_multipart_offer_declared_too_large_is_refused_from_its_content_length():
    response = await post_to_calls(b"x" * 400_000, "multipart/form-data; boundary=b")
    assert response.status_code == 413


async def test_a_multipart_offer_within_the_limit_is_read_as_before():
    body = (b'--b\r\nContent-Disposition: form-data; name="session"\r\n\r\n{"instructions": 5}\r\n'
            b'--b\r\nContent-Disposition: form-data; name="sdp"\r\n\r\n' + OFFER.encode() + b"\r\n--b--\r\n")
    response = await post_to_calls(body, "multipart/form-data; boundary=b")
    assert response.status_code == 400  # read whole: the session was checked
    assert response.json()["error"]["param"] == "session.instructions"


async def test_a_multipart_offer_over_the_instructions_budget_is_400():
    session = json.dumps({"tools": punctuation_tools(count=2)})
    body = (b'--b\r\nContent-Disposition: form-data; name="session"\r\n\r\n' + session.encode() + b"\r\n"
            b'--b\r\nContent-Disposition: form-data; name="sdp"\r\n\r\n' + OFFER.encode() + b"\r\n--b--\r\n")
    response = await post_to_calls(body, "multipart/form-data; boundary=b")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "session.tools"


def candidates(count: int) -> str:
    return "".join(f"a=candidate:{n} 1 udp 2122260223 10.0.0.{n} 9 typ host\r\n" for n in range(count))


def test_an_offer_naming_too_many_candidates_is_400():
    check_offer_sdp((OFFER + candidates(32)).encode(), max_bytes=65_536)  # a generous browser's worth
    with pytest.raises(ApiError) as refused:
        check_offer_sdp((OFFER + candidates(33)).encode(), max_bytes=65_536)
    assert (refused.value.status_code, refused.value.code) == (400, "too_many_candidates")


async def aiortc_offer() -> str:
    pc = RTCPeerConnection(rtc_configuration([]))
    pc.createDataChannel("oai-events")
    pc.addTransceiver("audio")
    with loopback_candidates():
        await pc.setLocalDescription(await pc.createOffer())
    await pc.close()  # its offer stays valid text; the call it starts never connects
    return pc.localDescription.sdp


async def test_a_client_past_its_calls_still_connecting_gets_429_until_one_connects_or_ends():
    app = create_app(Settings(ice_loopback=True, media_workers=1, max_connecting_per_client=1), engine=ScriptedEngine())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            async def post(offer: str) -> httpx.Response:
                return await http.post("/v1/realtime/calls", content=offer, headers={"Content-Type": "application/sdp"})

            first = await post(await aiortc_offer())
            second = await post(await aiortc_offer())
            assert (await http.delete(first.headers["location"])).status_code == 204
            third = await post(await aiortc_offer())
    assert first.status_code == 201
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "too_many_connecting_calls"
    assert second.headers["retry-after"] == "10"  # the connect timeout
    assert third.status_code == 201


async def test_a_call_holds_its_clients_share_of_the_engine_until_it_ends():
    app = create_app(Settings(ice_loopback=True, media_workers=1, api_key="sk-test"), engine=ScriptedEngine())
    async with app.router.lifespan_context(app):
        shares = app.state.runtime.client_shares
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 50_000))  # a visitor, not this machine
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            minted = await http.post("/v1/realtime/client_secrets", headers={"Authorization": "Bearer sk-test"})
            call = await http.post("/v1/realtime/calls", content=await aiortc_offer(), headers={
                "Content-Type": "application/sdp", "Authorization": f"Bearer {minted.json()['value']}"})
            assert call.status_code == 201, call.text
            held = len(shares)
            hung_up = await http.delete(call.headers["location"], headers={"Authorization": "Bearer sk-test"})
    assert held == 1  # the visitor's bucket, while its call is open
    assert hung_up.status_code == 204
    assert len(shares) == 0  # nothing spent: forgotten with its last session
