"""Trust at the edge (``app/http/edge.py``): the Host allow-list, forwarded headers only from trusted
proxies, cross-site offers, and who may read ``/debug``, ``/metrics`` and ``/healthz``.

Regressions of the audit (docs/HARDENING.md): a DNS-rebinding ``Host`` was served (HTTP 200,
WebSocket 101) and cross-site ``text/plain`` offers placed calls on a keyless local server. Over
ASGI; the WebSocket handshake on a real socket: tests/e2e/test_edge.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import Request
from pydantic import ValidationError

from app.cli import main
from app.config import Settings
from app.http.edge import HostAllowList, OriginPolicy, default_allowed_hosts, host_of, machine_names_and_addresses
from app.http.header_deadline import HeaderDeadlineProtocol
from app.http.server import create_app
from tests.app.http.test_server import offering_peer
from tests.fakes import ScriptedEngine

API_KEY = "sk-edge"
REBINDING_HOST = "rebind.attacker.example"


@contextlib.asynccontextmanager
async def asgi_client(settings: Settings, *, client: tuple[str, int] = ("127.0.0.1", 50_000),
                      base_url: str = "http://127.0.0.1:8000") -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, engine=ScriptedEngine())

    async def client_address(request: Request) -> dict[str, str | None]:
        return {"host": request.client.host if request.client else None, "scheme": request.url.scheme}

    # What the routes see of the client, after the edge; first, before the page's catch-all mount.
    app.add_api_route("/test/client", client_address)
    app.router.routes.insert(0, app.router.routes.pop())

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as http:
            yield http


def settings_for(tmp_path: Path, **values: object) -> Settings:
    return Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=1, **values)


def bearer(token: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- the Host allow-list --------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("GET", "/"), ("GET", "/healthz"), ("POST", "/v1/realtime/calls"),
                                              ("GET", "/v1/realtime/ice_servers")])
async def test_a_dns_rebinding_host_is_refused_on_every_route(tmp_path, method, path):
    async with asgi_client(settings_for(tmp_path)) as http:
        response = await http.request(method, path, headers={"Host": f"{REBINDING_HOST}:8000"})
    assert response.status_code == 421
    assert response.json()["error"]["code"] == "host_not_allowed"


async def test_allowed_host_adds_names(tmp_path):
    async with asgi_client(settings_for(tmp_path, allowed_hosts=["voice.example.org"])) as http:
        named = await http.get("/healthz", headers={"Host": "voice.example.org"})
        other = await http.get("/healthz", headers={"Host": "other.example.org"})
    assert named.status_code == 200
    assert other.status_code == 421


@pytest.mark.parametrize(("header", "allowed"), [
    ("localhost:8000", True), ("LOCALHOST", True), ("127.0.0.1", True), ("[::1]:8000", True), ("localhost.", True),
    ("voice.example.org:443", True), ("a.demo.example", True), ("demo.example", False),
    ("127.0.0.2", False), (REBINDING_HOST, False), ("", False), (None, False),
])
def test_host_allow_list_reads_names_ports_and_patterns(header, allowed):
    hosts = HostAllowList([*default_allowed_hosts("127.0.0.1"), "voice.example.org", "*.demo.example"])
    assert hosts.allows(header) is allowed


def test_a_star_allows_any_host():
    assert HostAllowList(["*"]).allows(REBINDING_HOST)


def test_host_of_strips_port_brackets_and_case():
    assert host_of("Voice.Example.ORG:8443") == "voice.example.org"
    assert host_of("[::1]:8000") == "::1"
    assert host_of("::1") == "::1"


def test_a_wildcard_bind_answers_for_this_machines_names_and_addresses():
    hosts = default_allowed_hosts("0.0.0.0")
    assert "localhost" in hosts
    assert set(machine_names_and_addresses()) <= set(hosts)
    assert "127.0.0.1" in hosts  # loopback is one of the machine's addresses too


# -- Origin ------------------------------------------------------------------------------


@pytest.mark.parametrize(("origin", "host", "allowed"), [
    (None, "127.0.0.1:8000", True),                                    # not a browser
    ("http://127.0.0.1:8000", "127.0.0.1:8000", True),                 # the page itself
    ("https://page.example", "127.0.0.1:8000", True),                  # --cors-origin
    (f"http://{REBINDING_HOST}:8000", f"{REBINDING_HOST}:8000", False),  # Host and Origin agree: not enough
    ("http://localhost:3000", "localhost:8000", False),                # another local site
    ("null", "127.0.0.1:8000", False),
])
def test_origins_are_the_servers_own_or_listed(tmp_path, origin, host, allowed):
    origins = OriginPolicy(settings_for(tmp_path, cors_origins=["https://page.example"]))
    assert origins.allows(origin, host) is allowed


# -- cross-site offers -------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
async def test_cross_site_simple_offers_are_refused(tmp_path, content_type):
    """A page of another site may post these without a CORS preflight: refused before any call is made."""
    async with offering_peer() as pc, asgi_client(settings_for(tmp_path)) as http:
        headers = {"Origin": "https://evil.example"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        response = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp.encode(), headers=headers)
        sessions = (await http.get("/healthz")).json()["sessions"]
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert sessions == 0


async def post_multipart(http: httpx.AsyncClient, sdp: str, headers: dict[str, str]) -> httpx.Response:
    response = await http.post("/v1/realtime/calls", files={"sdp": (None, sdp)}, headers=headers)
    if response.status_code == 201:
        await http.delete(response.headers["location"], headers=headers)
    return response


async def test_multipart_offers_need_an_allowed_origin(tmp_path):
    async with offering_peer() as pc, asgi_client(settings_for(tmp_path)) as http:
        sdp = pc.localDescription.sdp
        cross_site = await post_multipart(http, sdp, {"Origin": "https://evil.example"})
        own_page = await post_multipart(http, sdp, {"Origin": "http://127.0.0.1:8000"})
        no_browser = await post_multipart(http, sdp, {})
    assert cross_site.status_code == 403
    assert cross_site.json()["error"]["code"] == "origin_not_allowed"
    assert own_page.status_code == 201
    assert no_browser.status_code == 201


async def test_multipart_offers_with_the_key_need_no_origin_check(tmp_path):
    async with offering_peer() as pc, asgi_client(settings_for(tmp_path, api_key=API_KEY)) as http:
        response = await post_multipart(http, pc.localDescription.sdp, {"Origin": "https://evil.example", **bearer()})
    assert response.status_code == 201


# -- proxies ---------------------------------------------------------------------------------


async def test_forwarded_headers_name_the_client_only_from_a_trusted_proxy(tmp_path):
    settings = settings_for(tmp_path, api_key=API_KEY, trusted_proxies=["10.1.0.0/16"])
    forwarded = {"X-Forwarded-For": "198.51.100.7", "X-Forwarded-Proto": "https"}
    async with asgi_client(settings, client=("10.1.2.3", 40_000)) as http:
        through_proxy = (await http.get("/test/client", headers=forwarded)).json()
    async with asgi_client(settings, client=("192.0.2.50", 40_000)) as http:
        from_elsewhere = (await http.get("/test/client", headers=forwarded)).json()
    assert through_proxy == {"host": "198.51.100.7", "scheme": "https"}
    assert from_elsewhere == {"host": "192.0.2.50", "scheme": "http"}


async def test_a_keyless_server_refuses_requests_through_an_undeclared_proxy(tmp_path):
    async with asgi_client(settings_for(tmp_path)) as http:
        proxied = await http.get("/", headers={"X-Forwarded-For": "198.51.100.7"})
        direct = await http.get("/")
    assert proxied.status_code == 403
    assert proxied.json()["error"]["code"] == "proxy_not_trusted"
    assert direct.status_code == 200


def test_a_trusted_proxy_without_a_key_is_refused_at_start(tmp_path):
    with pytest.raises(ValidationError, match="OMNI_RTC_API_KEY"):
        settings_for(tmp_path, trusted_proxies=["127.0.0.1"])
    settings_for(tmp_path, trusted_proxies=["127.0.0.1"], allow_unauthenticated_public=True)  # said so: allowed


def test_a_trusted_proxy_must_be_an_address_or_network(tmp_path):
    with pytest.raises(ValidationError, match="trusted_proxies"):
        settings_for(tmp_path, api_key=API_KEY, trusted_proxies=["proxy.example"])


# -- /debug, /metrics, /healthz ------------------------------------------------------------------


@pytest.mark.parametrize(("client", "headers", "trusted", "status"), [
    ("127.0.0.1", {}, [], 200),                                   # local, no proxy
    ("127.0.0.1", {"X-Forwarded-For": "198.51.100.7"}, [], 403),  # speaks for someone else
    ("127.0.0.1", {"X-Forwarded-For": "127.0.0.1"}, [], 403),     # says it is local: still a proxy
    ("127.0.0.1", {}, ["127.0.0.1"], 403),                        # the proxy itself, without a header
    ("127.0.0.1", {"X-Forwarded-For": "127.0.0.1"}, ["127.0.0.1"], 403),
    ("192.0.2.50", {}, [], 403),
    ("192.0.2.50", bearer(), [], 200),                            # the key, from anywhere
    ("127.0.0.1", {"X-Forwarded-For": "198.51.100.7", **bearer()}, ["127.0.0.1"], 200),
])
async def test_debug_answers_local_clients_without_a_proxy_or_the_key(tmp_path, client, headers, trusted, status):
    settings = settings_for(tmp_path, api_key=API_KEY, trusted_proxies=trusted)
    async with asgi_client(settings, client=(client, 50_000)) as http:
        response = await http.get("/debug/resources", headers=headers)
    assert response.status_code == status, response.text


async def test_metrics_need_the_key_when_one_is_set(tmp_path):
    async with asgi_client(settings_for(tmp_path, api_key=API_KEY)) as http:
        without = await http.get("/metrics")
        with_key = await http.get("/metrics", headers=bearer())
    assert without.status_code == 401
    assert "omni_rtc_sessions_open" in with_key.text


async def test_metrics_public_opens_metrics_and_health_details(tmp_path):
    async with asgi_client(settings_for(tmp_path, api_key=API_KEY, metrics_public=True)) as http:
        metrics = await http.get("/metrics")
        health = (await http.get("/healthz")).json()
    assert metrics.status_code == 200
    assert "sessions" in health


async def test_healthz_without_the_key_says_only_the_status(tmp_path):
    async with asgi_client(settings_for(tmp_path, api_key=API_KEY)) as http:
        without = await http.get("/healthz")
        with_key = await http.get("/healthz", headers=bearer())
    assert without.status_code == 200
    assert without.json() == {"status": "ok"}
    assert {"model", "sessions", "workers", "engine"} <= set(with_key.json())


async def test_keyless_servers_show_metrics_to_local_clients(tmp_path):
    async with asgi_client(settings_for(tmp_path)) as http:
        assert (await http.get("/metrics")).status_code == 200
        assert "sessions" in json.loads((await http.get("/healthz")).text)


def test_serve_runs_uvicorn_without_its_own_forwarded_header_reading(monkeypatch, tmp_path):
    """uvicorn believes X-Forwarded-For from 127.0.0.1 unless told not to: a same-host proxy would
    make every visitor local. ``omni-rtc serve`` turns it off; the app reads trusted proxies itself."""
    ran: dict[str, object] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **options: ran.update(options))
    assert main(["serve", "--tls", "self-signed", "--cache-dir", str(tmp_path)]) == 0
    assert ran["proxy_headers"] is False
    assert ran["ssl_certfile"] == tmp_path / "tls" / "self-signed.pem"


def test_serve_bounds_slow_headers_and_open_connections(monkeypatch, tmp_path):
    ran: dict[str, object] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **options: ran.update(options))
    assert main(["serve", "--header-timeout", "3", "--max-connections", "64", "--cache-dir", str(tmp_path)]) == 0
    assert ran["limit_concurrency"] == 64
    protocol = ran["http"]
    assert isinstance(protocol, type) and issubclass(protocol, HeaderDeadlineProtocol)
    assert protocol.header_timeout_s == 3

