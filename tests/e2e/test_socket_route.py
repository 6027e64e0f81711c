"""``GET /v1/realtime``: the session over a real WebSocket, served by uvicorn on 127.0.0.1.

The engine is the scripted one (no model); the server, its VAD, auth, limits and the socket are real.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import websockets
from pydantic import SecretStr
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.client.websocket import RealtimeSocketClient
from app.config import Settings
from app.http.server import create_app
from app.http.socket_route import websocket_server_options
from app.realtime.gate import REPLIES_PER_SECOND, REPLY_BURST
from app.realtime.input import MAX_APPEND_AHEAD_MS
from tests.app.realtime.test_fuzz import OFFER_LINES
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.speech import load_fixture

pytestmark = pytest.mark.e2e

API_KEY = "sk-test"


@contextlib.asynccontextmanager
async def serving(settings: Settings, engine: ScriptedEngine | None = None) -> AsyncIterator[str]:
    app = create_app(settings, engine=engine or ScriptedEngine("Hello there friend"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        yield url


def ws_url(url: str, query: str = "") -> str:
    return url.replace("http://", "ws://") + "/v1/realtime" + query


async def next_event(ws: ClientConnection, event_type: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):  # a guard against hangs, not a speed limit
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == event_type:
                return event


async def text_turn(ws: ClientConnection) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
    await ws.send(json.dumps({"type": "response.create"}))
    events = []
    async with asyncio.timeout(10):
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(await ws.recv()))
    return events


def refusal(exc: pytest.ExceptionInfo[InvalidStatus]) -> tuple[int, dict[str, Any]]:
    response = exc.value.response
    return response.status_code, json.loads(response.body)["error"]


async def test_the_session_is_created_first_and_answers_with_audio_deltas(tmp_path):
    async with serving(Settings(cache_dir=tmp_path)) as url:
        async with websockets.connect(ws_url(url, "?model=gpt-realtime")) as ws:
            created = json.loads(await ws.recv())
            events = await text_turn(ws)
    assert created["type"] == "session.created"
    assert created["session"]["model"] == "scripted-engine"  # the model served, whatever was asked for
    types = [event["type"] for event in events]
    assert types.count("response.output_audio.delta") == 3
    assert not [t for t in types if t.startswith("output_audio_buffer.")]
    assert events[-1]["response"]["status"] == "completed"
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) == 3 * 1920 * 2  # three 80 ms frames of PCM16 at 24 kHz


@pytest.mark.parametrize("default", [True, False])
async def test_a_socket_session_takes_the_servers_interrupt_response_default(tmp_path, default):
    # pipecat sends no turn detection, others send one without interrupt_response: both get the default.
    async with serving(Settings(cache_dir=tmp_path, default_interrupt_response=default)) as url:
        async with websockets.connect(ws_url(url)) as ws:
            created = await next_event(ws, "session.created")
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}))
            updated = await next_event(ws, "session.updated")
    for event in (created, updated):
        assert event["session"]["audio"]["input"]["turn_detection"]["interrupt_response"] is default


async def test_credentials_as_a_header_a_subprotocol_or_a_client_secret(tmp_path):
    async with serving(Settings(cache_dir=tmp_path, api_key=SecretStr(API_KEY))) as url:
        with pytest.raises(InvalidStatus) as missing:
            await websockets.connect(ws_url(url))
        with pytest.raises(InvalidStatus) as wrong:
            await websockets.connect(ws_url(url), additional_headers={"Authorization": "Bearer sk-wrong"})
        async with websockets.connect(ws_url(url), additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
        # A browser: the key as a subprotocol, beside "realtime", which the server picks.
        subprotocols = ["realtime", f"openai-insecure-api-key.{API_KEY}"]
        async with websockets.connect(ws_url(url), subprotocols=subprotocols) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["type"] == "session.created"
        beta = [f"openai-insecure-api-key.{API_KEY}", "openai-beta.realtime-v1"]  # never the key back
        async with websockets.connect(ws_url(url), subprotocols=beta) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == "openai-beta.realtime-v1"
        async with httpx.AsyncClient(base_url=url) as http:
            minted = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {API_KEY}"},
                                     json={"session": {"instructions": "Be brief."}})
        secret = minted.json()["value"]
        headers = {"Authorization": f"Bearer {secret}"}
        async with websockets.connect(ws_url(url), additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["session"]["instructions"] == "Be brief."
        with pytest.raises(InvalidStatus) as reused:
            await websockets.connect(ws_url(url), additional_headers=headers)
    assert refusal(missing) == (401, refusal(missing)[1]) and refusal(missing)[1]["code"] == "missing_credentials"
    assert refusal(wrong)[0] == 401 and refusal(wrong)[1]["code"] == "invalid_api_key"
    assert refusal(reused)[0] == 401 and refusal(reused)[1]["code"] == "invalid_client_secret"


async def test_browser_origins_are_checked_against_cors_origins(tmp_path):
    settings = Settings(cache_dir=tmp_path, cors_origins=["https://page.example"])
    async with serving(settings) as url:
        with pytest.raises(InvalidStatus) as elsewhere:
            await websockets.connect(ws_url(url), origin="https://elsewhere.example")  # type: ignore[arg-type]
        for origin in ("https://page.example", url):  # a listed origin, and the server's own
            async with websockets.connect(ws_url(url), origin=origin) as ws:  # type: ignore[arg-type]
                assert json.loads(await ws.recv())["type"] == "session.created"
    assert refusal(elsewhere)[0] == 403 and refusal(elsewhere)[1]["code"] == "origin_not_allowed"


async def test_websocket_and_webrtc_sessions_share_max_sessions(tmp_path):
    async with serving(Settings(cache_dir=tmp_path, max_sessions=1)) as url:
        async with websockets.connect(ws_url(url)) as ws:
            await ws.recv()
            with pytest.raises(InvalidStatus) as second:
                await websockets.connect(ws_url(url))
            async with httpx.AsyncClient(base_url=url) as http:
                offer = await http.post("/v1/realtime/calls", content="\r\n".join(OFFER_LINES) + "\r\n",
                                        headers={"Content-Type": "application/sdp"})
                health = (await http.get("/healthz")).json()
                metrics = (await http.get("/metrics")).text
    status, error = refusal(second)
    assert (status, error["code"]) == (429, "too_many_sessions")
    assert second.value.response.headers["Retry-After"] == "30"
    assert offer.status_code == 429
    assert health["sessions"] == 1
    assert 'omni_rtc_sessions_open{transport="websocket"} 1.0' in metrics


async def test_one_client_holds_at_most_its_share_of_sessions_across_transports(tmp_path):
    """Clients named by the trusted proxy: the third session of one is refused, another client and
    this machine's own clients still get in."""
    settings = Settings(cache_dir=tmp_path, max_sessions_per_client=2, trusted_proxies=["127.0.0.1"],
                        allow_unauthenticated_public=True)
    visitor, neighbour = {"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "203.0.113.8"}
    async with serving(settings) as url, contextlib.AsyncExitStack() as held:
        for _ in range(2):
            await (await held.enter_async_context(websockets.connect(ws_url(url), additional_headers=visitor))).recv()
        with pytest.raises(InvalidStatus) as third:
            await websockets.connect(ws_url(url), additional_headers=visitor)
        async with httpx.AsyncClient(base_url=url) as http:
            offer = await http.post("/v1/realtime/calls", content="\r\n".join(OFFER_LINES) + "\r\n",
                                    headers={"Content-Type": "application/sdp", **visitor})
        await (await held.enter_async_context(websockets.connect(ws_url(url), additional_headers=neighbour))).recv()
        await (await held.enter_async_context(websockets.connect(ws_url(url)))).recv()  # this machine's
    status, error = refusal(third)
    assert (status, error["code"]) == (429, "too_many_sessions_for_client")
    assert offer.status_code == 429 and offer.json()["error"]["code"] == "too_many_sessions_for_client"


async def test_an_idle_session_is_told_and_closed_and_frees_its_slot(tmp_path):
    async with serving(Settings(cache_dir=tmp_path, max_sessions=1, session_idle_timeout_s=1.0)) as url:
        async with websockets.connect(ws_url(url)) as ws:
            await ws.recv()  # session.created
            await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Hi."}}))
            error = await next_event(ws, "error")
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=10)
        async with websockets.connect(ws_url(url)) as ws:  # the slot is free again
            assert json.loads(await ws.recv())["type"] == "session.created"
    assert error["error"]["code"] == "session_idle_timeout"


