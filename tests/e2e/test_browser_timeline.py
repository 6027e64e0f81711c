"""The page's turn timeline in headless Chromium: a fake microphone says one utterance, the
answer plays out, the test opens the timeline and reads ``window.omniTimeline``
(static/js/timeline.js).

The server runs in this process with a scripted engine whose answer is a tone (clearly audible
after Opus); the page, its lanes and marks are what is tested. After the call, the operator
page (``/debug/timeline.html``, from ``GET /debug/turns``) shows the call, which a media worker
carried and recorded; the page plays the recording (``GET /debug/recordings``) over its timeline,
whose lanes are the recording's measured levels (``window.omniReplay``, static/js/debug-turns.js).
A second call barges in on a long answer: the cut is marked on the answer it cut, and its
recording plays the cut answer only up to the cut. The
screenshots are saved to ``test-output/browser-timeline.png``, ``browser-timeline-barge-in.png``,
``debug-timeline.png`` and ``debug-replay.png`` for a person (and CI's artifacts) to look at.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from playwright.async_api import async_playwright

from app.config import Settings
from app.http.server import create_app
from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.conftest import serving_in_process
from tests.e2e.test_browser import TEST_OUTPUT, save_diagnostics
from tests.fakes import ScriptedEngine
from tests.operator_routes import closed_sessions, finished_recordings

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEADLINE_MS = 60_000  # a guard against hangs on 2 shared cores, not a speed limit
HEARD_FLOOR_DB = -50.0  # static/js/timeline.js HEARD_FLOOR_DB
MARK_TOLERANCE_MS = 50.0
# The page's jitter buffer still plays the answer's tail this long after the server's
# output_audio_buffer.stopped (~100-200 ms), with room for the 20 ms sampling.
PLAYOUT_TAIL_MS = 400.0

SCRIPT_PLAYED_OUT = """() => window.omniRtc.events.some((e) => e.type === "output_audio_buffer.stopped")
  && window.omniRtc.events.some((e) => e.type === "response.done")"""
SCRIPT_REPLAY_LOADED = """() => {
  const audio = document.getElementById("replay-audio");
  return audio.readyState >= 1 && Number.isFinite(audio.duration) && document.querySelectorAll("#replay-turns canvas").length > 0;
}"""
SCRIPT_READ_REPLAY = """() => {
  const audio = document.getElementById("replay-audio");
  const playheads = [...document.querySelectorAll("#replay-turns .playhead")];
  return {
    duration: audio.duration, currentTime: audio.currentTime, paused: audio.paused, replay: window.omniReplay,
    playheads: playheads.map((p) => ({ hidden: p.hidden, left: p.style.left })),
  };
}"""
SCRIPT_READ = """() => ({
  timeline: window.omniTimeline,
  events: window.omniRtc.events.map((e) => e.type),
  eventTimes: window.omniRtc.eventTimes,
  responseDone: window.omniRtc.events.find((e) => e.type === "response.done"),
  canvases: document.querySelectorAll("#timeline-turns canvas").length,
})"""


@pytest.fixture(scope="module")
async def timeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("browser-timeline")
    # Leading silence covers getUserMedia → ICE/DTLS → data channel open; the trailing silence
    # lets the answer play out with nothing more said.
    microphone = write_fake_microphone(folder / "microphone.wav", [Silence(2.5), FIXTURES / "hello.wav", Silence(5.0)])
    engine = ScriptedEngine("Hello there, how can I help you today?", waveform="tone")
    app = create_app(Settings(ice_loopback=True, cache_dir=folder, record_dir=folder / "recordings"), engine=engine)
    TEST_OUTPUT.mkdir(exist_ok=True)
    async with serving_in_process(app) as url, async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone)
        page = await browser.new_page(viewport={"width": 1100, "height": 900})
        try:
            await page.goto(url)
            assert not await page.evaluate("document.getElementById('timeline').open"), "collapsed by default"
            await page.click("#connect")
            await page.wait_for_function(SCRIPT_PLAYED_OUT, timeout=DEADLINE_MS)
            await page.wait_for_timeout(PLAYOUT_TAIL_MS)  # the tail the jitter buffer still plays
            await page.click("#timeline summary")
            await page.wait_for_timeout(100)  # a sample tick draws the open timeline
            read = await page.evaluate(SCRIPT_READ)
            await page.locator("#timeline").screenshot(path=TEST_OUTPUT / "browser-timeline.png")
            await page.click("#hangup")
            read["debug"] = await closed_sessions(url)
            await page.goto(f"{url}/debug/timeline.html")
            await page.wait_for_selector("body[data-loaded]", timeout=DEADLINE_MS)
            read["debugFigures"] = await page.evaluate(
                "[...document.querySelectorAll('figure[data-response-id]')].map((f) => f.dataset.responseId)")
            await page.locator("#sessions").screenshot(path=TEST_OUTPUT / "debug-timeline.png")
            read.update(await replayed(page, url))
        except Exception:
            await save_diagnostics(page)
            raise
        finally:
            await browser.close()
    return read




async def replayed(page: Any, url: str) -> dict[str, Any]:
    """The operator page plays the call's recording: picked from the list, played a moment,
    then a click on the middle of its turn seeks there."""
    [recording] = await finished_recordings(url)
    session_id = recording["session_id"]
    async with httpx.AsyncClient(base_url=url) as client:
        recorded = (await client.get(f"/debug/recordings/{session_id}/timeline.json")).json()
        wav = (await client.get(f"/debug/recordings/{session_id}/audio.wav")).content
    await page.reload()  # lists the recording, now written whole
    await page.wait_for_selector("body[data-loaded]", timeout=DEADLINE_MS)
    await page.click(f"#recordings button[data-session-id='{session_id}']")
    await page.wait_for_function(SCRIPT_REPLAY_LOADED, timeout=DEADLINE_MS)
    loaded = await page.evaluate(SCRIPT_READ_REPLAY)
    await page.evaluate("document.getElementById('replay-audio').play()")  # after the click: allowed
    await page.wait_for_timeout(1_500)
    playing = await page.evaluate(SCRIPT_READ_REPLAY)
    await page.evaluate("document.getElementById('replay-audio').pause()")
    canvas = page.locator("#replay-turns canvas").first
    box = await canvas.bounding_box()
    assert box is not None
    await canvas.click(position={"x": box["width"] / 2, "y": box["height"] / 2})
    await page.wait_for_timeout(200)
    sought = await page.evaluate(SCRIPT_READ_REPLAY)
    await page.locator("#replay").screenshot(path=TEST_OUTPUT / "debug-replay.png")
    return {"recorded": recorded, "wav": wav, "replayLoaded": loaded, "replayPlaying": playing, "replaySought": sought}


def spoken_turn(read: dict[str, Any]) -> dict[str, Any]:
    turns = [t for t in read["timeline"]["turns"] if any(m["kind"] == "response.done" for m in t["marks"])]
    assert len(turns) == 1, read["timeline"]["turns"]
    return turns[0]


def mark_at(turn: dict[str, Any], kind: str) -> float:
    times = [m["atMs"] for m in turn["marks"] if m["kind"] == kind]
    assert len(times) == 1, (kind, turn["marks"])
    return float(times[0])


def loud(points: list[dict[str, Any]], start: float, end: float) -> list[float]:
    return [p["t"] for p in points if start <= p["t"] <= end and p["db"] is not None and p["db"] > HEARD_FLOOR_DB]


def test_timeline_is_drawn_per_turn(timeline: dict[str, Any]) -> None:
    assert timeline["canvases"] == len(timeline["timeline"]["turns"]) >= 1


def test_marks_are_at_the_events_arrival(timeline: dict[str, Any]) -> None:
    turn = spoken_turn(timeline)
    arrivals: dict[str, list[float]] = {}
    for event_type, at in zip(timeline["events"], timeline["eventTimes"], strict=True):
        arrivals.setdefault(event_type, []).append(at)
    event_marks = [m for m in turn["marks"] if m["kind"] in arrivals]
    assert event_marks
    for mark in event_marks:
        nearest = min(abs(at - mark["atMs"]) for at in arrivals[mark["kind"]])
        assert nearest <= MARK_TOLERANCE_MS, mark
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "response.created", "output_audio_buffer.started", "answer_heard", "output_audio_buffer.stopped"]
    times = [mark_at(turn, kind) for kind in order]
    assert times == sorted(times), list(zip(order, times, strict=True))


def test_user_lane_holds_the_speech_and_nothing_after_it(timeline: dict[str, Any]) -> None:
    turn = spoken_turn(timeline)
    started, stopped = mark_at(turn, "input_audio_buffer.speech_started"), mark_at(turn, "input_audio_buffer.speech_stopped")
    # The VAD reports speech a few hundred ms after it began, and its end after the silence wait.
    assert loud(turn["user"], started - 600, stopped)
    # After speech_stopped the fake microphone plays silence only.
    assert not loud(turn["user"], stopped + MARK_TOLERANCE_MS, float("inf"))


def test_assistant_lane_holds_the_answer_where_it_played(timeline: dict[str, Any]) -> None:
    turn = spoken_turn(timeline)
    created = mark_at(turn, "response.created")
    started, stopped = mark_at(turn, "output_audio_buffer.started"), mark_at(turn, "output_audio_buffer.stopped")
    heard = mark_at(turn, "answer_heard")
    assert not loud(turn["assistant"], float("-inf"), created), "the assistant lane is quiet before the answer"
    sound = loud(turn["assistant"], started, stopped + PLAYOUT_TAIL_MS)
    assert sound and sound[0] == heard, "answer heard: the first loud sample once the server began sending"
    # Most of the time between the first sound and the server's stop is loud: the answer played.
    span = [p for p in turn["assistant"] if heard <= p["t"] <= stopped]
    assert len(loud(span, heard, stopped)) >= 0.6 * len(span)


def test_latency_split_is_the_response_done_block(timeline: dict[str, Any]) -> None:
    turn = spoken_turn(timeline)
    assert turn["latency"] == timeline["responseDone"]["latency"]
    assert turn["latency"]["end_of_speech_to_first_audio_ms"] > 0


def test_operator_page_shows_the_call_from_its_media_worker(timeline: dict[str, Any]) -> None:
    [session] = timeline["debug"]
    assert session["transport"] == "webrtc" and session["worker"] != "front"
    [turn] = session["turns"]
    response_id = timeline["responseDone"]["response"]["id"]
    assert turn["response_id"] == response_id
    # The block response.done carried, with the network figures the call added to it.
    assert turn["latency"] == timeline["responseDone"]["latency"]
    assert turn["latency"]["network"] is not None
    kinds = [mark["kind"] for mark in turn["marks"]]
    for kind in ("input_audio_buffer.speech_started", "end_of_speech", "input_audio_buffer.committed",
                 "response.created", "first_audio", "output_audio_buffer.started", "playback_end"):
        assert kind in kinds, kinds
    speech, audio = turn["user_speech"], turn["answer_audio"]
    assert speech["start_ms"] < speech["end_ms"] < audio["start_ms"] < audio["end_ms"]
    assert timeline["debugFigures"] == [response_id]


def test_operator_marks_match_the_pages_within_50_ms(timeline: dict[str, Any]) -> None:
    """The server's mark of each event (as it sent it) and the page's (as it arrived), both
    counted from response.created: the same intervals, less the loopback's jitter."""
    page_turn = spoken_turn(timeline)
    [session] = timeline["debug"]
    [server_turn] = session["turns"]
    server = {mark["kind"]: mark["at_ms"] for mark in server_turn["marks"]}
    page = {mark["kind"]: mark["atMs"] for mark in page_turn["marks"]}
    shared = sorted(set(server) & set(page))
    assert len(shared) >= 7, shared
    for kind in shared:
        server_ms = server[kind] - server["response.created"]
        page_ms = page[kind] - page["response.created"]
        assert abs(server_ms - page_ms) <= MARK_TOLERANCE_MS, (kind, server_ms, page_ms)


