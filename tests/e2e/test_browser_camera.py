"""The page's camera in headless Chromium: a fake camera plays a Y4M the test writes, a fake
microphone says one utterance; the call negotiates the camera (sendonly from the page, VP8 or
H.264 as aiortc answers) and the committed turn's prompt holds its frames as image tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import async_playwright

from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.test_browser import TURN_DEADLINE_MS, save_diagnostics, wait_for_answer
from tests.pictures import write_y4m

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SCRIPT_RESPONSE_DONE = """() => window.omniRtc.events.some((e) => e.type === "response.done")"""
SCRIPT_CALL = """async () => {
  const pc = window.omniRtc.pc;
  const video = [];
  (await pc.getStats()).forEach((report) => {
    if (report.type === "outbound-rtp" && report.kind === "video") video.push(report);
  });
  const codecs = {};
  (await pc.getStats()).forEach((report) => { if (report.type === "codec") codecs[report.id] = report.mimeType; });
  return {
    offer: pc.localDescription.sdp,
    answer: pc.remoteDescription.sdp,
    framesSent: video.reduce((sum, report) => sum + (report.framesEncoded ?? 0), 0),
    codec: video.length ? codecs[video[0].codecId] ?? null : null,
    selfViewPlaying: !document.getElementById("self-view").hidden
      && document.getElementById("self-view").videoWidth > 0,
    events: window.omniRtc.events,
  };
}"""


def _video_section(sdp: str) -> str:
    return sdp.split("m=video", 1)[1].split("m=", 1)[0] if "m=video" in sdp else ""


@pytest.fixture(scope="module")
async def call(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("browser-camera")
    microphone = write_fake_microphone(folder / "microphone.wav", [Silence(3.0), FIXTURES / "hello.wav", Silence(2.0)])
    camera = write_y4m(folder / "camera.y4m", width=160, height=120, fps=10, frames=20)
    async with async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone, camera=camera)
        page = await browser.new_page()
        try:
            await page.goto(server_url)
            await page.check("#camera-toggle")
            await page.wait_for_function("document.getElementById('self-view').videoWidth > 0")
            await page.click("#connect")
            await wait_for_answer(page, {"spoken": 1})
            await page.wait_for_function(SCRIPT_RESPONSE_DONE, timeout=TURN_DEADLINE_MS)
            recorded = await page.evaluate(SCRIPT_CALL)
            await page.click("#hangup")
        except Exception:
            await save_diagnostics(page)
            raise
        finally:
            await browser.close()
    return recorded


def test_the_call_negotiates_the_camera_sendonly(call: dict[str, Any]) -> None:
    assert "a=sendonly" in _video_section(call["offer"])
    assert "a=recvonly" in _video_section(call["answer"])
    assert call["codec"] in ("video/VP8", "video/H264")
    assert call["framesSent"] > 0
    assert call["selfViewPlaying"]


def test_the_spoken_turns_prompt_holds_camera_frames(call: dict[str, Any]) -> None:
    events = call["events"]
    committed = next(e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed")
    item = next(e["item"] for e in events if e["type"] == "conversation.item.done" and e["item"]["id"] == committed)
    kinds = [part["type"] for part in item["content"]]
    assert kinds[-1] == "input_audio" and kinds.count("input_image") >= 1
    done = next(e for e in events if e["type"] == "response.done")
    # 160x120 frames: 20 tokens each (5 x 4 tokens of 32 x 32 pixels, the height rounded to 128).
    assert done["response"]["usage"]["input_token_details"]["image_tokens"] == 20 * kinds.count("input_image")
