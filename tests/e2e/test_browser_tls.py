"""The page over HTTPS from the server itself (``--tls self-signed``), in headless Chromium.

The LAN demo of docs/DEPLOY.md: ``omni-rtc serve --tls self-signed`` makes a certificate for the
host's names and addresses in its cache dir and serves HTTPS; Chromium is told to accept exactly
that certificate (``--ignore-certificate-errors-spki-list`` with its key's hash, as a person
accepts the warning once). The page is a secure context, asks the server for its ICE servers
before it builds its peer connection, and completes a spoken turn.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.async_api import Request, async_playwright

from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.conftest import DISCONNECT_TIMEOUT_S, GENERATION, free_port
from tests.e2e.processes import STARTUP_DEADLINE_S, healthy, running

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TURN_DEADLINE_MS = 120_000  # a guard against hangs on 2 shared cores, not a speed limit
# True once a spoken utterance has been answered to the end (response.done after a commit).
SCRIPT_TURN_DONE = """() => {
  const events = window.omniRtc.events;
  const committed = events.findIndex((e) => e.type === "input_audio_buffer.committed");
  return committed >= 0 && events.slice(committed).some((e) => e.type === "response.done");
}"""


@pytest.fixture(scope="module")
def tls_server(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``omni-rtc serve --tls self-signed``; its base URL and the certificate it made."""
    cache_dir = tmp_path_factory.mktemp("cache")
    port = free_port()
    env = {
        **os.environ, "OMNI_RTC_GENERATION": json.dumps(GENERATION), "OMNI_RTC_ENGINE_THREADS": "1",
        "OMNI_RTC_DISCONNECT_TIMEOUT_S": str(DISCONNECT_TIMEOUT_S),
    }
    command = [
        sys.executable, "-m", "app.web.cli", "serve", "--tls", "self-signed", "--cache-dir", str(cache_dir),
        "--port", str(port), "--model", str(dev_model_dir), "--device", "cpu", "--seed", "0", "--ice-loopback",
        "--media-workers", "1",
    ]
    certificate = cache_dir / "tls" / "self-signed.pem"
    base_url = f"https://127.0.0.1:{port}"
    probe = healthy(base_url, cafile=certificate)
    with running(command, env=env, log_path=cache_dir / "server.log", deadline_s=STARTUP_DEADLINE_S,
                 ready=lambda: certificate.exists() and probe(), stop_signal=signal.SIGINT):
        yield base_url, certificate


def spki_hash(certificate: Path) -> str:
    """What ``--ignore-certificate-errors-spki-list`` names: base64(SHA-256(SubjectPublicKeyInfo))."""
    public_key = x509.load_pem_x509_certificate(certificate.read_bytes()).public_key()
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


async def test_the_page_over_self_signed_tls_completes_a_turn(tls_server: tuple[str, Path], tmp_path: Path) -> None:
    url, certificate = tls_server
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
