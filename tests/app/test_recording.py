"""Recordings: a real server on 127.0.0.1 records a WebSocket session's audio, events and transcript.

The engine is the scripted one; the server, its VAD, the socket and the writer threads are real.
The server has stopped (and so flushed every recording) before a folder is read.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import websockets

from app.client.webrtc import RealtimeClient
from app.client.websocket import RealtimeSocketClient
from app.config import Settings
from app.http.server import create_app
from app.http.socket_route import websocket_server_options
from app.realtime.turn_report import PlaybackReport, SessionStart
from app.recording import Recordings, RetentionBounds, folder_name, prune, recording_folders
from app.recording_levels import FLOOR_DB, LevelTrack, levels_json
from app.recording_playback import WAV_RATE, wav_bytes, wav_plan
from app.session_recording import AudioPlacement, RecordingWriter, SessionRecorder, WriterStart, redacted
from media.rates import SPEECH_RATE, VOICE_RATE
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.speech import load_fixture

KEY = "sk-recording-test-key-0123456789"
CLIENT_SECRET = "ek_recording_test_secret_42"
TOLERANCE_S = 0.1
FILES = {"input.flac", "output.flac", "events.jsonl", "transcript.jsonl", "session.json", "timeline.json"}


class CountingClient(RealtimeSocketClient):
    """The socket client, keeping every event it sent (the events file must hold them all)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.sent: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)
        await super().send(event)

    def input_seconds(self) -> float:
        """The audio appended, in seconds (PCM16 at 24 kHz, as the client sends it)."""
        return sum(len(base64.b64decode(e["audio"])) // 2 for e in self.sent
                   if e["type"] == "input_audio_buffer.append") / VOICE_RATE


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _received_audio_seconds(events: list[dict[str, Any]]) -> float:
    return sum(len(base64.b64decode(e["delta"])) // 2 for e in events
               if e["type"] == "response.output_audio.delta") / VOICE_RATE


def _all_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


async def test_a_recorded_session_keeps_both_sides_audio_every_event_and_the_transcript(tmp_path):
    record_dir = tmp_path / "recordings"
    settings = Settings(cache_dir=tmp_path, media_workers=1, api_key=KEY, record_dir=record_dir)
    app = create_app(settings, engine=ScriptedEngine("Hello there friend"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with CountingClient(url, api_key=KEY) as client:
            assert client.events[0]["session"]["recording"] == {"enabled": True}
            turn = await client.speak(load_fixture("hello"))
            start = len(client.events)
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"my key: {KEY}"}]}})
            # A client secret where none belongs: refused, and recorded without its value.
            await client.send({"type": "session.update", "session": {"client_secret": {"value": CLIENT_SECRET}}})
            await client.wait_for(lambda e: e.get("type") in ("session.updated", "error"), start=start)
            await client.wait_for("conversation.item.added", start=start)
        session_id = client.call_location
        server_events = list(client.events)
    assert turn.status == "completed"

    (folder,) = [path for _, path in recording_folders(record_dir)]
    assert folder.name.endswith(f"-{session_id}")
    assert {path.name for path in folder.iterdir()} == FILES

    heard = soundfile.info(folder / "input.flac")
    assert heard.samplerate == SPEECH_RATE
    assert heard.duration == pytest.approx(client.input_seconds(), abs=TOLERANCE_S)
    answered = soundfile.info(folder / "output.flac")
    assert answered.samplerate == VOICE_RATE
    assert _received_audio_seconds(server_events) > 0.1
    assert answered.duration == pytest.approx(_received_audio_seconds(server_events), abs=TOLERANCE_S)
    played, _ = soundfile.read(folder / "output.flac", dtype="float32")
    assert np.abs(played).max() > 0.01  # the answer's audio, not silence

    events = _lines(folder / "events.jsonl")
    recorded = [e["event"]["type"] for e in events if e["from"] == "server"]
    # Every event the client got (the transport's own audio deltas among them), and
    # output_audio_buffer.*: the session's, which a WebSocket does not carry (they tell when the
    # answer played).
    assert [kind for kind in recorded if not kind.startswith("output_audio_buffer.")] == [
        e["type"] for e in server_events]
    assert {"output_audio_buffer.started", "output_audio_buffer.stopped"} <= set(recorded)
    assert [e["event"]["type"] for e in events if e["from"] == "client"] == [e["type"] for e in client.sent]
    times = [e["t"] for e in events]
    assert times == sorted(times) and times[0] >= 0
    # Audio payloads are their lengths, never the audio again.
    appends = [e["event"] for e in events if e["event"]["type"] == "input_audio_buffer.append"]
    assert appends[0]["audio"] == {"base64_chars": len(client.sent[0]["audio"])}

    transcript = _lines(folder / "transcript.jsonl")
    answer_item = turn.response["output"][0]["id"]
    assert {"item_id": answer_item, "role": "assistant", "text": "Hello there friend"}.items() <= next(
        line for line in transcript if line["role"] == "assistant").items()
    assert any(line["role"] == "user" and line["text"] == "my key: [redacted]" for line in transcript)

    summary = json.loads((folder / "session.json").read_text())
    assert (summary["session_id"], summary["transport"], summary["dropped"]) == (session_id, "websocket", 0)

    for path in _all_files(record_dir):
        content = path.read_bytes()
        assert KEY.encode() not in content and CLIENT_SECRET.encode() not in content, path
        assert b"Bearer" not in content, path