async def test_bad_frames_get_errors_and_the_session_goes_on(tmp_path):
    settings = Settings(cache_dir=tmp_path)
    async with serving(settings) as url:
        async with websockets.connect(ws_url(url)) as ws:
            await ws.recv()
            await ws.send(b"\x00\x01 binary")
            binary = await next_event(ws, "error")
            await ws.send(json.dumps({"type": "response.create", "padding": "x" * settings.max_event_bytes}))
            oversized = await next_event(ws, "error")
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "@@@", "event_id": "b"}))
            bad_base64 = await next_event(ws, "error")
            second = base64.b64encode(bytes(2 * 24_000)).decode()  # one second of silence
            # 10 s past the bound, at once: however slowly this machine sends them, some are refused.
            for index in range(MAX_APPEND_AHEAD_MS // 1000 + 10):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": second, "event_id": f"a{index}"}))
            events = await text_turn(ws)
            too_fast = [event for event in events if event["type"] == "error"]
            events = events[events.index(too_fast[-1]) + 1:] if too_fast else events
    assert binary["error"]["code"] == "invalid_frame"
    assert oversized["error"]["code"] == "event_too_large"
    assert (bad_base64["error"]["code"], bad_base64["error"]["event_id"]) == ("invalid_value", "b")
    assert too_fast and {e["error"]["code"] for e in too_fast} == {"input_audio_too_fast"}
    assert too_fast[-1]["error"]["event_id"] == f"a{MAX_APPEND_AHEAD_MS // 1000 + 9}"  # the last one, at least
    assert not [e for e in events if e["type"] == "error"]
    assert events[-1]["response"]["status"] == "completed"


async def test_5_s_of_10_ms_appends_sent_in_real_time_lose_nothing_and_a_flood_beside_them_is_refused(tmp_path):
    # 100 appends a second (LiveKit's 10 ms frames): counted as events, 151 of 500 would be lost.
    chunk = base64.b64encode(bytes(2 * 240)).decode()  # 10 ms of silence at 24 kHz
    async with serving(Settings(cache_dir=tmp_path)) as url, websockets.connect(ws_url(url)) as ws:
        await next_event(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        await next_event(ws, "session.updated")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for number in range(500):
            await asyncio.sleep(max(0.0, start + number / 100 - loop.time()))  # paced by the clock, not by sleeps
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk, "event_id": f"a{number}"}))
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "none", "event_id": f"f{number}"}))
        for number in range(300):  # then a flood of other events at once
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "none", "event_id": f"g{number}"}))
        errors = []
        with contextlib.suppress(TimeoutError):  # every answer has come once the socket is quiet for 2 s
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 2.0))
                if event["type"] == "error":
                    errors.append(event["error"])
        assert ws.close_code is None  # refused, never a flood: the session goes on
    codes = [e["code"] for e in errors]
    # Retrieves are taken (item_not_found) or refused (rate_limit_exceeded, answered at the replies'
    # rate); no append is refused (that would be input_audio_too_fast).
    assert set(codes) == {"item_not_found", "rate_limit_exceeded"}
    assert codes.count("item_not_found") <= 100 + 50 * 6  # 50 a second after the burst, over the ~5 s
    assert codes.count("rate_limit_exceeded") <= REPLY_BURST + REPLIES_PER_SECOND * 10


