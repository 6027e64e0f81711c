"""WebRTC glue: one :class:`Call` per peer moves bytes between aiortc and a RealtimeSession.

The session is transport-agnostic; a call gives it

- the peer's audio (``media.inbound.InboundAudio`` on the remote track → ``push_audio``),
- the peer's camera, when it offers a video track (VP8 or H.264, received only):
  ``media.video.VideoSampler`` has the frames the session asks for (``video_plan``) decoded,
  none larger than ``max_video_pixels`` (``media.video_gate``), and hands them on
  (``add_video_frame``),
- an output (``media.outbound.OutboundAudioTrack``, sent as the answer's audio track),
- a ``send`` callback that puts each server event on the ``oai-events`` data channel as JSON
  (events sent before the peer opens the channel wait and go out, in order, on open),

and feeds the channel's messages to ``handle_message`` one at a time, in order.

A call ends when the peer closes, ICE/DTLS fails, the peer never connects
(``connect_timeout_s``), or a connected peer stops sending media (``disconnect_timeout_s``;
aiortc has no "disconnected" state and notices a vanished peer only when ICE consent expires,
~30 s). Ending releases everything the call owns: the message reader, the session (its
running response and engine work), the inbound reader, the outbound track and the peer
connection. ``app.calls.registry.CallRegistry`` holds the open calls; the server closes them all on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InternalError, InvalidAccessError, InvalidStateError, OperationError

from app.calls.lifecycle import CallLifecycle, EventObserver, Session
from app.calls.registry import OnClosed
from app.realtime.protocol import EVENTS_CHANNEL, ProtocolError
from app.transports.webrtc.ice import loopback_candidates, missing_relay, selected_candidate_pair
from app.transports.webrtc.network import CallNetwork, NetworkObserver
from app.transports.webrtc.sctp_guard import Refusal, guard_data_channel
from app.transports.webrtc.sdp import with_opus_inband_fec
from media.echo_canceller import EchoCanceller
from media.inbound import InboundAudio
from media.opus import OpusTrack
from media.outbound import OutboundAudioTrack
from media.pacing import PacingStats
from media.playout import receive_audio
from media.video import VideoSampler
from media.video_gate import MAX_DECODED_PIXELS

logger = logging.getLogger(__name__)

# Events a session may send before the peer opens the channel: session.created and, for a
# client that is slow to open it, a few more. Past this the call is not being listened to.
MAX_PENDING_EVENTS = 1_000
# Client events received but not yet handled. The session's event gate admits ~20/s in bursts
# of ~50; a peer that outruns the handler by this much is flooding, and its excess is dropped
# (with an error event) before it can grow the call's memory.
MAX_QUEUED_MESSAGES = 256
DROPPED_EVENTS_LOG_INTERVAL_S = 1.0
# Events sent on the data channel that SCTP has not yet taken (the peer stopped acknowledging:
# a frozen tab, a stuck client): past this the call ends ("client_not_reading"). The same bound
# as a WebSocket's (app.transports.websocket.socket_call.MAX_PENDING_BYTES); a burst of 100 maximal text items
# echoes 3-10 MB, which a reading client drains in seconds.
MAX_BUFFERED_EVENT_BYTES = 16 * 1024 * 1024


class CallObserver(EventObserver, NetworkObserver, Protocol):
    """What watches a WebRTC call from outside: its events (``app.calls.lifecycle.EventObserver``),
    its input audio, and its network figures (``app.transports.webrtc.network.NetworkObserver``)."""

    def on_input_audio(self, samples: int) -> None:
        """``samples`` more 16 kHz samples were handed to the session."""

    def on_echo_removed(self, seconds: float) -> None:
        """The echo canceller took the answer's echo out of ``seconds`` more of input."""


SessionFactory = Callable[[OutboundAudioTrack, Callable[[dict[str, Any]], None]], Session]


class OfferError(ValueError):
    """The SDP offer cannot be answered (malformed, or without the media a call needs)."""


def new_call_id() -> str:
    return "rtc_" + secrets.token_hex(12)


