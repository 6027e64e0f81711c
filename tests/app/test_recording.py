"""Recordings: a real server on 127.0.0.1 records a WebSocket session's audio, events and transcript.

The engine is the scripted one; the server, its VAD, the socket and the writer threads are real.
The server has stopped (and so flushed every recording) before a folder is read.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from app.client.webrtc import RealtimeClient
from app.client.websocket import RealtimeSocketClient
from app.config import Settings
from app.http.server import create_app
from app.http.socket_route import websocket_server_options
from app.recording import Recordings, RetentionBounds, folder_name, prune, recording_folders
from app.session_recording import redacted
from media.rates import SPEECH_RATE, VOICE_RATE
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.speech import load_fixture

KEY = "sk-recording-test-key-0123456789"
CLIENT_SECRET = "ek_recording_test_secret_42"
TOLERANCE_S = 0.1
FILES = {"input.flac", "output.flac", "events.jsonl", "transcript.jsonl", "session.json"}


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
    # Every event the session sent. output_audio_buffer.* are the session's too, though a WebSocket
    # does not carry them (they tell when the answer played); response.output_audio.delta are the
    # WebSocket's own cut of the answer's audio, which output.flac holds.
    assert [kind for kind in recorded if not kind.startswith("output_audio_buffer.")] == [
        e["type"] for e in server_events if e["type"] != "response.output_audio.delta"]
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