async def test_without_a_record_dir_nothing_is_written(tmp_path):
    settings = Settings(cache_dir=tmp_path, media_workers=1)
    app = create_app(settings, engine=ScriptedEngine("Hello there"))
    before = set(_all_files(tmp_path))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with RealtimeSocketClient(url) as client:
            turn = await client.speak(load_fixture("hello"))
            assert app.state.runtime.recordings is None
    assert turn.status == "completed"
    assert client.events[0]["session"]["recording"] == {"enabled": False}
    assert set(_all_files(tmp_path)) == before


async def test_a_session_that_asks_not_to_be_recorded_leaves_nothing(tmp_path):
    record_dir = tmp_path / "recordings"
    settings = Settings(cache_dir=tmp_path, media_workers=1, record_dir=record_dir)
    app = create_app(settings, engine=ScriptedEngine("Hello there"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with RealtimeSocketClient(url, session={"recording": {"enabled": False}}) as client:
            updated = next(e for e in client.events if e["type"] == "session.updated")
            assert updated["session"]["recording"] == {"enabled": False}
            turn = await client.speak(load_fixture("hello"))
            start = len(client.events)
            await client.send({"type": "session.update", "session": {"recording": {"enabled": True}}})
            refused = await client.wait_for("error", start=start)
    assert turn.status == "completed"
    assert refused["error"]["param"] == "session.recording.enabled"
    assert _all_files(record_dir) == []


async def test_a_new_recording_removes_the_oldest_past_the_count(tmp_path):
    record_dir = tmp_path / "recordings"
    now = time.time()
    old = [record_dir / folder_name(f"sess_old{n}", now - 3_600 + n) for n in range(3)]
    for folder in old:
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_text("{}\n")
    keep = record_dir / "notes"  # not a recording: never touched
    keep.mkdir()
    settings = Settings(cache_dir=tmp_path, media_workers=1, record_dir=record_dir, record_max_sessions=2)
    app = create_app(settings, engine=ScriptedEngine("Hello there"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with RealtimeSocketClient(url) as client:
            await client.speak(load_fixture("hello"))
    folders = [path for _, path in recording_folders(record_dir)]
    assert folders == [old[2], next(p for p in folders if p.name.endswith(f"-{client.call_location}"))]
    assert keep.is_dir()


def test_prune_removes_the_oldest_past_the_age_and_the_size(tmp_path):
    now = time.time()
    folders = [tmp_path / folder_name(f"sess_{n}", now - 10_000 + 1_000 * n) for n in range(5)]
    for folder in folders:
        folder.mkdir()
        (folder / "input.flac").write_bytes(b"x" * 1_000)
    new = folders[-1]
    # Age: the first two started more than 8,500 s ago.
    assert prune(tmp_path, RetentionBounds(100, 8_500.0, 10**9), keep=new, now=now) == folders[:2]
    # Size: the other two hold 2,000 bytes, 500 are allowed: the oldest others go until the rest fit.
    assert prune(tmp_path, RetentionBounds(100, 10**6, 500), keep=new, now=now) == folders[2:4]
    assert [path for _, path in recording_folders(tmp_path)] == [new]


def test_a_recording_whose_folder_vanished_ends_and_the_server_stops(tmp_path):
    """Another process pruning past tight bounds may remove a folder being written."""
    recordings = Recordings(tmp_path, RetentionBounds(10, 10**6, 10**9), ())
    recorder = recordings.session_recorder("websocket")
    recorder.server_event({"type": "session.created", "session": {"id": "sess_x", "recording": {"enabled": True}}}, 0.0)
    folder = recorder.folder
    assert folder is not None
    recorder.input_audio(np.zeros(160, dtype=np.float32))
    for _ in range(500):
        if (folder / "events.jsonl").exists():
            break
        time.sleep(0.01)
    shutil.rmtree(folder)
    recorder.client_event('{"type": "response.create"}', 0.5)
    recorder.session_closed(1.0)
    closing = threading.Thread(target=recordings.close)
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive()
    assert not folder.exists()


def test_secrets_and_payloads_are_never_kept():
    event = {
        "type": "response.output_audio.delta", "delta": "QUJD",
        "session": {"client_secret": {"value": "ek_1", "expires_at": 1}, "ice_servers": [
            {"urls": "turn:host", "username": "u", "credential": "c"}]},
        "headers": {"Authorization": "Bearer x"}, "note": "ek_plain", "text": f"said {KEY} aloud",
        "item": {"content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
    }
    assert redacted(event, (KEY,)) == {
        "type": "response.output_audio.delta", "delta": {"base64_chars": 4},
        "session": {"client_secret": "[redacted]", "ice_servers": [
            {"urls": "turn:host", "username": "[redacted]", "credential": "[redacted]"}]},
        "headers": {"Authorization": "[redacted]"}, "note": "[redacted]", "text": "said [redacted] aloud",
        "item": {"content": [{"type": "input_image", "image_url": {"base64_chars": 26}}]},
    }


@pytest.mark.e2e
async def test_a_webrtc_call_on_a_media_worker_is_recorded_by_it_unless_its_offer_refuses(tmp_path):
    record_dir = tmp_path / "recordings"
    settings = Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=2, record_dir=record_dir)
    app = create_app(settings, engine=ScriptedEngine("Hi there"))
    async with serving_in_process(app) as url:
        async with RealtimeClient(url, ice_loopback=True) as client:
            turn = await client.speak(load_fixture("hello"))
            created = await client.wait_for("session.created")
            received = list(client.events)
        # A call whose offer asks not to be recorded: nothing of it is ever written.
        async with RealtimeClient(url, ice_loopback=True, session={"recording": {"enabled": False}}) as unrecorded:
            refused = await unrecorded.speak(load_fixture("hello"))
            unrecorded_created = await unrecorded.wait_for("session.created")
    # The workers stopped with the server, each writing its recordings whole first.

    assert turn.status == "completed" and created["session"]["recording"] == {"enabled": True}
    assert refused.status == "completed" and unrecorded_created["session"]["recording"] == {"enabled": False}
    (folder,) = [path for _, path in recording_folders(record_dir)]
    summary = json.loads((folder / "session.json").read_text())
    assert (summary["session_id"], summary["transport"]) == (created["session"]["id"], "webrtc")
    events = _lines(folder / "events.jsonl")
    recorded = [e["event"]["type"] for e in events if e["from"] == "server"]
    assert recorded[: len(received)] == [e["type"] for e in received]
    # The whole answer was played to the caller: the recording holds as much of it.
    answered = soundfile.info(folder / "output.flac")
    assert answered.duration == pytest.approx(turn.audible_seconds, abs=TOLERANCE_S)
    heard = soundfile.info(folder / "input.flac")
    assert heard.duration >= load_fixture("hello").size / SPEECH_RATE


# -- where each side's audio lies on the session's clock (timeline.json) ------------------------


def started_writers(
    folder: Path, before: Callable[[], object] = lambda: None
) -> tuple[Callable[[WriterStart], RecordingWriter], list[RecordingWriter]]:
    """A recorder's ``start_writer`` writing into ``folder`` (``before``: first in its thread), and
    the writers it started."""
    writers: list[RecordingWriter] = []

    def start_writer(start: WriterStart) -> RecordingWriter:
        writers.append(RecordingWriter(folder, start, secrets=(), before=before, on_done=lambda writer: None))
        writers[-1].start()
        return writers[-1]

    return start_writer, writers


def test_audio_placement_joins_contiguous_chunks_queues_early_ones_and_starts_late_ones_anew():
    placement = AudioPlacement(1000)
    placement.add(1.0, 20)  # 20 ms from 1 s
    placement.add(1.030, 20)  # 10 ms late: jitter, joins it
    placement.add(0.5, 100)  # early (sent ahead of real time): queued behind
    placement.add(2.0, 10)  # long after the end: a segment of its own
    assert placement.to_json() == [[1000.0, 0, 140], [2000.0, 140, 10]]
    placement.cut(2.004)  # 4 of the last 10 samples played
    placement.add(2.005, 10)  # right after the cut, yet not the file's next samples: a new segment
    assert placement.to_json() == [[1000.0, 0, 140], [2000.0, 140, 4], [2005.0, 150, 10]]
    placement.cut(1.5)  # before the last two began: they never played
    assert placement.to_json() == [[1000.0, 0, 140]]


def test_heard_audio_starts_where_its_least_delayed_chunk_says_it_was_said():
    """A call's input: its first frames arrive in a burst 120 ms late (a stalled loop's backlog),
    the rest on time; the run is placed where the on-time frames say, not 120 ms late."""
    placement = AudioPlacement(1000, heard_late=True)
    said = [1.0 + 0.02 * frame for frame in range(20)]  # 20 ms frames said from 1 s on
    arrived = [max(at + 0.02, 1.14) for at in said]  # the first six together at 1.14 s
    for frame_arrived in arrived:
        placement.add(frame_arrived - 0.02, 20)
    assert placement.to_json() == [[1000.0, 0, 400]]
    placement.add(1.5, 20)  # after a pause: a run of its own, never before the first one ends
    placement.add(1.39, 20)  # said before the second run's placement allows: held to the first's end
    assert placement.to_json() == [[1000.0, 0, 400], [1400.0, 400, 40]]


def test_a_recorders_timeline_json_holds_the_turn_timeline_and_each_sides_segments(tmp_path):
    now = [100.0]
    start_writer, writers = started_writers(tmp_path / "recording")

    recorder = SessionRecorder(start_writer, transport="webrtc", clock=lambda: now[0])  # the audio calls' clock
    recorder.server_event({"type": "session.created", "session": {"id": "sess_t", "recording": {"enabled": True}}}, 100.0)
    recorder.session_started(SessionStart("sess_t", "conv_1", "scripted-engine", 100.001))
    for frame in range(50):  # 1 s of input, 20 ms frames arriving in real time from 0.5 s on
        now[0] = 100.5 + 0.02 * (frame + 1)
        recorder.input_audio(np.zeros(SPEECH_RATE // 50, dtype=np.float32))
    now[0] = 102.0
    recorder.server_event({"type": "response.created", "response": {"id": "resp_1"}}, 102.0)
    now[0] = 102.2
    recorder.output_audio(np.zeros(VOICE_RATE, dtype=np.float32))  # 1 s written at once at 2.2 s
    recorder.output_audio(np.zeros(VOICE_RATE, dtype=np.float32))  # and 1 s more: played after it
    recorder.playback_over(PlaybackReport("resp_1", "item_1", ended_at=103.7, played_samples=36_000,
                                          written_samples=48_000, truncated=True, interrupted=True))
    recorder.session_closed(105.0)
    [writer] = writers
    writer.join()
    timeline = json.loads((writer.folder / "timeline.json").read_text())
    assert (timeline["session_id"], timeline["transport"], timeline["model"]) == ("sess_t", "webrtc", "scripted-engine")
    assert timeline["closed_ms"] == 5000.0
    [turn] = timeline["turns"]
    assert turn["response_id"] == "resp_1" and turn["truncated"] is True
    assert [(mark["kind"], mark["at_ms"]) for mark in turn["marks"]][-1] == ("playback_end", 3700.0)
    assert timeline["audio"] == {
        "input_rate": SPEECH_RATE, "output_rate": VOICE_RATE,
        "input": [[500.0, 0, SPEECH_RATE]],
        "output": [[2200.0, 0, 36_000]],  # cut at 3.7 s: 1.5 s of the 2 s written played
    }


def _tone(seconds: float, rate: int, amplitude: float) -> np.ndarray:
    """250 Hz: 12.5 periods a 50 ms step, so a step's RMS is the tone's (amplitude / sqrt 2)."""
    return (amplitude * np.sin(2 * np.pi * 250 * np.arange(round(seconds * rate)) / rate)).astype(np.float32)


def test_a_recordings_levels_show_each_sides_sound_where_it_was_placed_and_no_cut_tail(tmp_path):
    now = [100.0]
    start_writer, writers = started_writers(tmp_path / "recording")

    recorder = SessionRecorder(start_writer, transport="webrtc", clock=lambda: now[0])
    recorder.server_event({"type": "session.created", "session": {"id": "sess_t", "recording": {"enabled": True}}}, 100.0)
    heard = np.zeros(SPEECH_RATE, dtype=np.float32)  # 1 s from 0.5 s: silence, and from 1.0 s to 1.2 s
    heard[SPEECH_RATE // 2:SPEECH_RATE // 2 + SPEECH_RATE // 5] = _tone(0.2, SPEECH_RATE, 0.1)  # -23 dBFS
    for frame, pcm in enumerate(np.split(heard, 50)):  # 20 ms frames arriving in real time
        now[0] = 100.5 + 0.02 * (frame + 1)
        recorder.input_audio(pcm)
    now[0] = 102.2
    answer = _tone(2.0, VOICE_RATE, 0.5)  # -9 dBFS, written at once at 2.2 s: plays to 4.2 s
    recorder.output_audio(answer[:VOICE_RATE])
    recorder.output_audio(answer[VOICE_RATE:])
    recorder.playback_over(PlaybackReport("resp_1", "item_1", ended_at=103.7, played_samples=36_000,
                                          written_samples=48_000, truncated=True, interrupted=True))
    recorder.session_closed(105.0)
    [writer] = writers
    writer.join()
    levels = json.loads((writer.folder / "timeline.json").read_text())["levels"]
    assert (levels["step_ms"], levels["floor_db"]) == (50, FLOOR_DB)
    heard_db, answered_db = levels["input"], levels["output"]
    assert len(heard_db) == len(answered_db) == 100  # to the close at 5 s
    silent = [FLOOR_DB]
    # The tone from 1.0 s to 1.2 s: steps 20 to 23, at its level; silence sent before and after it.
    assert all(abs(db + 23) <= 1 for db in heard_db[20:24]), heard_db[18:26]
    assert heard_db[:20] == silent * 20 and heard_db[24:] == silent * 76
    # The answer from 2.2 s until its cut at 3.7 s; the 0.5 s written past the cut never played.
    assert answered_db[:44] == silent * 44
    assert all(abs(db + 9) <= 1 for db in answered_db[44:74]), answered_db[42:76]
    assert answered_db[74:] == silent * 26


def test_a_long_sessions_levels_widen_their_step_to_hold_an_hours_count():
    heard, answered = LevelTrack(SPEECH_RATE), LevelTrack(VOICE_RATE)
    answered.add(np.full(VOICE_RATE, 0.5, dtype=np.float32))  # -6 dBFS, the last second of two hours
    levels = levels_json(heard, [], answered, [[7_199_000.0, 0, VOICE_RATE]], until_ms=7_200_000.0)
    assert levels["step_ms"] == 100 and len(levels["input"]) == len(levels["output"]) == 72_000
    assert levels["output"][-11:] == [FLOOR_DB] + [-6] * 10
    assert set(levels["input"]) == {FLOOR_DB}


def test_an_event_is_recorded_as_observed_whatever_is_added_to_it_as_it_is_sent(tmp_path):
    """The writer's thread writes later; the transport adds to an event on the loop as it sends it."""
    writing = threading.Event()  # the writer thread waits for it before it writes anything
    start_writer, writers = started_writers(tmp_path / "recording", before=writing.wait)

    recorder = SessionRecorder(start_writer, transport="webrtc")
    recorder.server_event({"type": "session.created", "session": {"id": "sess_t", "recording": {"enabled": True}}}, 100.0)
    done = {"type": "response.done", "response": {"id": "resp_1", "latency": {"end_to_first_audio_ms": 500}}}
    recorder.server_event(done, 101.0)
    done["response"]["latency"]["network"] = {"rtt_ms": 40}  # as a WebRTC call annotates it, sending it
    writing.set()
    recorder.session_closed(102.0)
    [writer] = writers
    writer.join()
    recorded = [line["event"] for line in _lines(writer.folder / "events.jsonl") if line["event"]["type"] == "response.done"]
    assert recorded == [{"type": "response.done", "response": {"id": "resp_1", "latency": {"end_to_first_audio_ms": 500}}}]


def _first_loud_ms(channel: np.ndarray, after_ms: float = 0.0) -> float:
    start = round(after_ms * WAV_RATE / 1000)
    return (start + int(np.argmax(np.abs(channel[start:]) > 0.01))) * 1000 / WAV_RATE


async def test_a_recordings_wav_puts_each_side_on_the_sessions_clock(tmp_path):
    record_dir = tmp_path / "recordings"
    settings = Settings(cache_dir=tmp_path, media_workers=1, record_dir=record_dir)
    app = create_app(settings, engine=ScriptedEngine("Hello there friend", waveform="tone"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with RealtimeSocketClient(url) as client:
            await asyncio.sleep(0.5)  # the session's clock runs before anything is said
            turn = await client.speak(load_fixture("hello"))
            await asyncio.sleep(0.3)
    assert turn.status == "completed"
    (folder,) = [path for _, path in recording_folders(record_dir)]
    timeline = json.loads((folder / "timeline.json").read_text())
    [answer] = timeline["turns"]
    marks = {mark["kind"]: mark["at_ms"] for mark in answer["marks"]}
    plan = wav_plan(folder)
    assert plan is not None
    wav = b"".join(wav_bytes(plan))
    assert len(wav) == plan.size
    stereo, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    assert rate == WAV_RATE and stereo.shape[1] == 2
    assert stereo.shape[0] / rate == pytest.approx(timeline["closed_ms"] / 1000, abs=0.05)
    user, assistant = stereo[:, 0], stereo[:, 1]
    # The answer's audio begins where the session wrote its first audio.
    assert _first_loud_ms(assistant) == pytest.approx(marks["first_audio"], abs=50)
    # The user's speech lies before the VAD's start of speech report and ends before its end.
    spoken_ms = _first_loud_ms(user)
    assert 500 < spoken_ms < marks["input_audio_buffer.speech_started"]
    loud = np.flatnonzero(np.abs(user) > 0.01)
    assert loud[-1] * 1000 / WAV_RATE < marks["input_audio_buffer.speech_stopped"]
    # Any byte range is the same bytes as the whole.
    assert b"".join(wav_bytes(plan, 1_001, 250_002)) == wav[1_001:250_003]
    assert b"".join(wav_bytes(plan, 10)) == wav[10:]


async def test_events_the_websocket_transport_writes_itself_are_recorded(tmp_path):
    """Its audio deltas (as their lengths) and its answer to a binary frame, among the session's own."""
    record_dir = tmp_path / "recordings"
    settings = Settings(cache_dir=tmp_path, media_workers=1, record_dir=record_dir)
    app = create_app(settings, engine=ScriptedEngine("Hi"))
    async with serving_in_process(app, **websocket_server_options(settings)) as url:
        async with websockets.connect(url.replace("http://", "ws://") + "/v1/realtime") as socket:
            received = [json.loads(await socket.recv())]
            await socket.send(b"\x00\x01 binary")
            await socket.send(json.dumps({"type": "response.create"}))
            while received[-1]["type"] != "response.done":
                received.append(json.loads(await socket.recv()))
    (folder,) = [path for _, path in recording_folders(record_dir)]
    recorded = [e["event"] for e in _lines(folder / "events.jsonl")
                if e["from"] == "server" and not e["event"]["type"].startswith("output_audio_buffer.")]
    assert [event["type"] for event in recorded] == [event["type"] for event in received]
    [refusal] = [event for event in recorded if event["type"] == "error"]
    assert refusal["error"]["code"] == "invalid_frame"
    deltas = [(sent, kept) for sent, kept in zip(received, recorded, strict=True)
              if sent["type"] == "response.output_audio.delta"]
    assert deltas
    for sent, kept in deltas:
        assert kept == {**sent, "delta": {"base64_chars": len(sent["delta"])}}