class Call(CallLifecycle):
    """One peer connection and the session it carries; it ends as every call does (``app.calls.lifecycle``)."""

    transport = "webrtc"  # the metrics' label; app.transports.websocket.socket_call.SocketCall is the other

    def __init__(
        self,
        *,
        make_session: SessionFactory,
        configuration: RTCConfiguration,
        ice_loopback: bool = False,
        connect_timeout_s: float = 30.0,
        disconnect_timeout_s: float = 10.0,
        max_duration_s: float | None = None,
        idle_timeout_s: float | None = None,
        observer: CallObserver | None = None,
        on_connected: Callable[[Call], None] | None = None,
        on_closed: OnClosed | None = None,
        call_id: str | None = None,
        pacing_stats: PacingStats | None = None,
        jitter_buffer: bool = True,
        max_video_pixels: int = MAX_DECODED_PIXELS,
    ) -> None:
        """``jitter_buffer``: inbound audio through ``media.playout`` (False: aiortc's own path).
        ``max_video_pixels``: the largest camera frame decoded (``media.video_gate``)."""
        super().__init__(call_id or new_call_id(), max_duration_s=max_duration_s, on_closed=on_closed,
                         idle_timeout_s=idle_timeout_s)
        self._jitter_buffer = jitter_buffer
        self._max_video_pixels = max_video_pixels
        self._network: CallNetwork | None = None
        self._pacing_stats = pacing_stats
        self._make_session = make_session
        self._configuration = configuration
        self._ice_loopback = ice_loopback
        self._connect_timeout_s = connect_timeout_s
        self._disconnect_timeout_s = disconnect_timeout_s
        self._observer = observer
        self._on_connected = on_connected

        self._loop = asyncio.get_running_loop()
        self._pc: RTCPeerConnection | None = None
        self._session: Session | None = None
        self._output: OutboundAudioTrack | None = None
        self._echo: EchoCanceller | None = None  # made when the session first wants it
        self._inbound: InboundAudio | None = None
        self._video: VideoSampler | None = None
        self._channel: RTCDataChannel | None = None
        self._pending_events: deque[str] = deque()
        self._messages: asyncio.Queue[str | bytes] = asyncio.Queue(MAX_QUEUED_MESSAGES)
        self._events_dropped = 0  # since the last warning about it
        self._dropped_logged_at: float | None = None
        self._connected = False
        self._last_media_at: float | None = None  # loop time of the last inbound frame
        self._resources = contextlib.AsyncExitStack()
        self._reader: asyncio.Task[None] | None = None

    async def answer(self, offer_sdp: str) -> str:
        """Accepts the offer and returns the SDP answer, its ICE candidates complete.

        Raises :class:`OfferError` for an offer that cannot be answered; the caller then
        closes the call (whatever was set up is released by :meth:`close`).
        """
        if self._pc is not None:
            raise InvalidStateError("a call answers one offer")
        pc = RTCPeerConnection(self._configuration)
        self._pc = pc
        self._resources.push_async_callback(pc.close)
        output = self._output = OutboundAudioTrack(pacing_stats=self._pacing_stats)
        self._resources.callback(output.stop)
        session = self._make_session(output, self._send)
        self._session = session
        self._resources.push_async_callback(session.close)
        output.set_listener(session)
        opus = OpusTrack(output)  # encoded here: see media/opus.py for what aiortc's sender would spend
        self._resources.callback(opus.stop)
        self._network = CallNetwork(pc, name=self.id, outbound=opus, observer=self._observer)
        self._resources.push_async_callback(self._network.close)  # before the peer connection closes

        pc.on("connectionstatechange", self._on_connection_state)
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except (
            ValueError, KeyError, IndexError, TypeError, InvalidAccessError, InvalidStateError, InternalError,
            OperationError,
        ) as exc:
            # aiortc's SDP parser reports malformed input with whatever the failing line raised;
            # OperationError: an m= section with no codec aiortc can use (found by fuzzing). Its
            # words stay in the log (``__cause__``); the client is told the fact.
            raise OfferError("the SDP offer could not be parsed") from exc
        if not any(t.kind == "audio" for t in pc.getTransceivers()):
            raise OfferError("the SDP offer has no audio m-line; a call needs one (sendrecv or recvonly)")
        if sum(t.kind == "audio" for t in pc.getTransceivers()) > 1:
            # aiortc decodes every audio m-line and queues its frames, unbounded, for a reader: an
            # extra one nobody reads grew by 50 frames a second for as long as the call lasted.
            raise OfferError("the SDP offer has more than one audio m-line; a call takes one microphone")
        if sum(t.kind == "video" for t in pc.getTransceivers()) > 1:
            raise OfferError("the SDP offer has more than one video m-line; a call takes one camera (sendonly)")
        if pc.sctp is None:
            raise OfferError(
                f"the SDP offer has no data channel (m=application); open one named {EVENTS_CHANNEL!r} before offering"
            )
        guard_data_channel(pc.sctp, self._on_data_channel_refused)
        pc.addTrack(opus)
        answer = await pc.createAnswer()
        # aiortc gathers every candidate inside setLocalDescription, so the answer is complete.
        with loopback_candidates(self._ice_loopback):
            await pc.setLocalDescription(answer)
        unrelayed = missing_relay(self._configuration, pc.localDescription.sdp)
        if unrelayed:
            logger.warning(
                "call %s: no relay candidate from %s: the TURN server refused the credentials or is unreachable",
                self.id, ", ".join(unrelayed),
            )

        await session.start()
        self._network.start()
        self._carry()
        # aiortc writes no Opus fmtp: say that this side decodes in-band FEC (app/transports/webrtc/sdp.py).
        return with_opus_inband_fec(pc.localDescription.sdp)

    # -- its life, its last word, its release (app.calls.lifecycle) -----------------------

    async def _run(self) -> str:
        self._reader = asyncio.create_task(self._read_messages(), name=f"call {self.id} events")
        return await self._watch()

    def _idle_since(self) -> float | None:
        return self._session.idle_since() if self._session is not None else None

    async def _say_last(self, event: dict[str, Any]) -> None:
        self._send_own(event)
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return
        # Closing the peer connection aborts SCTP: give the event up to a second to leave.
        # aiortc emits bufferedamountlow when the buffer falls to its threshold (0).
        drained = asyncio.Event()
        channel.on("bufferedamountlow", drained.set)
        try:
            if channel.bufferedAmount > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await drained.wait()
        finally:
            channel.remove_listener("bufferedamountlow", drained.set)

    async def _watch(self) -> str:
        """Returns why the call ends: the first end() reason, or a timeout."""
        deadline = self._loop.time() + self._connect_timeout_s
        while self._end_reason is None and not self._connected:
            if not await self._wait_wakeup(deadline - self._loop.time()):
                return "connect_timeout"
        while self._end_reason is None:
            if self._last_media_at is None:
                # No inbound media yet (or a receive-only peer): ICE consent watches it.
                await self._wait_wakeup(None)
                continue
            silent_for = self._loop.time() - self._last_media_at
            if silent_for >= self._disconnect_timeout_s:
                logger.info("call %s: no media from the peer for %.1f s", self.id, silent_for)
                return "peer_gone"
            await self._wait_wakeup(self._disconnect_timeout_s - silent_for)
        return self._end_reason

    async def _release_transport(self, reason: str) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._inbound is not None:
            self._resources.push_async_callback(self._inbound.close)
        if self._video is not None:
            self._resources.push_async_callback(self._video.close)
        await self._resources.aclose()

    # -- aiortc callbacks (synchronous, on the event loop) ------------------------------

    def _on_connection_state(self) -> None:
        assert self._pc is not None
        state = self._pc.connectionState
        logger.debug("call %s: connection %s", self.id, state)
        if state == "connected":
            if not self._connected and self._on_connected is not None:
                self._on_connected(self)
            self._connected = True
            pair = selected_candidate_pair(self._pc)
            # Which path the media takes: "relay" means through the TURN server (docs/DEPLOY.md).
            logger.info("call %s: connected (candidates: ours %s, the peer's %s)", self.id,
                        pair.local if pair else "unknown", pair.remote if pair else "unknown")
            self._wakeup.set()
        elif state in ("failed", "closed"):
            self.end(f"connection_{state}")

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            logger.warning("call %s: ignoring data channel %r (events go on %r)", self.id, channel.label, EVENTS_CHANNEL)
            return
        self._channel = channel
        channel.on("message", self._on_message)
        if channel.readyState == "open":
            self._flush_pending()
        else:
            channel.on("open", self._flush_pending)

    def _on_message(self, raw: str | bytes) -> None:
        try:
            self._messages.put_nowait(raw)
        except asyncio.QueueFull:
            # A warning a second, not one an event: a peer's flood of tiny events (a chunk each)
            # made a log line apiece, half of what each dropped event cost the loop.
            self._events_dropped += 1
            now = self._loop.time()
            if self._dropped_logged_at is None or now - self._dropped_logged_at >= DROPPED_EVENTS_LOG_INTERVAL_S:
                logger.warning(
                    "call %s: %d client events wait to be handled; %d dropped since the last warning",
                    self.id, MAX_QUEUED_MESSAGES, self._events_dropped,
                )
                self._dropped_logged_at = now
                self._events_dropped = 0
            self._send_own(
                ProtocolError(
                    "rate_limit_exceeded",
                    f"{MAX_QUEUED_MESSAGES} events are waiting to be handled; this event was dropped.",
                ).to_event().to_json()
            )

    def _on_track(self, track: MediaStreamTrack) -> None:
        assert self._session is not None
        assert self._pc is not None
        receiver = next(t.receiver for t in self._pc.getTransceivers() if t.receiver.track is track)
        if track.kind == "video" and self._video is None:
            # The sampler gates the receiver's decoder (size, wanted or not) and reads every frame.
            self._video = VideoSampler(
                receiver, plan=self._session.video_plan, on_frame=self._session.add_video_frame,
                max_pixels=self._max_video_pixels,
            )
            self._video.start()
            return
        if track.kind != "audio" or self._inbound is not None:
            logger.warning("call %s: ignoring an extra %s track", self.id, track.kind)
            return
        # The track event comes inside setRemoteDescription, before any media can flow.
        source = receive_audio(receiver, jitter_buffer=self._jitter_buffer)
        self._resources.callback(source.stop)
        if self._network is not None:
            self._network.watch_inbound(source)
        self._inbound = InboundAudio(source, on_audio=self._on_audio)
        self._inbound.start()

    def _on_data_channel_refused(self, refusal: Refusal) -> None:
        logger.warning(
            "call %s: the peer sent %s on the data channel (app/transports/webrtc/sctp_guard.py); ending the call",
            self.id, refusal.detail,
        )
        self.end(refusal.reason)

    def _on_audio(self, pcm: np.ndarray) -> None:
        first = self._last_media_at is None
        self._last_media_at = self._loop.time()
        if first:
            self._wakeup.set()  # the watch starts timing the peer's media
        if self._observer is not None:
            self._observer.on_input_audio(len(pcm))
        assert self._session is not None
        if self._session.echo_cancellation:
            pcm = self._without_echo(pcm)
        self._session.push_audio(pcm)

    def _without_echo(self, pcm: np.ndarray) -> np.ndarray:
        """The input with the answer's echo taken out; the canceller starts with the first input
        that wants it and hears every frame the track sends from then on."""
        echo = self._echo
        if echo is None:
            echo = self._echo = EchoCanceller()
            assert self._output is not None
            self._output.set_frame_tap(echo.played)
        removed = echo.removed_seconds
        cleaned = echo.captured(pcm)
        if self._observer is not None and echo.removed_seconds > removed:
            self._observer.on_echo_removed(echo.removed_seconds - removed)
        return cleaned

    # -- events both ways ------------------------------------------------------------

    def _send_own(self, event: dict[str, Any]) -> None:
        """An event of the call's own (not the session's): the session's observers hear it too."""
        if self._session is not None:
            self._session.transport_sent(event)
        self._send(event)

    def _send(self, event: dict[str, Any]) -> None:
        if self._network is not None and (network := self._network.annotate(event)) is not None:
            if self._session is not None:  # its turn's report (traces, timelines) carries them too
                self._session.network_reported(str(event["response"]["id"]), network)
        if self._observer is not None:
            self._observer.on_server_event(event)
        text = json.dumps(event, separators=(",", ":"))
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            if self._end_reason == "client_not_reading":
                return
            channel.send(text)
            if channel.bufferedAmount > MAX_BUFFERED_EVENT_BYTES:
                logger.warning(
                    "call %s: %d bytes of events wait for a peer that does not take them; ending the call",
                    self.id, channel.bufferedAmount,
                )
                self.end("client_not_reading")
        elif channel is None or channel.readyState == "connecting":
            if len(self._pending_events) >= MAX_PENDING_EVENTS:
                logger.warning("call %s: %d events wait for the data channel; dropping the oldest", self.id, len(self._pending_events))
                self._pending_events.popleft()
            self._pending_events.append(text)
        else:
            logger.debug("call %s: data channel %s, dropped %s", self.id, channel.readyState, event.get("type"))

    def _flush_pending(self) -> None:
        assert self._channel is not None
        while self._pending_events:
            self._channel.send(self._pending_events.popleft())

    async def _read_messages(self) -> None:
        assert self._session is not None
        while True:
            raw = await self._messages.get()
            try:
                await self._session.handle_message(raw)
            except Exception:
                # The session answers bad input with an error event; an exception here is a bug.
                # Log it and keep reading: one bad event must not end the call.
                logger.exception("call %s: session failed on a client event", self.id)
            if self._session.flooding:
                self.end("client_flood")
                return
