"""One WebSocket and the session it carries: the call of ``GET /v1/realtime`` (``app.http.socket_route``
is the route: auth, origin, admission, the dialect).

Events are JSON text frames both ways; audio leaves as ``response.output_audio.delta`` events
(``app.transports.websocket.event_audio.EventAudioOutput``). A binary frame is answered with an ``error``
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

from app.calls.lifecycle import CallLifecycle, EventObserver, Session
from app.calls.registry import OnClosed
from app.realtime.playback import AudioOutput
from app.realtime.protocol import ProtocolError, SessionFinishedEvent, event_type
from app.transports.websocket.dashscope import DashScopeDialect
from app.transports.websocket.event_audio import EventAudioOutput

logger = logging.getLogger(__name__)

# Events waiting for a client that does not read them: past this the session ends. 16 MiB holds
# ~4 minutes of PCM16 answer audio as base64 deltas, far more than any client lags by.
MAX_PENDING_BYTES = 16 * 1024 * 1024
# How long queued events (the last deltas, session_expired) get to leave before the socket closes.
FLUSH_TIMEOUT_S = 2.0
CLOSE_CODES = {"client_not_reading": 1008, "client_flood": 1008, "server_shutdown": 1001}  # else 1000 (normal closure)
_SESSION_FINISHED = event_type(SessionFinishedEvent)

SocketSessionFactory = Callable[[AudioOutput, Callable[[dict[str, Any]], None]], Session]


def new_socket_id() -> str:
    return "ws_" + secrets.token_hex(12)


class SocketCall(CallLifecycle):
    """One WebSocket and the session it carries; it ends as every call does (``app.calls.lifecycle``)."""

    transport = "websocket"

    def __init__(
        self,
        websocket: WebSocket,
        *,
        make_session: SocketSessionFactory,
        max_duration_s: float | None = None,
        idle_timeout_s: float | None = None,
        observer: EventObserver | None = None,
        on_closed: OnClosed | None = None,
        dialect: DashScopeDialect | None = None,
    ) -> None:
        """``dialect``: the events leave as DashScope names them (the session reads its fields)."""
        super().__init__(new_socket_id(), max_duration_s=max_duration_s, on_closed=on_closed,
                         idle_timeout_s=idle_timeout_s)
        self._dialect = dialect
        self._websocket = websocket
        self._observer = observer
        self._outgoing: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._output = EventAudioOutput(self._send_audio)
        self._session = make_session(self._output, self._send_event)
        self._subprotocol: str | None = None
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None

    async def serve(self, subprotocol: str | None) -> None:
        """Accepts the socket and carries the session until the connection ends; then releases all."""
        self._subprotocol = subprotocol
        await self._carry()

    # -- its life, its last word, its release (app.calls.lifecycle) -----------------------

    async def _run(self) -> str:
        if self._end_reason is None:  # closed (server shutdown) before it was served
            await self._websocket.accept(subprotocol=self._subprotocol)
            self._writer = asyncio.create_task(self._write(), name=f"{self.id} writer")
            await self._session.start()
            self._reader = asyncio.create_task(self._read(), name=f"{self.id} reader")
        return await self._until_ended()

    def _idle_since(self) -> float | None:
        return self._session.idle_since() if self._session is not None else None

    async def _say_last(self, event: dict[str, Any]) -> None:
        self._send_own(event)  # the release lets it leave (_flush)

    async def _release_transport(self, reason: str) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._session.close()  # cancels the running response and its engine turn
        if self._writer is not None:
            await self._flush(self._writer, reason)
        if reason not in ("client_closed", "client_gone"):
            with contextlib.suppress(RuntimeError, OSError):  # already closed by the client or the server
                await self._websocket.close(code=CLOSE_CODES.get(reason, 1000), reason=reason)

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
                self._send_own(
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
            if self._session.flooding:
                self.end("client_flood")
                return

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

    def _send_own(self, event: dict[str, Any]) -> None:
        """An event of the call's own (not the session's): the session's observers hear it too."""
        self._session.transport_sent(event)
        self._send_event(event)

    def _send_audio(self, event: dict[str, Any]) -> None:
        """The output's audio deltas: the session's observers hear them (a recording keeps their
        length), the client gets them."""
        self._session.transport_sent(event)
        self._enqueue(event)

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
