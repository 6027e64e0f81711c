"""The page in static/, in headless Chromium, talking to the real server over WebRTC.

A fake microphone plays two espeak utterances separated by silence, so the server's VAD commits
two voice turns; then the test types a text turn and hangs up. One conversation is recorded
once per module (a browser call costs seconds of CPU) and each test checks one thing it shows.
The page's test hook, ``window.omniRtc`` (documented in static/js/test-hook.js), gives the
server events the page received and its RTCPeerConnection for inbound-rtp stats.

The test waits for each answer to *start* (text streaming, audio playing), never for it to
end, so it does not depend on how long the model talks. Whatever is still playing is
interrupted by the next utterance (barge-in), by the typed message, or by hanging up.

A screenshot of the page mid-conversation is saved to ``test-output/`` (desktop and phone
widths) for a person to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from app.config import Settings
from app.http.call_refusals import capacity_error
from app.http.server import create_app
from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.conftest import get_json, open_sessions, serving_in_process, wait_for_sessions
from tests.fakes import ScriptedEngine

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TEST_OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
TYPED_TEXT = "Please answer in one short sentence."
# Generous deadline for the dev model with ~7 busy engineers on 2 cores; waiting is not
# measured, an answer that never starts fails the wait.
TURN_DEADLINE_MS = 120_000

# Watches what a person would see change: every status the page shows, in order, the
# loudest the microphone meter got, and every text a user turn showed (item id → texts in order).
SCRIPT_WATCH_DISPLAY = """document.addEventListener("DOMContentLoaded", () => {
  window.watched = { states: [], meterMax: 0, userTexts: {} };
  new MutationObserver(() => {
    for (const li of document.querySelectorAll("#transcript li.turn.user")) {
      const texts = (window.watched.userTexts[li.dataset.itemId] ??= []);
      const text = li.querySelector(".text").textContent;
      if (texts.at(-1) !== text) texts.push(text);
    }
  }).observe(document.getElementById("transcript"), { childList: true, subtree: true, characterData: true });
  const status = document.getElementById("status");
  const meter = document.getElementById("mic-meter");
  new MutationObserver(() => {
    const state = status.dataset.state;
    if (window.watched.states.at(-1) !== state) window.watched.states.push(state);
  }).observe(status, { attributes: true, attributeFilter: ["data-state"] });
  new MutationObserver(() => {
    window.watched.meterMax = Math.max(window.watched.meterMax, Number(meter.getAttribute("aria-valuenow")));
  }).observe(meter, { attributes: true, attributeFilter: ["aria-valuenow"] });
});"""
# Reads the page's events and its conversation in one go, so the two agree.
SCRIPT_SNAPSHOT = """() => ({
  events: window.omniRtc.events,
  transcript: [...document.querySelectorAll("#transcript li.turn")].map((li) => ({
    role: li.dataset.role,
    itemId: li.dataset.itemId,
    text: li.querySelector(".text").textContent,
    meta: li.querySelector(".meta").textContent,
    badge: li.querySelector(".badge")?.textContent ?? null,
  })),
  latencies: window.omniRtc.latencies,
  watched: window.watched,
})"""
SCRIPT_INBOUND_AUDIO = """async () => {
  const inbound = [];
  (await window.omniRtc.pc.getStats()).forEach((report) => {
    if (report.type === "inbound-rtp" && report.kind === "audio") inbound.push(report);
  });
  return inbound.length !== 1 ? null : {
    packetsReceived: inbound[0].packetsReceived,
    totalSamplesReceived: inbound[0].totalSamplesReceived,
    totalAudioEnergy: inbound[0].totalAudioEnergy,
  };
}"""
# True once the answer to a user turn has streamed text and started playing audio. The turn is
# the n-th committed utterance ({spoken: n}, 1-based) or the typed message ({typed: text}).
SCRIPT_ANSWER_STARTED = """(turn) => {
  const events = window.omniRtc.events;
  let spoken = 0;
  const start = events.findIndex((e) => turn.typed === undefined
    ? e.type === "input_audio_buffer.committed" && ++spoken === turn.spoken
    : e.type === "conversation.item.added" && e.item.content?.[0]?.text === turn.typed);
  if (start < 0) return false;
  const created = events.slice(start).find((e) => e.type === "response.created");
  if (!created) return false;
  const mine = events.filter((e) => e.response_id === created.response.id);
  return mine.some((e) => e.type === "response.output_audio_transcript.delta")
    && mine.some((e) => e.type === "output_audio_buffer.started");
}"""


# True once ``count`` user utterances have their transcription completed.
SCRIPT_TRANSCRIBED = """(count) => window.omniRtc.events.filter(
  (e) => e.type === "conversation.item.input_audio_transcription.completed").length >= count"""


@dataclass(frozen=True)
class RecordedConversation:
    events: list[dict[str, Any]]          # every server event the page received
    transcript: list[dict[str, Any]]      # the conversation as the page shows it
    latencies: list[dict[str, Any]]       # the page's own per-turn measurements
    states: list[str]                     # the statuses the page showed, in order
    meter_max: float                      # the highest microphone level shown (0-100)
    user_texts: dict[str, list[str]]      # every text each user turn showed, in order
    inbound_audio: dict[str, float]       # the audio inbound-rtp stats once both voice answers play
    sessions_after_hang_up: int


async def wait_for_answer(page: Page, turn: dict[str, Any]) -> None:
    await page.wait_for_function(SCRIPT_ANSWER_STARTED, arg=turn, timeout=TURN_DEADLINE_MS)


async def save_diagnostics(page: Page) -> None:
    """What the page saw, for a person reading a failed run: its events and a screenshot."""
    events = await page.evaluate("window.omniRtc.events")
    (TEST_OUTPUT / "browser-failure-events.json").write_text(json.dumps(events, indent=1))
    await page.screenshot(path=TEST_OUTPUT / "browser-failure.png", full_page=True)


@pytest.fixture(scope="module")
async def conversation(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> RecordedConversation:
    microphone = write_fake_microphone(
        tmp_path_factory.mktemp("browser") / "microphone.wav",
        [
            # Leading silence covers getUserMedia → ICE/DTLS → data channel open.
            Silence(3.0),
            FIXTURES / "hello.wav",
            # Room for the first answer to start; if it still plays, the second utterance barges in.
            Silence(6.0),
            FIXTURES / "weather.wav",
            Silence(1.0),  # then the capture device plays silence (%noloop)
        ],
    )
    TEST_OUTPUT.mkdir(exist_ok=True)
    async with async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone)
        page = await browser.new_page(viewport={"width": 1100, "height": 900})
        await page.add_init_script(SCRIPT_WATCH_DISPLAY)
        try:
            await page.goto(server_url)
            await page.click("#connect")
            await wait_for_answer(page, {"spoken": 2})
            inbound_audio = await page.evaluate(SCRIPT_INBOUND_AUDIO)

            await page.fill("#text-input", TYPED_TEXT)
            await page.click("#text-send")
            await wait_for_answer(page, {"typed": TYPED_TEXT})
            await page.wait_for_function(
                SCRIPT_TRANSCRIBED, arg=2, timeout=TURN_DEADLINE_MS
            )
            await page.screenshot(path=TEST_OUTPUT / "browser-conversation.png", full_page=True)
            await page.set_viewport_size({"width": 390, "height": 844})
            await page.screenshot(path=TEST_OUTPUT / "browser-conversation-phone.png", full_page=True)
            snapshot = await page.evaluate(SCRIPT_SNAPSHOT)
            await page.click("#hangup")
        except Exception:
            await save_diagnostics(page)
            raise
        finally:
            await browser.close()
    return RecordedConversation(
        events=snapshot["events"],
        transcript=snapshot["transcript"],
        latencies=snapshot["latencies"],
        states=snapshot["watched"]["states"],
        meter_max=snapshot["watched"]["meterMax"],
        user_texts=snapshot["watched"]["userTexts"],
        inbound_audio=inbound_audio,
        sessions_after_hang_up=await asyncio.to_thread(wait_for_sessions, server_url, 0),
    )


def events_of(conversation: RecordedConversation, event_type: str) -> list[dict[str, Any]]:
    return [event for event in conversation.events if event["type"] == event_type]


def turns_of(conversation: RecordedConversation, role: str) -> list[dict[str, Any]]:
    return [turn for turn in conversation.transcript if turn["role"] == role]


def test_page_connects_and_receives_the_session(conversation: RecordedConversation) -> None:
    assert conversation.events[0]["type"] == "session.created"
    assert events_of(conversation, "session.updated"), "the page's session.update was not answered"


def test_page_shows_what_the_system_is_doing(conversation: RecordedConversation) -> None:
    wanted = iter(conversation.states)
    # A subsequence: each state comes after the one before, other states may come between.
    assert all(
        any(state == want for state in wanted)
        for want in ("connecting", "listening", "user-speaking", "thinking", "speaking")
    ), conversation.states


def test_microphone_meter_moves_with_speech(conversation: RecordedConversation) -> None:
    # -60 dBFS shows as 0 and 0 dBFS as 100; the fixtures peak at -3 dBFS.
    assert conversation.meter_max > 50


def test_server_commits_both_spoken_utterances(conversation: RecordedConversation) -> None:
    committed = [event["item_id"] for event in events_of(conversation, "input_audio_buffer.committed")]
    assert len(committed) == 2
    shown = {turn["itemId"] for turn in turns_of(conversation, "user")}
    assert set(committed) <= shown


def test_page_shows_what_the_user_said_as_it_is_transcribed(conversation: RecordedConversation) -> None:
    # The page asks for input transcription (its "Show what I said" box is checked by default).
    transcripts = {
        event["item_id"]: event["transcript"]
        for event in events_of(conversation, "conversation.item.input_audio_transcription.completed")
    }
    committed = [event["item_id"] for event in events_of(conversation, "input_audio_buffer.committed")]
    assert set(transcripts) == set(committed) and all(transcripts.values())
    shown = {turn["itemId"]: turn["text"] for turn in turns_of(conversation, "user")}
    assert {item_id: shown[item_id] for item_id in committed} == transcripts
    deltas = events_of(conversation, "conversation.item.input_audio_transcription.delta")
    for item_id in committed:
        texts = conversation.user_texts[item_id]
        # "(voice message)" until the words come (unless a partial transcript came before the
        # item), then each delta's whole text so far (a partial one replaces the previous guess),
        # then the final transcript.
        said = [delta["transcript"] for delta in deltas if delta["item_id"] == item_id] + [transcripts[item_id]]
        expected = [text for i, text in enumerate(said) if i == 0 or text != said[i - 1]]
        assert texts in (expected, ["(voice message)", *expected])


def test_assistant_text_appears_as_streamed(conversation: RecordedConversation) -> None:
    expected: dict[str, str] = {}
    for event in conversation.events:
        if event["type"] == "response.output_audio_transcript.delta":
            expected[event["item_id"]] = expected.get(event["item_id"], "") + event["delta"]
        elif event["type"] == "response.output_audio_transcript.done":
            expected[event["item_id"]] = event["transcript"]
    assert len(expected) == 3, "three answers should have streamed text"
    shown = {turn["itemId"]: turn["text"] for turn in turns_of(conversation, "assistant")}
    assert {item_id: shown.get(item_id) for item_id in expected} == expected


def test_browser_plays_the_answers_audio_track(conversation: RecordedConversation) -> None:
    assert len(events_of(conversation, "output_audio_buffer.started")) >= 2
    assert conversation.inbound_audio["packetsReceived"] > 0
    assert conversation.inbound_audio["totalSamplesReceived"] > 0  # decoded for the <audio> element


def test_browser_hears_the_spoken_answer(conversation: RecordedConversation) -> None:
    assert conversation.inbound_audio["totalAudioEnergy"] > 0


def answer_events(conversation: RecordedConversation, after: int) -> list[dict[str, Any]]:
    """The events of the first response created after event index ``after``."""
    created = next(event for event in conversation.events[after:] if event["type"] == "response.created")
    return [event for event in conversation.events if event.get("response_id") == created["response"]["id"]]


def test_second_voice_turn_is_answered(conversation: RecordedConversation) -> None:
    second_commit = [
        index for index, event in enumerate(conversation.events) if event["type"] == "input_audio_buffer.committed"
    ][1]
    kinds = {event["type"] for event in answer_events(conversation, second_commit)}
    assert {"response.output_audio_transcript.delta", "output_audio_buffer.started"} <= kinds


def test_text_turn_is_answered(conversation: RecordedConversation) -> None:
    transcript = conversation.transcript
    typed = [index for index, turn in enumerate(transcript) if turn["role"] == "user" and turn["text"] == TYPED_TEXT]
    assert len(typed) == 1, "the typed message is not in the conversation"
    answers_after = [turn for turn in transcript[typed[0] + 1 :] if turn["role"] == "assistant"]
    assert answers_after and answers_after[0]["text"]


def test_interrupted_answer_is_marked_cut_off(conversation: RecordedConversation) -> None:
    # The typed message interrupts the second answer at least: its audio has only just started.
    cut_off = {
        item["id"]
        for event in events_of(conversation, "response.done")
        if event["response"]["status"] == "cancelled"
        for item in event["response"]["output"]
    } | {event["item_id"] for event in events_of(conversation, "conversation.item.truncated")}
    assert cut_off
    badges = {turn["itemId"]: turn["badge"] for turn in turns_of(conversation, "assistant")}
    assert {item_id: badges[item_id] for item_id in cut_off} == dict.fromkeys(cut_off, "cut off")


def test_page_shows_latency_measured_in_the_browser(conversation: RecordedConversation) -> None:
    spoken = [latency for latency in conversation.latencies if latency["from"] == "speech"]
    assert len(spoken) == 2
    assert all(latency["firstAudioEventMs"] > latency["fromMs"] for latency in spoken)
    metas = [turn["meta"] for turn in turns_of(conversation, "assistant")]
    assert sum("ms after end of speech (measured here)" in meta for meta in metas) == 2


def test_page_shows_the_servers_latency_breakdown(conversation: RecordedConversation) -> None:
    with_latency = [event for event in events_of(conversation, "response.done") if event.get("latency")]
    assert with_latency
    metas = {turn["itemId"]: turn["meta"] for turn in turns_of(conversation, "assistant")}
    for event in with_latency:
        # JavaScript's Math.round rounds halves up; Python's round() rounds them to even.
        total = math.floor(event["latency"]["end_of_speech_to_first_audio_ms"] + 0.5)
        assert f"server: {total} ms (" in metas[event["response"]["output"][0]["id"]]


def test_hang_up_leaves_no_session_on_the_server(conversation: RecordedConversation) -> None:
    assert conversation.sessions_after_hang_up == 0


async def test_refused_microphone_shows_a_clear_message(server_url: str) -> None:
    async with async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=None)
        try:
            page = await browser.new_page()
            await page.goto(server_url)
            await page.click("#connect")
            error = page.locator("#errors .error span")
            await error.wait_for(timeout=30_000)
            assert (await error.inner_text()).startswith("Microphone access was refused.")
            assert await page.evaluate("window.omniRtc.state") == "idle"
            assert await page.is_enabled("#connect")
        finally:
            await browser.close()


def end_call_on_server(url: str) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10) as response:
        return response.status


@contextlib.asynccontextmanager
async def page_with_a_silent_microphone(server_url: str, tmp_path: Path, *init_scripts: str) -> AsyncIterator[Page]:
    """The page, loaded and not yet connected, in a browser whose microphone hears a quiet room
    (``init_scripts`` run in it before the page's own)."""
    microphone = write_fake_microphone(tmp_path / "silence.wav", [Silence(60.0)])
    async with async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone)
        try:
            page = await browser.new_page()
            for script in (SCRIPT_WATCH_DISPLAY, *init_scripts):
                await page.add_init_script(script)
            await page.goto(server_url)
            yield page
        finally:
            await browser.close()


