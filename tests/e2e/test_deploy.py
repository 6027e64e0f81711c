"""docs/DEPLOY.md's recipe, run: the server behind a real TLS reverse proxy on the same host, and
the LAN demo that serves HTTPS itself.

- **Behind a proxy.** The server runs with DEPLOY.md's environment file and its systemd unit's
  command (the dev model on the CPU in place of the real weights, a free port); Debian's nginx,
  with DEPLOY.md's site config, and Debian's Caddy, with DEPLOY.md's Caddyfile, terminate TLS in
  front of it (a self-signed certificate in place of Let's Encrypt's). The audit found that a
  same-host proxy makes every visitor look like 127.0.0.1: here calls and WebSocket sessions
  through the proxy need the key (and work with it), and ``/debug/resources`` is refused through
  it whatever the visitor says in ``X-Forwarded-For``.
- **The LAN demo.** ``omni-rtc serve --tls self-signed`` makes a certificate for the host's names
  and addresses in its cache dir and serves HTTPS; Chromium is told to accept exactly that
  certificate (``--ignore-certificate-errors-spki-list`` with its key's hash, as a person accepts
  the warning once). The page is a secure context, asks the server for its ICE servers before it
  builds its peer connection, and completes a spoken turn.

Both servers start at once (most of a start is the engine loading the model).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.async_api import Request, async_playwright
from websockets.asyncio.client import connect as websocket_connect
from websockets.exceptions import InvalidStatus

from app.cli import read_utterance
from app.client.webrtc import RealtimeClient
from app.client.websocket import RealtimeSocketClient
from app.http.tls import ensure_self_signed
from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.conftest import DISCONNECT_TIMEOUT_S, GENERATION
from tests.e2e.deploy_doc import deploy_block, env_file, unit_value
from tests.e2e.processes import STARTUP_DEADLINE_S, Launch, healthy, listening, running, running_together
from tests.listening_ports import free_port

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
API_KEY = "sk-proxy-test"
NGINX = "/usr/sbin/nginx"
CADDY = "/usr/bin/caddy"
OFFER_WITHOUT_CANDIDATES = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
TURN_DEADLINE_MS = 120_000  # a guard against hangs on 2 shared cores, not a speed limit
# The test's own settings on top of DEPLOY.md's: candidates on 127.0.0.1 (the namespace has only
# loopback), short turns, one engine thread (2 cores shared by the team).
TEST_SETTINGS = {
    "OMNI_RTC_ICE_LOOPBACK": "true",
    "OMNI_RTC_GENERATION": json.dumps(GENERATION),
    "OMNI_RTC_ENGINE_THREADS": "1",
    "OMNI_RTC_DISCONNECT_TIMEOUT_S": str(DISCONNECT_TIMEOUT_S),
    "OMNI_RTC_SEED": "0",
}
# True once a spoken utterance has been answered to the end (response.done after a commit).
SCRIPT_TURN_DONE = """() => {
  const events = window.omniRtc.events;
  const committed = events.findIndex((e) => e.type === "input_audio_buffer.committed");
  return committed >= 0 && events.slice(committed).some((e) => e.type === "response.done");
}"""


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    files = ensure_self_signed(tmp_path_factory.mktemp("tls"), ["127.0.0.1", "localhost"])
    assert files.keyfile is not None
    return files.certfile, files.keyfile


@dataclass(frozen=True)
class Servers:
    deployed: str  # DEPLOY.md's: plain HTTP on 127.0.0.1, behind the proxies
    lan_demo: str  # --tls self-signed
    lan_demo_certificate: Path


def deployed_launch(model_dir: Path, directory: Path) -> tuple[str, Launch]:
    """``omni-rtc serve`` as DEPLOY.md's unit runs it, with its environment file."""
    port = free_port()
    settings = env_file(deploy_block("env", {
        "sk-replace-with-the-api-key": API_KEY,
        "/models/Qwen3-Omni-30B-A3B-Instruct": str(model_dir),
        "OMNI_RTC_DEVICE=cuda": "OMNI_RTC_DEVICE=cpu",
        "OMNI_RTC_DTYPE=bfloat16": "OMNI_RTC_DTYPE=float32",
        "OMNI_RTC_PORT=8000": f"OMNI_RTC_PORT={port}",
    }))
    for turn_setting in ("OMNI_RTC_ICE_SERVERS", "OMNI_RTC_ICE_AUTH_SECRET"):  # no coturn here: tests/e2e/test_turn.py
        del settings[turn_setting]
    command = unit_value(deploy_block("systemd"), "ExecStart").split()
    assert command[0].endswith("/.venv/bin/omni-rtc"), command
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("OMNI_RTC_")},
        **settings, **TEST_SETTINGS,
    }
    url = f"http://127.0.0.1:{port}"
    return url, Launch(
        [sys.executable, "-m", "app.cli", *command[1:]], env=env, ready=healthy(url),
        log_path=directory / "deployed.log", deadline_s=STARTUP_DEADLINE_S, stop_signal=signal.SIGINT,
    )


