"""``GET /debug/resources``: the soak test's view of the server process; ``GET /debug/turns``:
recent sessions' turn timelines."""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi import FastAPI

from app.client.websocket import RealtimeSocketClient
from app.config import Settings
from app.http.auth import Authenticator
from app.http.debug import debug_router
from app.http.errors import ApiError, api_error_handler
from app.http.server import create_app
from app.turn_timelines import RECENT_SESSIONS
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine
from tests.operator_routes import closed_sessions, finished_recordings


def build_app() -> FastAPI:
    app = FastAPI()
    app.add_exception_handler(ApiError, api_error_handler)
    app.include_router(debug_router(Settings(), Authenticator(None)))
    return app


async def get_resources(client_host: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=build_app(), client=(client_host, 50_000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/debug/resources")


async def test_loopback_client_gets_the_process_figures():
    response = await get_resources("127.0.0.1")
    assert response.status_code == 200
    figures = response.json()
    assert set(figures) == {
        "rss_bytes", "threads", "thread_kinds", "os_threads", "fds", "asyncio_tasks", "child_processes", "children_rss_bytes"
    }
    assert figures["rss_bytes"] > 0
    assert figures["fds"] > 0
    assert figures["asyncio_tasks"] >= 1  # the request's own task
    assert figures["thread_kinds"]["MainThread"] == 1
    assert sum(figures["thread_kinds"].values()) == figures["threads"]


async def test_other_clients_are_refused():
    response = await get_resources("192.0.2.7")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


# -- GET /debug/turns: a real server on 127.0.0.1 with a scripted engine, WebSocket sessions ----

API_KEY = "sk-debug-test"


async def text_turn(url: str) -> dict[str, Any]:
    """One WebSocket session with one typed turn; its response.done."""
    async with RealtimeSocketClient(url, api_key=API_KEY, timeout_s=30) as client:
        await client.send({
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        })
        await client.send({"type": "response.create"})
        return await client.wait_for("response.done")


async def get_turns(url: str, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url) as client:
        return await client.get("/debug/turns", headers=headers)


async def test_turns_show_recent_sessions_timelines_behind_the_debug_key_rules():
    app = create_app(Settings(api_key=API_KEY, media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        done = await text_turn(url)
        for _ in range(RECENT_SESSIONS):  # as many again, each with nothing said: the first falls out
            async with RealtimeSocketClient(url, api_key=API_KEY, timeout_s=30):
                pass
        await closed_sessions(url)
        local = await get_turns(url, {})
        keyed_elsewhere = await get_turns(url, {"X-Forwarded-For": "192.0.2.7", "Authorization": f"Bearer {API_KEY}"})
        elsewhere = await get_turns(url, {"X-Forwarded-For": "192.0.2.7"})
    assert elsewhere.status_code == 403 and elsewhere.json()["error"]["code"] == "forbidden"
    assert local.status_code == keyed_elsewhere.status_code == 200
    sessions = local.json()["sessions"]
    assert len(sessions) == RECENT_SESSIONS, "the ring keeps the last sessions only"
    assert all(session["turns"] == [] and session["transport"] == "websocket" and session["worker"] == "front"
               for session in sessions)
    assert done["response"]["id"] not in json.dumps(sessions)


async def test_a_sessions_turn_has_its_marks_spans_and_latency():
    app = create_app(Settings(media_workers=1), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        done = await text_turn(url)
        await closed_sessions(url)
        sessions = (await get_turns(url, {})).json()["sessions"]
    [session] = sessions
    assert session["model"] == "scripted-engine" and session["closed_ms"] is not None
    [turn] = session["turns"]
    assert turn["response_id"] == done["response"]["id"]
    assert turn["status"] == "completed" and turn["latency"] == done["latency"]
    kinds = [mark["kind"] for mark in turn["marks"]]
    times = [mark["at_ms"] for mark in turn["marks"]]
    assert times == sorted(times) and times[0] >= 0
    for kind in ("response.created", "engine_started", "first_audio", "response.done", "playback_end"):
        assert kind in kinds, kinds
    assert kinds.index("response.created") < kinds.index("first_audio") < kinds.index("response.done")
    audio = turn["answer_audio"]
    first_audio = times[kinds.index("first_audio")]
    assert audio["start_ms"] == first_audio <= audio["end_ms"] == times[kinds.index("playback_end")]
    assert turn["user_speech"] is None  # a typed turn
    assert turn["played_ms"] > 0 and turn["truncated"] is False



# -- GET /debug/recordings: a real server recording into a folder -------------------------------



async def test_recordings_are_listed_and_their_files_served_behind_the_debug_key_rules(tmp_path):
    settings = Settings(api_key=API_KEY, media_workers=1, cache_dir=tmp_path, record_dir=tmp_path / "recordings")
    app = create_app(settings, engine=ScriptedEngine())
    async with serving_in_process(app) as url, httpx.AsyncClient(base_url=url) as client:
        done = await text_turn(url)
        await closed_sessions(url)
        [recording] = await finished_recordings(url)
        session_id = recording["session_id"]
        base = f"/debug/recordings/{session_id}"
        timeline = await client.get(f"{base}/timeline.json")
        transcript = await client.get(f"{base}/transcript.jsonl")
        wav = await client.get(f"{base}/audio.wav")
        wav_range = await client.get(f"{base}/audio.wav", headers={"Range": "bytes=40-59"})
        unknown = await client.get(f"{base}/notes.txt")
        traversal = await client.get("/debug/recordings/%2E%2E/session.json")  # the session id ".."
        elsewhere = await client.get("/debug/recordings", headers={"X-Forwarded-For": "192.0.2.7"})
        file_elsewhere = await client.get(f"{base}/session.json", headers={"X-Forwarded-For": "192.0.2.7"})
        keyed_elsewhere = await client.get(
            f"{base}/session.json", headers={"X-Forwarded-For": "192.0.2.7", "Authorization": f"Bearer {API_KEY}"})
    assert recording["transport"] == "websocket" and recording["turns"] == 1 and recording["bytes"] > 0
    assert recording["started"] < recording["ended"]
    assert timeline.status_code == 200
    [turn] = timeline.json()["turns"]
    assert turn["response_id"] == done["response"]["id"] and turn["latency"] == done["latency"]
    assert timeline.json()["audio"]["output"], "the answer's audio is placed"
    assert transcript.status_code == 200 and transcript.headers["content-type"] == "application/x-ndjson"
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    assert wav.content[:4] == b"RIFF" and int(wav.headers["content-length"]) == len(wav.content)
    assert wav_range.status_code == 206 and wav_range.content == wav.content[40:60]
    assert wav_range.headers["content-range"] == f"bytes 40-59/{len(wav.content)}"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "recording_file_unknown"
    assert traversal.status_code == 404 and traversal.json()["error"]["code"] == "recording_not_found"
    assert elsewhere.status_code == file_elsewhere.status_code == 403
    assert keyed_elsewhere.status_code == 200 and keyed_elsewhere.json()["session_id"] == session_id


async def test_without_a_record_dir_the_recordings_are_an_empty_list():
    transport = httpx.ASGITransport(app=build_app(), client=("127.0.0.1", 50_000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        listed = await client.get("/debug/recordings")
        one = await client.get("/debug/recordings/sess_x/session.json")
    assert listed.status_code == 200 and listed.json() == {"recordings": [], "recording": False}
    assert one.status_code == 404 and one.json()["error"]["code"] == "recording_not_found"
