"""The page against a server that requires an API key, in headless Chromium.

The server runs in this process with a scripted engine (the page, the key and signaling are
what is tested); the page must say it needs a key, connect once it has one, and remember an
API key (not an ``ek_`` client secret) across a reload.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright

from app.config import Settings
from app.http.server import create_app
from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

API_KEY = "sk-browser-test"
DEADLINE_MS = 60_000  # a guard against hangs on 2 shared cores, not a speed limit
SESSION_CREATED = "() => window.omniRtc.events.some((e) => e.type === 'session.created')"


async def enter_key(page: Page, key: str) -> None:
    await page.evaluate("document.querySelector('details.access').open = true")
    await page.fill("#access-key", key)
    await page.dispatch_event("#access-key", "change")


async def test_page_asks_for_a_key_connects_with_it_and_remembers_it(tmp_path: Path):
    microphone = write_fake_microphone(tmp_path / "microphone.wav", [Silence(1.0)])
    app = create_app(Settings(ice_loopback=True, api_key=API_KEY), engine=ScriptedEngine())
    async with serving_in_process(app) as url, async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone)
        try:
            page = await browser.new_page()
            await page.goto(url)
            await page.click("#connect")
            await page.wait_for_function(
                "() => document.getElementById('errors').textContent.includes('access key')", timeout=DEADLINE_MS
            )
            await enter_key(page, API_KEY)
            await page.click("#connect")
            await page.wait_for_function(SESSION_CREATED, timeout=DEADLINE_MS)
            await page.click("#hangup")
            await page.reload()
            remembered = await page.input_value("#access-key")
            await enter_key(page, "ek_single_use")
            await page.reload()
            after_client_secret = await page.input_value("#access-key")
        finally:
            await browser.close()
    assert remembered == API_KEY
    assert after_client_secret == ""
