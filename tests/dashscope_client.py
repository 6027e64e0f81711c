"""The real DashScope SDK (``dashscope`` 2.0.2, ``dashscope.audio.qwen_omni``) as tests drive it.

The SDK is synchronous: ``OmniRealtimeConversation`` runs websocket-client in a thread of its own
and calls back from there. :class:`SdkSession` keeps every event its callback gets;
:class:`Microphone` streams 16 kHz PCM16 to it in real time, 100 ms per ``append_audio`` (as
DashScope's own samples do), silence between utterances, like a live microphone.
"""

from __future__ import annotations

import base64
import collections
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from dashscope.audio.qwen_omni import OmniRealtimeCallback, OmniRealtimeConversation

RATE = 16_000
CHUNK_MS = 100
CHUNK_BYTES = RATE * CHUNK_MS // 1000 * 2
MODEL = "qwen3-omni-flash-realtime"


def pcm16(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()


class SdkSession(OmniRealtimeCallback):
    """One ``OmniRealtimeConversation`` on ``url`` (``ws://…/api-ws/v1/realtime`` or ``/v1/realtime``)."""

    def __init__(self, url: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.closed: tuple[Any, Any] | None = None
        self._changed = threading.Condition()
        self.conversation = OmniRealtimeConversation(model=MODEL, callback=self, url=url, api_key="sk-unused")

    def on_event(self, message: dict[str, Any]) -> None:  # type: ignore[override]
        with self._changed:
            self.events.append(message)
            self._changed.notify_all()

    def on_close(self, close_status_code: Any, close_msg: Any) -> None:
        with self._changed:
            self.closed = (close_status_code, close_msg)
            self._changed.notify_all()

    def of_type(self, event_type: str, start: int = 0) -> list[dict[str, Any]]:
        return [event for event in self.events[start:] if event["type"] == event_type]

    def wait_for(self, test: str | Callable[[dict[str, Any]], bool], *, start: int = 0,
                 timeout_s: float = 120.0) -> dict[str, Any]:
        """The first event from index ``start`` on that is of type ``test`` (or passes it); blocking."""
        matches = (lambda event: event["type"] == test) if isinstance(test, str) else test
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((e for e in self.events[start:] if matches(e)), None), timeout_s  # against hangs only
            )
        if found is None:
            raise TimeoutError(f"no {test!r} event in {timeout_s:g} s; got {[e['type'] for e in self.events]}")
        return found

    def wait_closed(self, timeout_s: float = 30.0) -> tuple[Any, Any]:
        with self._changed:
            self._changed.wait_for(lambda: self.closed is not None, timeout_s)
        assert self.closed is not None, "the server did not close the connection"
        return self.closed

    def transcript(self, response_id: str) -> str:
        """What the SDK's callback got as ``response.audio_transcript.delta`` for one response."""
        return "".join(e["delta"] for e in self.of_type("response.audio_transcript.delta")
                       if e["response_id"] == response_id)

    def audio(self, response_id: str) -> bytes:
        """The PCM16 (24 kHz) of every ``response.audio.delta`` of one response."""
        return b"".join(base64.b64decode(e["delta"]) for e in self.of_type("response.audio.delta")
                        if e["response_id"] == response_id)


class Microphone(threading.Thread):
    """Streams to ``conversation.append_audio`` in real time: queued speech, else silence."""

    def __init__(self, conversation: OmniRealtimeConversation) -> None:
        super().__init__(name="microphone", daemon=True)
        self._conversation = conversation
        self._queue: collections.deque[bytes] = collections.deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.failure: BaseException | None = None

    def say(self, pcm: np.ndarray) -> None:
        """Speak ``pcm`` (16 kHz float32) from the next 100 ms on."""
        data = pcm16(pcm)
        with self._lock:
            for start in range(0, len(data), CHUNK_BYTES):
                self._queue.append(data[start:start + CHUNK_BYTES].ljust(CHUNK_BYTES, b"\0"))

    def speaking(self) -> bool:
        with self._lock:
            return bool(self._queue)

    def run(self) -> None:
        due = time.monotonic()
        try:
            while not self._stopping.is_set():
                with self._lock:
                    chunk = self._queue.popleft() if self._queue else bytes(CHUNK_BYTES)
                self._conversation.append_audio(base64.b64encode(chunk).decode())
                due += CHUNK_MS / 1000
                self._stopping.wait(max(0.0, due - time.monotonic()))
        except BaseException as exc:  # reported by stop(): a test must not pass on a dead microphone
            self.failure = exc

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)
        if self.failure is not None:
            raise self.failure
