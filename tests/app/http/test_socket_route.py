"""``GET /v1/realtime``: a WebSocket session draws on its client's share of the engine and of the
event rate (a real server on 127.0.0.1 behind a declared proxy, with a scripted engine)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from app.config import Settings
from app.http.server import create_app
from app.realtime.gate import EventRate
from app.realtime.shares import ClientShares, ShareSize
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

API_KEY = "sk-socket-route-test"


async def client_secret(url: str) -> str:
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {API_KEY}"})
    response.raise_for_status()
    return str(response.json()["value"])


async def next_of(ws: ClientConnection, *types: str) -> dict[str, Any]:
    while (event := json.loads(await ws.recv()))["type"] not in types:
        pass
    return event


def visitor(url: str, address: str, secret: str) -> Any:
    """A WebSocket session of the client at ``address`` behind the trusted proxy, with a client secret."""
    ws_url = url.replace("http://", "ws://") + "/v1/realtime"
    return connect(ws_url, additional_headers={"Authorization": f"Bearer {secret}", "X-Forwarded-For": address})


async def asked_for_a_response(ws: ClientConnection) -> dict[str, Any]:
    """``response.create``: its ``response.done``, or the ``error`` that refused it."""
    await ws.send(json.dumps({"type": "response.create"}))
    return await next_of(ws, "response.done", "error")


async def test_websockets_of_one_client_share_its_engine_share_and_another_clients_does_not():
    app = create_app(Settings(api_key=API_KEY, trusted_proxies=["127.0.0.1"], media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        # A client's bucket of one token: its first response runs, then it is spent (it refills in hours).
        app.state.runtime.client_shares = ClientShares(ShareSize(burst=1, per_second=0.0001))
        async with (
            visitor(url, "198.51.100.7", await client_secret(url)) as first,
            visitor(url, "198.51.100.7", await client_secret(url)) as second,
            visitor(url, "203.0.113.9", await client_secret(url)) as other,
        ):
            assert (await asked_for_a_response(first))["type"] == "response.done"
            refused = await asked_for_a_response(second)
            assert refused["type"] == "error" and refused["error"]["code"] == "engine_share_exceeded"
            assert "the client limit" in refused["error"]["message"]
            assert (await asked_for_a_response(other))["type"] == "response.done"


async def cleared(ws: ClientConnection) -> dict[str, Any]:
    """``input_audio_buffer.clear``: its ``input_audio_buffer.cleared``, or the ``error`` that refused it."""
    await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
    return await next_of(ws, "input_audio_buffer.cleared", "error")


async def test_websockets_of_one_client_are_refused_past_the_clients_event_rate_and_another_client_is_served():
    app = create_app(Settings(api_key=API_KEY, trusted_proxies=["127.0.0.1"], media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        # A client's event rate of 3 at once (it refills in hours); each session's own stays 100 at once.
        app.state.runtime.client_shares = ClientShares(events=EventRate(per_second=0.0001, burst=3))
        async with (
            visitor(url, "198.51.100.7", await client_secret(url)) as first,
            visitor(url, "198.51.100.7", await client_secret(url)) as second,
            visitor(url, "203.0.113.9", await client_secret(url)) as other,
        ):
            assert [(await cleared(first))["type"] for _ in range(2)] == ["input_audio_buffer.cleared"] * 2
            assert (await cleared(second))["type"] == "input_audio_buffer.cleared"
            refused = await cleared(second)  # the client's fourth event: two for each session, far under its own
            assert refused["type"] == "error" and refused["error"]["code"] == "rate_limit_exceeded"
            assert "(bursts of 3)" in refused["error"]["message"] and "(the client limit)" in refused["error"]["message"]
            assert (await cleared(other))["type"] == "input_audio_buffer.cleared"
            async with httpx.AsyncClient(base_url=url) as http:
                metrics = (await http.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}"})).text
        assert 'omni_rtc_event_rate_refusals_total{limit="client"} 1.0' in metrics
        assert 'omni_rtc_event_rate_refusals_total{limit="session"} 0.0' in metrics