async def connect(page: Page) -> None:
    await page.click("#connect")
    await wait_until_listening(page)


async def wait_until_listening(page: Page) -> None:
    """Waits until the call is up at both ends: the page listens and the server's session.created
    has come (the page says "connecting" until then, though Chrome calls the event channel open
    once SCTP is up, before the server has seen the channel). A test that drops the call or reads
    the session any sooner races the server's first event."""
    await page.wait_for_function(
        "window.omniRtc.state === 'listening' && window.omniRtc.events.some((e) => e.type === 'session.created')",
        timeout=TURN_DEADLINE_MS,
    )


async def connect_for_form_changes(page: Page) -> None:
    """Connects, then waits for the answer to the update the page sends on connect: it refills
    the form with the effective session, so a control changed before it may be undone (seen
    once under the parallel suite's load: semantic VAD chosen, server VAD sent)."""
    await connect(page)
    await page.wait_for_function(
        "window.omniRtc.events.some((e) => e.type === 'session.updated')", timeout=TURN_DEADLINE_MS
    )


async def reconnected(page: Page, url: str) -> tuple[str, list[str], str, int]:
    """Wait for the page's second call to listen; its URL, the states it went through, the first
    error it showed and the server's open sessions then. Hangs up."""
    try:
        await page.wait_for_function(
            "window.omniRtc.events.filter((e) => e.type === 'session.created').length === 2"
            " && window.omniRtc.state === 'listening'",
            timeout=TURN_DEADLINE_MS,
        )
    except PlaywrightTimeoutError:
        seen = await page.evaluate("({state: window.omniRtc.state, states: window.watched.states,"
                                   " events: window.omniRtc.events.map((e) => e.type).slice(-30)})")
        raise AssertionError(f"the page did not listen on a second call: {seen}") from None
    second_call = await page.evaluate("window.omniRtc.callUrl")
    states = await page.evaluate("window.watched.states")
    error = await page.locator("#errors .error span").first.inner_text()
    sessions = await asyncio.to_thread(open_sessions, url)
    await page.click("#hangup")
    return second_call, states, error, sessions


