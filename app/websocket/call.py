"""One WebSocket and the session it carries: the call of ``GET /v1/realtime`` (``app.web.websocket``
is the route: auth, origin, admission, the dialect).

Events are JSON text frames both ways; audio leaves as ``response.output_audio.delta`` events
(``app.realtime.event_audio.EventAudioOutput``). A binary frame is answered with an ``error``
event and the socket stays open. A client that goes (close frame, dropped TCP, missed pings)
ends the session and its engine work; so does one that stops reading while
``MAX_PENDING_BYTES`` of events wait for it. ``session.finished`` (the answer to
``session.finish``) ends it too, once it has left: the socket closes with 1000.

:class:`SocketCall` owns its reader and writer tasks; ``close()`` ends them, closes the session
(cancelling its response) and the socket, and is safe twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from app.calls.lifecycle import Session
from app.realtime.dashscope import DashScopeDialect
from app.realtime.event_audio import EventAudioOutput
from app.realtime.ledger import AudioOutput
from app.realtime.protocol import ProtocolError, SessionFinishedEvent, event_type
from app.web.metrics import CallMetrics

logger = logging.getLogger(__name__)

# Events waiting for a client that does not read them: past this the session ends. 16 MiB holds
# ~4 minutes of PCM16 answer audio as base64 deltas, far more than any client lags by.
MAX_PENDING_BYTES = 16 * 1024 * 1024
# How long queued events (the last deltas, session_expired) get to leave before the socket closes.
FLUSH_TIMEOUT_S = 2.0
CLOSE_CODES = {"client_not_reading": 1008, "server_shutdown": 1001}  # else 1000 (normal closure)
_SESSION_FINISHED = event_type(SessionFinishedEvent)

SocketSessionFactory = Callable[[AudioOutput, Callable[[dict[str, Any]], None]], Session]


def new_socket_id() -> str:
    return "ws_" + secrets.token_hex(12)


class SocketCall:
    """One WebSocket and the session it carries; registered beside the WebRTC calls."""

    transport = "websocket"

    def __init__(
        self,
        websocket: WebSocket,
        *,
        make_session: SocketSessionFactory,
        max_duration_s: float | None = None,
        observer: CallMetrics | None = None,
        on_closed: Callable[[SocketCall, str], None] | None = None,
        dialect: DashScopeDialect | None = None,
    ) -> None:
        """``dialect``: the events leave as DashScope names them (the session reads its fields)."""
        self.id = new_socket_id()
        self._dialect = dialect
        self._websocket = websocket
        self._max_duration_s = max_duration_s
        self._observer = observer
        self._on_closed = on_closed
        self._outgoing: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._output = EventAudioOutput(self._enqueue)
        self._session = make_session(self._output, self._send_event)
        self._end_reason: str | None = None
        self._ended = asyncio.Event()
        self._serving = False
        self._released = False
        self.closed = asyncio.Event()

    async def serve(self, subprotocol: str | None) -> None:
        """Accepts the socket and carries the session until the connection ends; then releases all."""
        self._serving = True
        reader: asyncio.Task[None] | None = None
        writer: asyncio.Task[None] | None = None
        try:
            if self._end_reason is None:  # closed (server shutdown) before it was served
                await self._websocket.accept(subprotocol=subprotocol)
                writer = asyncio.create_task(self._write(), name=f"{self.id} writer")
                await self._session.start()
                reader = asyncio.create_task(self._read(), name=f"{self.id} reader")
                try:
                    async with asyncio.timeout(self._max_duration_s):
                        await self._ended.wait()
                except TimeoutError:
                    self._tell_expired()
                    self.end("max_duration")
        finally:
            await self._release(reader, writer)

    def end(self, reason: str) -> None:
        """Asks the connection to end; ``serve`` releases it. Safe from anywhere, any number of times."""
        if self._end_reason is None:
            self._end_reason = reason
        self._ended.set()

    async def close(self, reason: str = "closed") -> None:
        """Ends the connection and waits until everything it owns is released. Safe twice."""
        self.end(reason)
        if self._serving:
            await asyncio.shield(self.closed.wait())  # a caller that gives up must not cut the release short
        else:
            await self._release(None, None)

    # -- the two directions -------------------------------------------------------------

    async def _read(self) -> None:
        while True:
            try:
                message = await self._websocket.receive()
            except (WebSocketDisconnect, RuntimeError, OSError):  # Starlette: RuntimeError once disconnected
                self.end("client_gone")
                return
            if message["type"] == "websocket.disconnect":
                self.end("client_closed")
                return
            text = message.get("text")
            if text is None:
                self._send_event(
                    ProtocolError(
                        "invalid_frame",
                        "Binary frames carry no events here: send each event as JSON in a text frame "
                        "(audio goes base64 in input_audio_buffer.append).",
                    ).to_event().to_json()
                )
                continue
            try:
                await self._session.handle_message(text)
            except Exception:  # the session answers bad input itself; this is a bug: keep reading
                logger.exception("%s: the session failed on a client event", self.id)

    async def _write(self) -> None:
        while True:
            text = await self._outgoing.get()
            if text is None:
                return
            self._pending_bytes -= len(text)
            try:
                await self._websocket.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                logger.debug("%s: sending failed (%s); the client is gone", self.id, exc)
                self.end("client_gone")
                return

    def _send_event(self, event: dict[str, Any]) -> None:
        """The session's ``send``: metrics see every event; the output drops media-track ones."""
        if self._observer is not None:
            self._observer.on_server_event(event)
        if self._output.observe(event):
            self._enqueue(event)
        if event.get("type") == _SESSION_FINISHED:
            self.end("session_finished")  # the release lets it leave first

    def _enqueue(self, event: dict[str, Any]) -> None:
        if self._end_reason == "client_not_reading":
            return
        if self._dialect is not None:
            spoken = self._dialect.server_event(event)
            if spoken is None:
                return
            event = spoken
        text = json.dumps(event, separators=(",", ":"))
        if self._pending_bytes + len(text) > MAX_PENDING_BYTES:
            logger.warning("%s: %d bytes of events wait for a client that does not read; ending", self.id,
                           self._pending_bytes)
            self.end("client_not_reading")
            return
        self._pending_bytes += len(text)
        self._outgoing.put_nowait(text)

    def _tell_expired(self) -> None:
        assert self._max_duration_s is not None
        self._send_event(
            ProtocolError(
                "session_expired", f"Your session hit the maximum duration of {self._max_duration_s / 60:g} minutes."
            ).to_event().to_json()
        )

    # -- release --------------------------------------------------------------------------

    async def _release(self, reader: asyncio.Task[None] | None, writer: asyncio.Task[None] | None) -> None:
        if self._released:
            return
        self._released = True
        reason = self._end_reason or "closed"
        try:
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            await self._session.close()  # cancels the running response and its engine turn
            if writer is not None:
                await self._flush(writer, reason)
            if reason not in ("client_closed", "client_gone"):
                with contextlib.suppress(RuntimeError, OSError):  # already closed by the client or the server
                    await self._websocket.close(code=CLOSE_CODES.get(reason, 1000), reason=reason)
        finally:
            logger.info("%s ended: %s", self.id, reason)
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self, reason)

    async def _flush(self, writer: asyncio.Task[None], reason: str) -> None:
        """Lets queued events leave (bounded by ``FLUSH_TIMEOUT_S``), then stops the writer."""
        if reason in ("client_closed", "client_gone", "client_not_reading"):
            writer.cancel()
        else:
            self._outgoing.put_nowait(None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_TIMEOUT_S):
                    await asyncio.shield(writer)
            writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