async def test_a_vanished_client_releases_the_session_and_its_engine_work(tmp_path):
    engine = ScriptedEngine("Hello there friend")
    engine.hold = asyncio.Event()  # the answer stays in generation until the client is gone
    async with serving(Settings(cache_dir=tmp_path), engine) as url:
        ws = await websockets.connect(ws_url(url))
        await ws.recv()
        await ws.send(json.dumps({"type": "response.create"}))
        await next_event(ws, "response.output_audio.delta")
        ws.transport.abort()  # no close frame: the TCP connection just drops
        async with httpx.AsyncClient(base_url=url) as http:
            async with asyncio.timeout(10):
                while (await http.get("/healthz")).json()["sessions"] != 0:
                    await asyncio.sleep(0.05)
            metrics = (await http.get("/metrics")).text
    assert engine.cancelled_turns == 1
    assert 'omni_rtc_calls_total{reason="client_closed",transport="websocket"} 1.0' in metrics


async def test_a_session_past_its_duration_is_told_and_closed(tmp_path):
    async with serving(Settings(cache_dir=tmp_path, max_session_s=0.5)) as url:
        async with websockets.connect(ws_url(url)) as ws:
            await ws.recv()
            expired = await next_event(ws, "error")
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
    assert expired["error"]["code"] == "session_expired"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


