"""How a call ends, whatever carries it (a WebRTC peer, a WebSocket): one lifecycle for both.

A call is carried by one task (:meth:`CallLifecycle._carry`): the transport's own life
(``_run``) until the call is asked to end or ``max_duration_s`` passes, then its release, once.
Anything may ask it to end (``end``: from any callback, any number of times; the first reason
stands). Past ``max_duration_s`` the client is told why (OpenAI's ``session_expired``) before
the release. ``close`` ends the call and waits for the release, shielded: a caller that gives up
waiting (a cancelled request, a shutdown's timeout) cannot cut it short and leave the session's
slot taken. The release frees that slot last (``on_closed``: the registry forgets the call),
whatever the transport's own release raised. A call closed before it was ever carried (an offer
refused, a shutdown before its socket was served) is released by ``close`` itself.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from typing import Any, Protocol

import numpy as np

from app.calls.registry import OnClosed
from app.realtime.protocol import NetworkLatency, ProtocolError
from media.frames import FramePlan, SampledFrame

logger = logging.getLogger(__name__)


class Session(Protocol):
    """What a call needs of ``app.realtime.session.RealtimeSession``."""

    async def start(self) -> None: ...
    async def handle_message(self, raw: str | bytes) -> None: ...
    def push_audio(self, pcm: np.ndarray) -> None: ...
    @property
    def echo_cancellation(self) -> bool: ...
    def add_video_frame(self, frame: SampledFrame) -> None: ...
    def video_plan(self) -> FramePlan | None: ...
    async def close(self) -> None: ...
    def idle_since(self) -> float | None: ...
    @property
    def flooding(self) -> bool: ...
    def on_playback_started(self) -> None: ...
    def on_playback_stopped(self) -> None: ...
    def transport_sent(self, event: dict[str, Any]) -> None: ...
    def network_reported(self, response_id: str, network: NetworkLatency) -> None: ...


class EventObserver(Protocol):
    """What watches a call's events from outside (the server's metrics: ``app.metrics.CallMetrics``).

    A protocol of this layer, so that a call imports nothing of the HTTP service above it."""

    def on_server_event(self, event: dict[str, Any]) -> None:
        """The session sent ``event`` to the client."""


class CallLifecycle(abc.ABC):
    """One call's end and release; each transport's call supplies its life, its last word and its release."""

    transport: str  # the metrics' label: "webrtc" or "websocket"

    def __init__(
        self, call_id: str, *, max_duration_s: float | None, on_closed: OnClosed | None,
        idle_timeout_s: float | None = None,
    ) -> None:
        self.id = call_id
        self._max_duration_s = max_duration_s
        self._idle_timeout_s = idle_timeout_s
        self._on_closed = on_closed
        self._end_reason: str | None = None
        # Set by end(); a transport sets it too for whatever else its life waits on (_wait_wakeup).
        self._wakeup = asyncio.Event()
        self._carrier: asyncio.Task[None] | None = None
        self._released = False
        self.closed = asyncio.Event()

    def end(self, reason: str) -> None:
        """Asks the call to end; its carrier releases it. Safe from any callback, any number of times."""
        if self._end_reason is None:
            self._end_reason = reason
        self._wakeup.set()

    async def close(self, reason: str = "closed") -> None:
        """Ends the call and waits until everything it owns is released. Safe twice."""
        self.end(reason)
        if self._carrier is not None:
            # Shielded: a caller that gives up waiting must not cut the release short.
            await asyncio.shield(self._carrier)
        else:
            await self._release()

    # -- what each transport supplies ------------------------------------------------------

    @abc.abstractmethod
    async def _run(self) -> str:
        """Carries the call until it is to end; returns why (the ``end`` reason, or the transport's own)."""

    @abc.abstractmethod
    async def _say_last(self, event: dict[str, Any]) -> None:
        """Sends ``event`` as the call's last word and gives it a bounded time to leave."""

    @abc.abstractmethod
    async def _release_transport(self, reason: str) -> None:
        """Releases everything the call owns but its session slot."""

    def _idle_since(self) -> float | None:
        """Since when (monotonic) the session has been idle: no client event, no speech, no answer;
        None while it is not (or has not started)."""
        return None

    # -- the shared part -------------------------------------------------------------------

    def _carry(self) -> asyncio.Task[None]:
        """Starts the task that carries the call: its life, then its release. From now on ``close`` waits for it."""
        self._carrier = asyncio.create_task(self._live(), name=f"call {self.id}")
        return self._carrier

    async def _live(self) -> None:
        watcher = None
        if self._idle_timeout_s is not None:
            watcher = asyncio.create_task(self._watch_idle(self._idle_timeout_s), name=f"call {self.id} idle")
        try:
            try:
                async with asyncio.timeout(self._max_duration_s):
                    reason = await self._run()
            except TimeoutError:
                reason = "max_duration"
                await self._say_last(self._expired_event())
            self.end(reason)
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            await self._release()

    async def _watch_idle(self, timeout_s: float) -> None:
        """Ends the call once its session has been idle ``timeout_s`` (``session_idle_timeout``)."""
        loop = asyncio.get_running_loop()
        while True:
            since = self._idle_since()
            idle_for = 0.0 if since is None else loop.time() - since
            if since is not None and idle_for >= timeout_s:
                break
            # Looked at again when it could first be due: a busy session is looked at every timeout.
            await asyncio.sleep(timeout_s - idle_for)
        await self._say_last(ProtocolError(
            "session_idle_timeout",
            f"The session was idle for {timeout_s:g} s (no client event, no speech, no answer) and is closed.",
        ).to_event().to_json())
        self.end("idle_timeout")

    def _expired_event(self) -> dict[str, Any]:
        assert self._max_duration_s is not None
        return ProtocolError(
            "session_expired", f"Your session hit the maximum duration of {self._max_duration_s / 60:g} minutes."
        ).to_event().to_json()

    async def _wait_wakeup(self, timeout: float | None) -> bool:
        """Waits for ``end`` or the transport's own wake-up; False when ``timeout`` passed first."""
        self._wakeup.clear()
        try:
            async with asyncio.timeout(timeout):
                await self._wakeup.wait()
        except TimeoutError:
            return False
        return True

    async def _until_ended(self) -> str:
        """Waits until the call is asked to end; returns why."""
        while self._end_reason is None:
            await self._wait_wakeup(None)
        return self._end_reason

    async def _release(self) -> None:
        if self._released:
            return
        self._released = True
        reason = self._end_reason or "closed"
        try:
            await self._release_transport(reason)
        finally:
            logger.info("call %s ended: %s", self.id, reason)
            self.closed.set()
            if self._on_closed is not None:
                self._on_closed(self, reason)