async def test_page_reconnects_when_the_call_drops(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await connect(page)
        first_call = await page.evaluate("window.omniRtc.callUrl")
        assert await asyncio.to_thread(end_call_on_server, server_url + first_call) == 204

        second_call, states, error, sessions_while_reconnected = await reconnected(page, server_url)
    assert second_call != first_call
    assert states == ["connecting", "listening", "reconnecting", "listening"]
    assert error.startswith("Call dropped")
    assert sessions_while_reconnected == 1


async def test_page_notices_its_media_worker_dying_and_reconnects_to_a_live_one(tmp_path: Path) -> None:
    """A killed worker sends nothing more, not even a close: the page must not wait for ICE consent (~30 s).

    Chrome marks the connection not receiving after 2.5 s without packets and turns ICE
    "disconnected"; the page drops the call after DISCONNECT_GRACE_MS of it (static/js/call.js),
    where consent expiry would have said "the connection failed".
    """
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=2), engine=ScriptedEngine())
    async with serving_in_process(app) as url, page_with_a_silent_microphone(url, tmp_path) as page:
        await connect(page)
        first_call = await page.evaluate("window.omniRtc.callUrl")
        workers = (await asyncio.to_thread(get_json, f"{url}/healthz"))["workers"]
        [victim] = [worker["pid"] for worker in workers if worker["sessions"] == 1]
        os.kill(victim, signal.SIGKILL)

        second_call, states, error, sessions_while_reconnected = await reconnected(page, url)
    assert second_call != first_call
    assert states == ["connecting", "listening", "reconnecting", "listening"]
    assert error == "Call dropped: the connection was interrupted."
    assert sessions_while_reconnected == 1