def lan_demo_launch(model_dir: Path, directory: Path) -> tuple[str, Path, Launch]:
    """``omni-rtc serve --tls self-signed``: its URL, the certificate it makes, its launch."""
    port = free_port()
    cache_dir = directory / "cache"
    command = [
        sys.executable, "-m", "app.cli", "serve", "--tls", "self-signed", "--cache-dir", str(cache_dir),
        "--port", str(port), "--model", str(model_dir), "--device", "cpu", "--media-workers", "1",
    ]
    env = {**{name: value for name, value in os.environ.items() if not name.startswith("OMNI_RTC_")}, **TEST_SETTINGS}
    certificate = cache_dir / "tls" / "self-signed.pem"
    url = f"https://127.0.0.1:{port}"
    probe = healthy(url, cafile=certificate)
    return url, certificate, Launch(
        command, env=env, ready=lambda: certificate.exists() and probe(), log_path=directory / "lan-demo.log",
        deadline_s=STARTUP_DEADLINE_S, stop_signal=signal.SIGINT,
    )


@pytest.fixture(scope="module")
def servers(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    directory = tmp_path_factory.mktemp("servers")
    deployed, deployed_start = deployed_launch(dev_model_dir, directory)
    lan_demo, certificate, lan_demo_start = lan_demo_launch(dev_model_dir, directory)
    with running_together(deployed_start, lan_demo_start):
        yield Servers(deployed, lan_demo, certificate)


@pytest.fixture(scope="module")
def deployed_server(servers: Servers) -> str:
    return servers.deployed


@pytest.fixture(scope="module")
def nginx(deployed_server: str, certificate: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's nginx with DEPLOY.md's site config, in one foreground process."""
    directory = tmp_path_factory.mktemp("nginx")
    port = free_port()
    certfile, keyfile = certificate
    site = deploy_block("nginx", {
        "listen 443 ssl;": f"listen 127.0.0.1:{port} ssl;",
        "/etc/letsencrypt/live/voice.example.org/fullchain.pem": str(certfile),
        "/etc/letsencrypt/live/voice.example.org/privkey.pem": str(keyfile),
        "http://127.0.0.1:8000": deployed_server,
    })
    temp_paths = "\n".join(
        f"    {kind}_temp_path {directory / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    config = directory / "nginx.conf"
    config.write_text(
        f"daemon off;\nmaster_process off;\npid {directory / 'nginx.pid'};\nerror_log {directory / 'error.log'} info;\n"
        f"events {{}}\nhttp {{\n    access_log {directory / 'access.log'};\n{temp_paths}\n{site}\n}}\n"
    )
    with running([NGINX, "-p", str(directory), "-c", str(config)], log_path=directory / "nginx.out",
                 ready=listening("127.0.0.1", port)):
        yield f"https://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def caddy(deployed_server: str, certificate: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's Caddy with DEPLOY.md's Caddyfile."""
    directory = tmp_path_factory.mktemp("caddy")
    port = free_port()
    certfile, keyfile = certificate
    site = deploy_block("caddy", {
        "voice.example.org {": f"https://127.0.0.1:{port} {{\n    tls {certfile} {keyfile}",
        "127.0.0.1:8000": deployed_server.removeprefix("http://"),
    })
    config = directory / "Caddyfile"
    config.write_text(f"{{\n    admin off\n    auto_https disable_redirects\n}}\n{site}\n")
    env = {"HOME": str(directory), "XDG_DATA_HOME": str(directory / "data"), "XDG_CONFIG_HOME": str(directory / "config")}
    with running([CADDY, "run", "--config", str(config), "--adapter", "caddyfile"], env=env,
                 log_path=directory / "caddy.out", ready=listening("127.0.0.1", port)):
        yield f"https://127.0.0.1:{port}"


@pytest.fixture(params=["nginx", "caddy"])
def proxy(request: pytest.FixtureRequest, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    """The proxy's base URL; its certificate is trusted (httpx and websockets read SSL_CERT_FILE)."""
    if shutil.which({"nginx": NGINX, "caddy": CADDY}[request.param]) is None:
        pytest.fail(f"{request.param} is not installed: run scripts/system-deps.sh as root")
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    return request.getfixturevalue(request.param)


async def test_calls_without_the_key_get_401_through_the_proxy(proxy: str) -> None:
    async with httpx.AsyncClient(base_url=proxy) as http:
        response = await http.post(
            "/v1/realtime/calls", content=OFFER_WITHOUT_CANDIDATES, headers={"Content-Type": "application/sdp"}
        )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_credentials"


async def test_websocket_sessions_without_the_key_get_401_through_the_proxy(proxy: str) -> None:
    url = proxy.replace("https://", "wss://") + "/v1/realtime"
    with pytest.raises(InvalidStatus) as refused:
        async with websocket_connect(url):
            pass
    assert refused.value.response.status_code == 401


@pytest.mark.parametrize("forwarded_for", [None, "127.0.0.1"])
async def test_debug_resources_is_refused_through_the_proxy(proxy: str, forwarded_for: str | None) -> None:
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    async with httpx.AsyncClient(base_url=proxy) as http:
        response = await http.get("/debug/resources", headers=headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


async def test_metrics_need_the_key_through_the_proxy(proxy: str) -> None:
    async with httpx.AsyncClient(base_url=proxy) as http:
        without = await http.get("/metrics")
        health = await http.get("/healthz")
        with_key = await http.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    assert without.status_code == 401
    assert health.json() == {"status": "ok"}
    assert "omni_rtc_sessions_open" in with_key.text


async def test_a_websocket_turn_through_the_proxy(proxy: str) -> None:
    async with RealtimeSocketClient(proxy, api_key=API_KEY, timeout_s=120.0) as client:
        turn = await client.speak(read_utterance(FIXTURES / "hello.wav"))
    assert turn.status in ("completed", "incomplete")
    assert turn.audio_seconds > 0


async def test_a_webrtc_turn_through_nginx(nginx: str, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    async with RealtimeClient(nginx, api_key=API_KEY, ice_loopback=True, timeout_s=120.0) as client:
        turn = await client.speak(read_utterance(FIXTURES / "hello.wav"))
    assert turn.status in ("completed", "incomplete")
    assert turn.audio_seconds > 0


async def test_the_proxy_itself_is_not_a_local_client(deployed_server: str) -> None:
    """Straight to the server from 127.0.0.1, the address the proxy connects from: refused without the key."""
    async with httpx.AsyncClient(base_url=deployed_server) as http:
        refused = await http.get("/debug/resources")
        with_key = await http.get("/debug/resources", headers={"Authorization": f"Bearer {API_KEY}"})
    assert refused.status_code == 403
    assert with_key.status_code == 200
    assert with_key.json()["rss_bytes"] > 0


def spki_hash(certificate: Path) -> str:
    """What ``--ignore-certificate-errors-spki-list`` names: base64(SHA-256(SubjectPublicKeyInfo))."""
    public_key = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@pytest.mark.browser
async def test_the_page_over_self_signed_tls_completes_a_turn(servers: Servers, tmp_path: Path) -> None:
    url, certificate = servers.lan_demo, servers.lan_demo_certificate
    microphone = write_fake_microphone(tmp_path / "microphone.wav", [Silence(2.0), FIXTURES / "hello.wav", Silence(1.0)])
    requests: list[str] = []
    async with async_playwright() as playwright:
        browser = await launch_chromium(
            playwright, microphone=microphone, extra_args=[f"--ignore-certificate-errors-spki-list={spki_hash(certificate)}"]
        )
        try:
            page = await browser.new_page()

            def on_request(request: Request) -> None:
                requests.append(f"{request.method} {request.url.removeprefix(url)}")

            page.on("request", on_request)
            await page.goto(url)
            secure = await page.evaluate("window.isSecureContext")
            await page.click("#connect")
            await page.wait_for_function(SCRIPT_TURN_DONE, timeout=TURN_DEADLINE_MS)
            events = await page.evaluate("window.omniRtc.events")
            await page.click("#hangup")
        finally:
            await browser.close()
    assert secure
    assert requests.index("GET /v1/realtime/ice_servers") < requests.index("POST /v1/realtime/calls")
    done = [event for event in events if event["type"] == "response.done"]
    assert done[-1]["response"]["status"] in ("completed", "incomplete")
    assert any(event["type"] == "output_audio_buffer.started" for event in events)
