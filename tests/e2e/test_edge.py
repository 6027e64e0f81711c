"""Trust at the edge (``app/http/edge.py``) on a real socket: a DNS-rebinding WebSocket handshake to
uvicorn on 127.0.0.1 (it was answered 101 before the Host allow-list). The rest of the edge, over
ASGI: tests/app/http/test_edge.py."""

from __future__ import annotations

import asyncio

import pytest

from app.http.server import create_app
from tests.app.http.test_edge import REBINDING_HOST, settings_for
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e


async def websocket_handshake(url: str, headers: dict[str, str]) -> int:
    """The status of a WebSocket opening handshake sent with exactly these headers."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        lines = ["GET /v1/realtime HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade",
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
                 *(f"{name}: {value}" for name, value in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        async with asyncio.timeout(10):  # a guard against hangs, not a speed limit
            status_line = await reader.readline()
        return int(status_line.split()[1])
    finally:
        writer.close()


async def test_a_dns_rebinding_websocket_is_refused(tmp_path):
    """A rebinding page's handshake names its own host in both Host and Origin."""
    app = create_app(settings_for(tmp_path), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        port = url.rsplit(":", 1)[1]
        rebinding = await websocket_handshake(
            url, {"Host": f"{REBINDING_HOST}:{port}", "Origin": f"http://{REBINDING_HOST}:{port}"}
        )
        own_page = await websocket_handshake(url, {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"})
    assert rebinding == 421
    assert own_page == 101