# As a call whose SCTP association never comes up over a connected transport: the page's event
# channel never says it opened.
SCRIPT_EVENT_CHANNEL_NEVER_OPENS = """
Object.defineProperty(RTCDataChannel.prototype, "onopen", {set() {}, get() { return null; }, configurable: true});
Object.defineProperty(RTCDataChannel.prototype, "readyState", {get() { return "connecting"; }, configurable: true});
"""


async def test_a_call_whose_event_channel_never_opens_is_dropped_and_placed_again(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path, SCRIPT_EVENT_CHANNEL_NEVER_OPENS) as page:
        await page.click("#connect")
        await page.wait_for_function(
            "document.querySelector('#errors')?.textContent.includes('the event channel did not open')",
            timeout=TURN_DEADLINE_MS,
        )
        first_call = await page.evaluate("window.omniRtc.callUrl")
        # Placed again after the backoff's first second: a new call, the dropped one ended.
        await page.wait_for_function(f"window.omniRtc.callUrl && window.omniRtc.callUrl !== {first_call!r}",
                                     timeout=TURN_DEADLINE_MS)
        assert await asyncio.to_thread(wait_for_sessions, server_url, 1) == 1
        await page.click("#hangup")
    assert await asyncio.to_thread(wait_for_sessions, server_url, 0) == 0