async def test_the_socket_client_speaks_two_acknowledged_turns(tmp_path):
    async with serving(Settings(cache_dir=tmp_path), ScriptedEngine("Hello there friend")) as url:
        async with RealtimeSocketClient(url, acknowledge_playback=True) as client:
            turns = [await client.speak(load_fixture(name)) for name in ("hello", "weather")]
            events = client.events
    acks = [e["event"] for e in events if e["type"] == "playback.acknowledged"]
    assert [(ack["played_ms"], ack["history_committed"]) for ack in acks] == [(240, True), (240, True)]
    for turn in turns:
        assert turn.status == "completed" and turn.transcript == "Hello there friend"
        assert turn.sample_rate == 24_000 and turn.audio_seconds == pytest.approx(0.24)
        assert turn.latency_s is not None and turn.latency_s > 0


async def test_shutdown_closes_open_websocket_sessions(tmp_path):
    engine = ScriptedEngine("Hello there friend")
    engine.hold = asyncio.Event()  # an answer in generation when the server stops
    async with serving(Settings(cache_dir=tmp_path), engine) as url:
        ws = await websockets.connect(ws_url(url))
        await ws.recv()
        await ws.send(json.dumps({"type": "response.create"}))
        await next_event(ws, "response.output_audio.delta")
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                await ws.recv()
    assert engine.cancelled_turns == 1


async def test_hang_up_answers_404_for_a_websocket_sessions_id_and_the_session_goes_on(tmp_path, caplog):
    """The registry holds sessions of both transports; hang-up ends only WebRTC calls. One media
    worker: the calls are this process's, so hang-up asks the registry (with more, it asks the workers)."""
    caplog.set_level(logging.INFO, logger="app.http.socket_route")
    async with serving(Settings(cache_dir=tmp_path, media_workers=1)) as url:
        async with websockets.connect(ws_url(url)) as ws:
            await ws.recv()
            [socket_id] = [record.args[0] for record in caplog.records if record.getMessage().endswith("sessions open)")]
            async with httpx.AsyncClient(base_url=url) as http:
                hang_up = await http.delete(f"/v1/realtime/calls/{socket_id}")
                events = await text_turn(ws)
                sessions = (await http.get("/healthz")).json()["sessions"]
    assert str(socket_id).startswith("ws_")
    assert (hang_up.status_code, hang_up.json()["error"]["code"]) == (404, "call_not_found")
    assert events[-1]["type"] == "response.done" and sessions == 1


def masked_frame(first_byte: int, payload: bytes) -> bytes:
    """One client frame (clients mask theirs, RFC 6455 5.3)."""
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 127]) + size.to_bytes(8, "big")
    mask = bytes([0x37, 0xFA, 0x21, 0x3D])
    masked = np.bitwise_xor(np.frombuffer(payload, np.uint8), np.resize(np.frombuffer(mask, np.uint8), size))
    return bytes([first_byte]) + length + mask + masked.tobytes()


async def test_a_deflate_bomb_leaves_the_servers_memory_where_it_was(tmp_path):
    """40 compressed frames of 16 KB, each 16 MiB of JSON once inflated (the audit's 0.67 GB)."""
    settings = Settings(cache_dir=tmp_path)
    event = b'{"type":"session.update","padding":"' + b"a" * (16 * 1024 * 1024 - 64) + b'"}'
    compressor = zlib.compressobj(wbits=-12)  # raw deflate in a window any server accepts (4 KiB)
    deflated = (compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH))[:-4]  # less 00 00 ff ff
    bomb = masked_frame(0xC1, deflated)  # FIN, RSV1 (compressed), text
    del event
    server = psutil.Process()  # the server runs in this process
    async with serving(settings) as url:
        port = int(url.rsplit(":", 1)[1])
        start = server.memory_info().rss
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(bytes(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode()
        )
        handshake = await reader.readuntil(b"\r\n\r\n")
        peak = start
        with contextlib.suppress(ConnectionError):  # the server may end the connection mid-bomb
            for _ in range(40):
                writer.write(bomb)
                await writer.drain()
                peak = max(peak, server.memory_info().rss)
            writer.write(masked_frame(0x88, (1000).to_bytes(2, "big")))  # close: past every frame sent
            async with asyncio.timeout(60):  # a guard against hangs, not a speed limit
                while await reader.read(65_536):
                    peak = max(peak, server.memory_info().rss)
        writer.close()
        async with websockets.connect(ws_url(url)) as ws:  # the server serves on
            await ws.recv()
            assert (await text_turn(ws))[-1]["response"]["status"] == "completed"
        end = server.memory_info().rss
    assert max(peak, end) - start < 50 * 1024 * 1024
    assert handshake.startswith(b"HTTP/1.1 101")
    assert b"permessage-deflate" not in handshake.lower()  # not negotiated: nothing inflates