def test_operator_page_plays_the_recording_with_a_playhead_over_its_timeline(timeline: dict[str, Any]) -> None:
    session_s = timeline["recorded"]["closed_ms"] / 1000
    loaded, playing, sought = timeline["replayLoaded"], timeline["replayPlaying"], timeline["replaySought"]
    assert loaded["duration"] == pytest.approx(session_s, abs=0.1), "the audio is the session's length"
    assert not playing["paused"] and playing["currentTime"] > 0.5, playing
    assert playing["replay"]["moves"] >= 2 and playing["replay"]["playheadMs"] > 0, "the playhead followed it"
    # The click on the middle of the turn's canvas sought there: its playhead is in the middle.
    first = sought["playheads"][0]
    assert not first["hidden"] and float(first["left"].rstrip("%")) == pytest.approx(50, abs=1), sought
    assert sought["currentTime"] != playing["currentTime"]


def test_the_recordings_lanes_show_its_levels_where_the_test_spoke_and_the_answer_played(
        timeline: dict[str, Any]) -> None:
    levels = timeline["recorded"]["levels"]
    step = levels["step_ms"]
    [recorded_turn] = timeline["recorded"]["turns"]
    [turn] = timeline["replayLoaded"]["replay"]["turns"]
    # The lanes drawn are timeline.json's levels, step by step (not the spans at one level).
    for lane, side in (("user", "input"), ("assistant", "output")):
        assert turn[lane] and all(p["db"] == levels[side][round(p["t"] / step)] for p in turn[lane]), lane
    marks = {mark["kind"]: mark["at_ms"] for mark in recorded_turn["marks"]}
    started, committed = marks["input_audio_buffer.speech_started"], marks["input_audio_buffer.committed"]
    # The VAD reports speech a few hundred ms after it began; after the commit the microphone is silent.
    assert loud(turn["user"], started - 600, marks["end_of_speech"])
    assert not loud(turn["user"], committed + MARK_TOLERANCE_MS, float("inf"))
    first_audio, played_out = marks["first_audio"], marks["playback_end"]
    assert not loud(turn["assistant"], float("-inf"), marks["response.created"] - step), "quiet before the answer"
    # A step holds the 50 ms from its time: most of those from the first frame to the played-out mark are loud.
    playing = [p for p in turn["assistant"] if first_audio <= p["t"] <= played_out - step]
    assert playing and len(loud(playing, first_audio, played_out)) >= 0.6 * len(playing), playing