# As a server that has not yet seen the event channel that the browser already calls open: the
# first message and all after it are held back EVENTS_HELD_MS, then delivered in order.
EVENTS_HELD_MS = 2000
SCRIPT_EVENTS_HELD_AFTER_OPEN = f"const HELD_MS = {EVENTS_HELD_MS};" + """
const onmessage = Object.getOwnPropertyDescriptor(RTCDataChannel.prototype, "onmessage");
Object.defineProperty(RTCDataChannel.prototype, "onmessage", {
  configurable: true,
  get() { return onmessage.get.call(this); },
  set(handler) {
    let releaseAt = null;
    window.heldEvents = 0;
    onmessage.set.call(this, (message) => {
      releaseAt ??= performance.now() + HELD_MS;
      const wait = releaseAt - performance.now();
      if (wait <= 0) return handler(message);
      window.heldEvents += 1;
      setTimeout(() => handler(message), wait);
    });
  },
});
"""


async def test_page_says_connecting_until_the_servers_session_has_come(server_url: str, tmp_path: Path) -> None:
    """Chrome calls the event channel open once SCTP is up, before the server has seen it: the
    page listens only once session.created has come."""
    async with page_with_a_silent_microphone(server_url, tmp_path, SCRIPT_EVENTS_HELD_AFTER_OPEN) as page:
        await page.click("#connect")
        await page.wait_for_function("window.omniRtc.dc?.readyState === 'open' && window.heldEvents > 0",
                                     timeout=TURN_DEADLINE_MS)
        held = await page.evaluate("({state: window.omniRtc.state, events: window.omniRtc.events.length})")
        await wait_until_listening(page)
        states = await page.evaluate("window.watched.states")
        await page.click("#hangup")
    assert held == {"state": "connecting", "events": 0}
    assert states == ["connecting", "listening"]


