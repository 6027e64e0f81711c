"""``GET /v1/realtime``: a WebSocket session draws on its client's share of the engine (a real
server on 127.0.0.1 behind a declared proxy, with a scripted engine)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from app.config import Settings
from app.http.server import create_app
from app.realtime.engine_share import ClientShares, ShareSize
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


async def asked_for_a_response(ws: ClientConnection) -> dict[str, Any]:
    """``response.create``: its ``response.done``, or the ``error`` that refused it."""
    await ws.send(json.dumps({"type": "response.create"}))
    return await next_of(ws, "response.done", "error")


async def test_websockets_of_one_client_share_its_engine_share_and_another_clients_does_not():
    app = create_app(Settings(api_key=API_KEY, trusted_proxies=["127.0.0.1"], media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        # A client's bucket of one token: its first response runs, then it is spent (it refills in hours).
        app.state.runtime.client_shares = ClientShares(ShareSize(burst=1, per_second=0.0001))
        ws_url = url.replace("http://", "ws://") + "/v1/realtime"

        def visitor(address: str, secret: str) -> Any:
            return connect(ws_url, additional_headers={"Authorization": f"Bearer {secret}", "X-Forwarded-For": address})

        async with (
            visitor("198.51.100.7", await client_secret(url)) as first,
            visitor("198.51.100.7", await client_secret(url)) as second,
            visitor("203.0.113.9", await client_secret(url)) as other,
        ):
            assert (await asked_for_a_response(first))["type"] == "response.done"
            refused = await asked_for_a_response(second)
            assert refused["type"] == "error" and refused["error"]["code"] == "engine_share_exceeded"
            assert "the client limit" in refused["error"]["message"]
            assert (await asked_for_a_response(other))["type"] == "response.done"
