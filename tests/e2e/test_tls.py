"""HTTPS served: uvicorn on 127.0.0.1 with a self-signed certificate (``app/http/tls.py``). The
certificate and the settings: tests/app/http/test_tls.py."""

from __future__ import annotations

import ssl

import httpx
import pytest

from app.config import Settings
from app.http.server import create_app
from app.http.tls import ensure_self_signed
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e


async def test_a_client_that_trusts_the_certificate_gets_https(tmp_path):
    files = ensure_self_signed(tmp_path / "tls", ["127.0.0.1", "localhost"])
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app, ssl_certfile=str(files.certfile), ssl_keyfile=str(files.keyfile)) as url:
        trusting = ssl.create_default_context(cafile=str(files.certfile))  # as SSL_CERT_FILE=... does
        async with httpx.AsyncClient(verify=trusting) as http:
            response = await http.get(f"{url}/healthz")
        async with httpx.AsyncClient() as http:  # the system's CAs only: refused
            with pytest.raises(httpx.ConnectError):
                await http.get(f"{url}/healthz")
    assert url.startswith("https://")
    assert response.json()["status"] == "ok"