async def test_page_says_when_the_call_is_recorded(tmp_path: Path) -> None:
    record_dir = tmp_path / "recordings"
    settings = Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=1, record_dir=record_dir)
    app = create_app(settings, engine=ScriptedEngine())
    async with serving_in_process(app) as url, page_with_a_silent_microphone(url, tmp_path) as page:
        assert not await page.is_visible("#recording-note")
        await connect(page)
        assert await page.is_visible("#recording-note")
        assert "recorded" in await page.inner_text("#recording-note")
    assert [path for path in record_dir.iterdir()]  # the page's call has its folder


async def test_page_says_nothing_of_recording_when_the_server_does_not_record(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await connect(page)
        created = await page.evaluate("window.omniRtc.events.find((e) => e.type === 'session.created')")
        assert created["session"]["recording"] == {"enabled": False}
        assert not await page.is_visible("#recording-note")


async def test_page_shows_the_framework_snippets_with_this_servers_address(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await page.click(".frameworks summary")
        code = await page.locator(".frameworks code").inner_text()
    host = server_url.removeprefix("http://")
    assert f'OpenAIRealtimeLLMService(api_key="unused", base_url="ws://{host}/v1/realtime")' in code
    assert f'RealtimeModel(base_url="http://{host}/v1", api_key="unused")' in code
    assert f'model_config={{"url": "ws://{host}/v1/realtime"}}' in code


async def test_session_controls_become_a_session_update(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await page.select_option("#voice", "chelsie")  # before connecting: sent on connect
        await connect_for_form_changes(page)
        await page.uncheck("#barge-in")
        await page.fill("#silence-ms", "800")
        await page.fill("#instructions", "Answer in one word.")
        await page.uncheck("#transcribe")
        await page.select_option("#noise-reduction", "far_field")
        await page.click("#apply")
        await page.wait_for_function(
            "window.omniRtc.events.filter((e) => e.type === 'session.updated').length === 2", timeout=30_000
        )
        updated = await page.evaluate("window.omniRtc.events.filter((e) => e.type === 'session.updated')")
        errors = await page.locator("#errors .error").count()
    assert updated[0]["session"]["audio"]["output"]["voice"] == "chelsie"
    effective = updated[1]["session"]
    assert effective["audio"]["output"]["voice"] == "chelsie"
    assert effective["instructions"] == "Answer in one word."
    turn_detection = effective["audio"]["input"]["turn_detection"]
    assert (turn_detection["interrupt_response"], turn_detection["silence_duration_ms"]) == (False, 800)
    assert updated[0]["session"]["audio"]["input"]["transcription"]["model"] == "qwen3-omni"  # on by default
    assert effective["audio"]["input"]["transcription"] is None
    assert updated[0]["session"]["audio"]["input"]["noise_reduction"] is None  # the page's default: off
    assert effective["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    assert errors == 0


async def test_end_of_turn_choice_switches_to_semantic_vad_and_back(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await connect_for_form_changes(page)
        assert await page.locator("#eagerness").is_hidden()
        await page.select_option("#turn-detection", "semantic_vad")
        silence_hidden = await page.locator("#silence-ms").is_hidden()
        await page.select_option("#eagerness", "high")
        await page.click("#apply")
        await page.wait_for_function(
            "window.omniRtc.events.filter((e) => e.type === 'session.updated').length === 2", timeout=30_000
        )
        await page.select_option("#turn-detection", "server_vad")
        await page.fill("#silence-ms", "700")
        await page.click("#apply")
        await page.wait_for_function(
            "window.omniRtc.events.filter((e) => e.type === 'session.updated').length === 3", timeout=30_000
        )
        updated = await page.evaluate("window.omniRtc.events.filter((e) => e.type === 'session.updated')")
        errors = await page.locator("#errors .error").count()
    assert silence_hidden
    semantic = updated[1]["session"]["audio"]["input"]["turn_detection"]
    assert (semantic["type"], semantic["eagerness"]) == ("semantic_vad", "high")
    server = updated[2]["session"]["audio"]["input"]["turn_detection"]
    assert (server["type"], server["silence_duration_ms"]) == ("server_vad", 700)
    assert errors == 0


async def test_echo_cancellation_toggle_replaces_the_microphone_track(server_url: str, tmp_path: Path) -> None:
    sender_echo_cancellation = (
        "window.omniRtc.pc.getSenders().find((s) => s.track?.kind === 'audio').track.getSettings().echoCancellation"
    )
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await connect(page)
        assert await page.evaluate(sender_echo_cancellation) is True
        await page.uncheck("#echo-cancellation")
        await page.wait_for_function(f"{sender_echo_cancellation} === false", timeout=30_000)
        state = await page.evaluate("window.omniRtc.state")
        errors = await page.locator("#errors .error").count()
    assert (state, errors) == ("listening", 0)


async def test_server_error_event_is_shown(server_url: str, tmp_path: Path) -> None:
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await connect(page)
        # The page never sends a bad event itself; the hook's channel stands in for a buggy client.
        await page.evaluate("window.omniRtc.dc.send(JSON.stringify({type: 'no.such.event', event_id: 'evt_bad'}))")
        error = page.locator("#errors .error span")
        await error.wait_for(timeout=30_000)
        shown = await error.inner_text()
        state = await page.evaluate("window.omniRtc.state")
    assert shown.startswith("Server error: Invalid value: 'no.such.event'.")
    assert shown.endswith("(invalid_value, type)")
    assert state == "listening"  # the session goes on


async def test_refused_call_shows_the_http_error(server_url: str, tmp_path: Path) -> None:
    full = capacity_error(16).to_response()  # what a full server answers: 429, Retry-After, OpenAI error body
    async with page_with_a_silent_microphone(server_url, tmp_path) as page:
        await page.route(
            "**/v1/realtime/calls",
            lambda route: route.fulfill(
                status=full.status_code, headers=dict(full.headers), body=full.body, content_type="application/json"
            ),
        )
        await page.click("#connect")
        error = page.locator("#errors .error span")
        await error.wait_for(timeout=30_000)
        shown = await error.inner_text()
        state = await page.evaluate("window.omniRtc.state")
        connect_enabled = await page.is_enabled("#connect")
    assert shown == (
        "The server refused the call (HTTP 429): The server is serving its maximum of 16 sessions; "
        f"try again shortly. Try again in {full.headers['retry-after']} s."
    )
    assert (state, connect_enabled) == ("idle", True)