def test_the_recordings_audio_places_the_answer_where_it_was_sent(timeline: dict[str, Any]) -> None:
    stereo, rate = soundfile.read(io.BytesIO(timeline["wav"]), dtype="float32")
    [turn] = timeline["recorded"]["turns"]
    first_audio = next(mark["at_ms"] for mark in turn["marks"] if mark["kind"] == "first_audio")
    answer = stereo[:, 1]
    assert float(np.argmax(np.abs(answer) > 0.01)) * 1000 / rate == pytest.approx(first_audio, abs=MARK_TOLERANCE_MS)
    speech = np.flatnonzero(np.abs(stereo[:, 0]) > 0.01) * 1000 / rate
    started = next(mark["at_ms"] for mark in turn["marks"] if mark["kind"] == "input_audio_buffer.speech_started")
    assert speech.size and speech[0] < started < speech[-1], "the user's speech around the VAD's report of it"


SCRIPT_SECOND_ANSWER_PLAYS = """() => window.omniRtc.events.filter((e) => e.type === "output_audio_buffer.started").length >= 2"""


@pytest.fixture(scope="module")
async def barge_in(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same utterance twice; the second comes while the first answer (8 s long) plays and cuts it."""
    folder = tmp_path_factory.mktemp("browser-timeline-barge-in")
    microphone = write_fake_microphone(
        folder / "microphone.wav",
        [Silence(2.5), FIXTURES / "hello.wav", Silence(2.0), FIXTURES / "hello.wav", Silence(3.0)],
    )
    engine = ScriptedEngine(" ".join(["word"] * 100), waveform="tone")  # 100 frames of 80 ms
    app = create_app(Settings(ice_loopback=True, cache_dir=folder, record_dir=folder / "recordings"), engine=engine)
    async with serving_in_process(app) as url, async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone)
        page = await browser.new_page(viewport={"width": 1100, "height": 900})
        try:
            await page.goto(url)
            await page.click("#connect")
            await page.wait_for_function(SCRIPT_SECOND_ANSWER_PLAYS, timeout=DEADLINE_MS)
            await page.wait_for_timeout(PLAYOUT_TAIL_MS)
            await page.click("#timeline summary")
            read = await page.evaluate(SCRIPT_READ)
            await page.locator("#timeline").screenshot(path=TEST_OUTPUT / "browser-timeline-barge-in.png")
            await page.click("#hangup")
            [recording] = await finished_recordings(url)
            async with httpx.AsyncClient(base_url=url) as client:
                base = f"/debug/recordings/{recording['session_id']}"
                read["recorded"] = (await client.get(f"{base}/timeline.json")).json()
                read["wav"] = (await client.get(f"{base}/audio.wav")).content
        except Exception:
            await save_diagnostics(page)
            raise
        finally:
            await browser.close()
    return read


def test_a_barge_in_cut_is_marked_on_the_answer_it_cut(barge_in: dict[str, Any]) -> None:
    turns = [t for t in barge_in["timeline"]["turns"] if t["responseId"] is not None]
    assert len(turns) == 2, barge_in["timeline"]["turns"]
    cut, second = turns
    cleared = mark_at(cut, "output_audio_buffer.cleared")
    arrivals = [at for kind, at in zip(barge_in["events"], barge_in["eventTimes"], strict=True)
                if kind == "output_audio_buffer.cleared"]
    assert min(abs(at - cleared) for at in arrivals) <= MARK_TOLERANCE_MS
    # The second utterance opened the next turn before the server cleared the first answer.
    assert mark_at(second, "input_audio_buffer.speech_started") <= cleared
    assert "output_audio_buffer.stopped" not in [m["kind"] for m in cut["marks"]]
    # The answer played until the cut, and the cut answer's lane is quiet after it (its tail
    # aside); the next answer is on the next turn.
    heard = mark_at(cut, "answer_heard")
    assert loud(cut["assistant"], heard, cleared)
    assert not loud(cut["assistant"], cleared + PLAYOUT_TAIL_MS, mark_at(second, "response.created"))
    assert loud(second["assistant"], mark_at(second, "answer_heard"), float("inf"))


def test_a_recorded_barge_in_plays_the_cut_answer_up_to_its_cut_only(barge_in: dict[str, Any]) -> None:
    """The cut answer's tail, written to the call and never played, is in output.flac but not on
    the session's clock: the assistant is silent from the cut to the next answer."""
    cut, second = [turn for turn in barge_in["recorded"]["turns"] if turn["status"] is not None][:2]
    cleared = next(mark["at_ms"] for mark in cut["marks"] if mark["kind"] == "output_audio_buffer.cleared")
    next_audio = next(mark["at_ms"] for mark in second["marks"] if mark["kind"] == "first_audio")
    stereo, rate = soundfile.read(io.BytesIO(barge_in["wav"]), dtype="float32")
    assistant = np.abs(stereo[:, 1])

    def loud(start_ms: float, end_ms: float) -> bool:
        return bool((assistant[round(start_ms * rate / 1000):round(end_ms * rate / 1000)] > 0.01).any())

    assert loud(cleared - 500, cleared), "the cut answer played until the cut"
    assert not loud(cleared + MARK_TOLERANCE_MS, next_audio - MARK_TOLERANCE_MS), "nothing of it after the cut"
    assert loud(next_audio, next_audio + 500), "the next answer where it was sent"
    # Its levels the same: loud up to the cut, at the floor from it to the next answer.
    levels = barge_in["recorded"]["levels"]
    step = levels["step_ms"]
    steps = [(index * step, db) for index, db in enumerate(levels["output"])]
    assert max(db for at, db in steps if cleared - 500 <= at <= cleared - step) > HEARD_FLOOR_DB
    tail = [db for at, db in steps if cleared + MARK_TOLERANCE_MS <= at <= next_audio - MARK_TOLERANCE_MS - step]
    assert tail and set(tail) == {levels["floor_db"]}, tail
