"""Fuzzing a real ``GET /v1/realtime`` socket: hostile frames (text or binary) to uvicorn on
127.0.0.1, after which the socket still serves a turn. The strategies, and the session and
signaling fuzzing: tests/app/realtime/test_fuzz.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import uvicorn
import websockets.sync.client
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config import Settings
from app.http.server import create_app
from tests.app.realtime.test_fuzz import (
    FUZZ_SETTINGS,
    _message,
    encode,
    id_events,
    malformed_messages,
    valid_events,
)
from tests.fakes import ScriptedEngine
from tests.listening_ports import free_port

pytestmark = pytest.mark.e2e

SOCKET_FRAME_EXAMPLES = 40  # frame sequences through a real socket (a connection and a turn each)


class SocketFuzzServer:
    """The real app with the instant engine, served by uvicorn on 127.0.0.1 from its own thread;
    examples connect to it with the synchronous ``websockets`` client."""

    def __init__(self) -> None:
        app = create_app(Settings(max_sessions=1_000), engine=ScriptedEngine())
        port = free_port()
        self.url = f"ws://127.0.0.1:{port}/v1/realtime"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self._thread = threading.Thread(target=asyncio.run, args=(self._server.serve(),), name="socket fuzz server")

    def __enter__(self) -> SocketFuzzServer:
        self._thread.start()
        for _ in range(600):  # up to a minute: start-up loads the VAD
            if self._server.started:
                return self
            time.sleep(0.1)
        raise RuntimeError("the fuzz server did not start")

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join()


@pytest.fixture(scope="module")
def socket_fuzz_server():
    with SocketFuzzServer() as server:
        yield server


frames = st.one_of(malformed_messages, valid_events.map(encode), id_events.map(encode))


@settings(FUZZ_SETTINGS, max_examples=SOCKET_FRAME_EXAMPLES)
@given(sent=st.lists(frames, max_size=12))
def test_websocket_answers_any_frames_and_still_serves_a_turn(socket_fuzz_server, sent):
    events: list[dict[str, Any]] = []
    with websockets.sync.client.connect(socket_fuzz_server.url, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        for frame in sent:
            ws.send(frame)  # str: a text frame; bytes: a binary frame
        ws.send(encode({"type": "response.cancel"}))
        ws.send(encode(_message("user", {"type": "input_text", "text": "are you there?"})))
        ws.send(encode({"type": "response.create", "event_id": "final", "response": {"metadata": {"turn": "final"}}}))
        while True:
            event = json.loads(ws.recv(timeout=10))  # a guard against hangs, not a speed limit
            events.append(event)
            if event["type"] == "response.done" and event["response"]["metadata"] == {"turn": "final"}:
                break
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [e for e in errors if e["type"] == "server_error" or e["event_id"] == "final"] == []
    assert events[-1]["response"]["status"] == "completed"
    binary = sum(isinstance(frame, bytes) for frame in sent)
    assert sum(e["code"] == "invalid_frame" for e in errors) == binary
