"""A headless WebRTC client: a real aiortc peer that talks to the server like a browser does.

It posts its offer to ``/v1/realtime/calls``, opens the ``oai-events`` data channel, sends
speech as a paced microphone track (20 ms frames at 48 kHz, silence between utterances)
and records every frame it receives with its arrival time::

    async with RealtimeClient("http://127.0.0.1:8000", ice_loopback=True) as client:
        turn = await client.speak(pcm16k)        # one utterance, then silence
        print(turn.user_transcript, turn.transcript, turn.audio_seconds, turn.latency_s)
        client.events                            # every server event so far, in order

With ``video=`` (a Y4M video or a PNG/JPEG image, or any video track) it also sends a camera
track, sendonly, as the page does with its camera on (``app.client.video_file.VideoFileTrack``).

:meth:`RealtimeClient.speak` is half-duplex: it returns once the answer is done *and* has
played out (``response.done`` and ``output_audio_buffer.stopped``), so the next utterance
never overlaps the assistant; when the session transcribes input audio, it also waits for the
utterance's transcription (``.completed`` or ``.failed``). Nothing here imports torch or the
pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import av
import httpx
import numpy as np
import soxr
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from app.client.base import ClientError, RealtimeClientBase
from app.client.turn import TurnResult, committed_item, session_transcribes, transcription_ended
from app.client.video_file import VideoFileTrack
from app.realtime.protocol import (
    EVENTS_CHANNEL,
    OutputAudioBufferClearedEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
    ResponseDoneEvent,
    SessionCreatedEvent,
    event_type,
)
from app.transports.webrtc.ice import (
    CandidatePair,
    IceServer,
    loopback_candidates,
    missing_relay,
    rtc_configuration,
    selected_candidate_pair,
)
from app.transports.webrtc.network import CallNetwork
from app.transports.webrtc.sdp import with_opus_inband_fec
from media.jitter_buffer import ReceiveStats
from media.opus import OpusTrack
from media.pacing import FRAME_SAMPLES, FramePacer
from media.playout import receive_audio
from media.rates import SPEECH_RATE, WIRE_RATE

logger = logging.getLogger(__name__)

# A received frame counts as answer audio when its peak reaches -60 dBFS; the server's
# idle track is digital silence, which Opus decodes to (near) zeros.
AUDIBLE_PEAK = 10 ** (-60 / 20)
# After output_audio_buffer.stopped the last answer frames are still in the network and the
# jitter buffer, and a half-duplex server keeps ignoring speech for a moment (omni-rtc: 400 ms
# of echo tail). Wait for this much further received audio before the turn ends.
PLAYOUT_TAIL_FRAMES = 50  # 1 s
# The server sends a 20 ms frame every 20 ms for the whole call, silence included, so a
# connected call that receives nothing this long has lost its server: a process killed
# outright (say a media worker) sends no close, and aiortc alone would notice only when ICE
# consent expires (6 unanswered checks 4-6 s apart: ~30 s). The server's own idle track
# never pauses longer than a stalled loop, well under a second (tests/e2e/test_overload.py).
SERVER_SILENCE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ReceivedFrame:
    """One received frame: its RTP time (48 kHz, from the stream's first packet), where its audio
    came from (``"packet"``, ``"fec"``, ``"plc"``), its arrival (monotonic) and its peak level."""

    pts: int
    origin: str
    arrived_at: float
    peak: float


@dataclass(frozen=True)
class Speakerphone:
    """The answer played through a speaker into the microphone, with no echo cancellation: each
    received frame comes back ``delay_ms`` after it arrived, ``gain_db`` down, through a room whose
    reverb decays by 60 dB in ``reverb_ms`` (0: none)."""

    delay_ms: int = 150
    gain_db: float = -12.0
    reverb_ms: int = 200

    def impulse_response(self) -> np.ndarray:
        """The room at 48 kHz: the direct path, then a decaying noise tail (seeded), unit energy."""
        taps = max(self.reverb_ms * WIRE_RATE // 1000, 1)
        tail = np.random.default_rng(0).standard_normal(taps) * np.exp(-np.arange(taps) * 6.9 / taps)
        response = 0.3 * tail / np.sqrt(np.sum(np.square(tail)))
        response[0] = 1.0
        return (response / np.sqrt(np.sum(np.square(response))) * 10 ** (self.gain_db / 20)).astype(np.float32)


class _EchoPath:
    """What a :class:`Speakerphone` adds to each microphone frame: the audio received so far,
    delayed, through the room."""

    def __init__(self, speakerphone: Speakerphone) -> None:
        self._response = speakerphone.impulse_response()
        self._line = np.zeros(speakerphone.delay_ms * WIRE_RATE // 1000, dtype=np.float32)
        self._tail = np.zeros(self._response.size - 1, dtype=np.float32)  # the reverb still ringing

    def heard(self, pcm48k: np.ndarray) -> None:
        """Received audio, as it arrives: it comes out of the speaker now."""
        if pcm48k.size == 0:
            return
        wet = np.convolve(pcm48k, self._response)  # overlap-add: the reverb rings into the next chunks
        wet[: self._tail.size] += self._tail
        self._tail = wet[pcm48k.size :].astype(np.float32)
        self._line = np.concatenate([self._line, wet[: pcm48k.size].astype(np.float32)])

    def take(self, samples: int) -> np.ndarray:
        """The next ``samples`` of echo at the microphone (silence while nothing has come back)."""
        out = np.zeros(samples, dtype=np.float32)
        count = min(samples, self._line.size)
        out[:count] = self._line[:count]
        self._line = self._line[count:]
        return out


class MicrophoneTrack(MediaStreamTrack):
    """Plays queued 48 kHz PCM in real time, 20 ms per frame, silence when idle; with an echo
    path, the answer's echo is mixed in."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.speaker: _EchoPath | None = None  # the answer played back into it (a Speakerphone)
        self._pending: deque[np.ndarray] = deque()  # int16 chunks not yet sent
        self._offset = 0  # samples of _pending[0] already sent
        self._pacer = FramePacer()
        self._drained: asyncio.Future[float] | None = None

    @property
    def queued_until_ms(self) -> float:
        """Where audio queued now will start in the stream: ms sent so far plus ms still queued."""
        queued = sum(len(chunk) for chunk in self._pending) - self._offset
        return (self._pacer.pts + queued) * 1000 / WIRE_RATE

    def play(self, pcm48k: np.ndarray) -> asyncio.Future[float]:
        """Queues float32 audio; the future resolves to the wall time its last sample was sent,
        or fails with :class:`ClientError` if the track stops first."""
        if self.readyState != "live":
            raise ClientError("the microphone track has ended: nothing more can be said on this call")
        samples = (np.clip(pcm48k, -1.0, 1.0) * 32767).astype(np.int16)
        if len(samples):
            self._pending.append(samples)
        self._drained = asyncio.get_running_loop().create_future()
        if not self._pending:
            self._drained.set_result(time.monotonic())
        return self._drained

    def stop(self) -> None:
        """Ends the track. aiortc's RTP sender also stops it, quietly, when its transport fails
        (``ConnectionError``): a caller waiting on :meth:`play` learns it then, not at its timeout."""
        super().stop()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ClientError("the microphone track ended before this audio was all sent"))

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait_until_due()
        samples = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        filled = 0
        while filled < FRAME_SAMPLES and self._pending:
            head = self._pending[0]
            take = min(FRAME_SAMPLES - filled, len(head) - self._offset)
            samples[filled : filled + take] = head[self._offset : self._offset + take]
            filled += take
            self._offset += take
            if self._offset == len(head):
                self._pending.popleft()
                self._offset = 0
        if filled and not self._pending and self._drained is not None and not self._drained.done():
            self._drained.set_result(time.monotonic())
        if self.speaker is not None:
            mixed = samples + self.speaker.take(FRAME_SAMPLES) * 32767.0
            samples = np.clip(np.rint(mixed), -32768, 32767).astype(np.int16)
        return self._pacer.frame(samples)


@dataclass
class _Received:
    """Every frame from the server: mono float32 at 48 kHz, with its arrival time, its RTP time
    (``pts``, 48 kHz from the stream's first packet) and where its audio came from (``"packet"``,
    or ``"fec"``/``"plc"`` for a frame the jitter buffer rebuilt or concealed)."""

    chunks: list[np.ndarray] = field(default_factory=list)
    arrived_at: list[float] = field(default_factory=list)
    pts: list[int] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    def add(self, frame: av.AudioFrame) -> None:
        array = frame.to_ndarray()
        channels = len(frame.layout.channels)
        if frame.format.is_planar:
            mono = array.reshape(channels, -1).mean(axis=0)
        else:
            mono = array.reshape(-1, channels).mean(axis=1)
        if np.issubdtype(mono.dtype, np.integer) or frame.format.name.startswith("s16"):
            mono = mono / 32768.0
        if frame.sample_rate != WIRE_RATE:
            mono = soxr.resample(mono, frame.sample_rate, WIRE_RATE)
        self.chunks.append(mono.astype(np.float32))
        self.arrived_at.append(time.monotonic())
        self.pts.append(int(frame.pts or 0))
        self.origins.append(frame.opaque if isinstance(frame.opaque, str) else "packet")


class RealtimeClient(RealtimeClientBase):
    """One call to an omni-rtc (or OpenAI Realtime WebRTC) server."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        session: dict[str, Any] | None = None,
        ice_loopback: bool = False,
        ice_servers: list[str] | None = None,
        offer_candidates: bool = True,
        timeout_s: float = 120.0,
        server_silence_timeout_s: float = SERVER_SILENCE_TIMEOUT_S,
        jitter_buffer: bool = True,
        answer_filter: Callable[[str], str] | None = None,
        video: str | Path | MediaStreamTrack | None = None,
        video_fps: float | None = None,
        speakerphone: Speakerphone | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``url`` is the server's base URL; ``session`` goes with the offer (multipart);
        ``headers`` go with every request (a proxy's ``X-Forwarded-For``, in tests and benches).

        The STUN/TURN servers are the server's (``GET /v1/realtime/ice_servers``, with fresh TURN
        credentials; none from a server without that route) unless ``ice_servers`` names others.

        ``offer_candidates=False`` strips the candidates from the offer, as browsers posting
        before gathering do; the server then learns this peer as peer-reflexive.
        ``timeout_s`` bounds connecting and each turn. Once the server has been heard, no audio
        frame from it for ``server_silence_timeout_s`` ends the call (``ended``), and waiting
        for events or a turn raises :class:`ClientError` saying so. The answer's audio goes through
        the same jitter buffer as the server's inbound audio (``jitter_buffer=False``: aiortc's own
        path, no concealment); the microphone is Opus-encoded with in-band FEC tuned to the loss
        the server reports, as browsers do. ``answer_filter``, when given, rewrites the server's
        SDP answer before it is used (tests route a call through an impairing relay with it).
        ``video``: a file to send as the camera (``video_fps`` overrides its frame rate), or a video
        track to send as it is (a test's). ``speakerphone``: the answer comes back into the microphone
        (a client without echo cancellation).
        """
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._headers = dict(headers or {})
        self._session = session
        self._ice_loopback = ice_loopback
        self._ice_servers = None if ice_servers is None else [IceServer(url) for url in ice_servers]
        self._offer_candidates = offer_candidates
        super().__init__(timeout_s)
        self.call_location: str | None = None
        self.answer_sdp: str | None = None  # the server's SDP answer, as used
        self._pc: RTCPeerConnection | None = None
        self._microphone = MicrophoneTrack()
        if speakerphone is not None:
            self._microphone.speaker = _EchoPath(speakerphone)
        self.camera: MediaStreamTrack | None = (
            video if video is None or isinstance(video, MediaStreamTrack) else VideoFileTrack(video, fps=video_fps)
        )
        self._jitter_buffer = jitter_buffer
        self._answer_filter = answer_filter
        self._network: CallNetwork | None = None
        self._source: MediaStreamTrack | None = None  # the answer's audio as read: the jitter buffer's track
        self.receive_stats: ReceiveStats | None = None  # the answer's jitter buffer, once its track arrives
        self._received = _Received()
        self._receiver: asyncio.Task[None] | None = None
        self._channel_open = asyncio.Event()
        self._channel: RTCDataChannel | None = None
        self._server_silence_timeout_s = server_silence_timeout_s
        self._heard_at: float | None = None  # monotonic time of the server's last frame or event
        self.event_arrivals: list[float] = []  # monotonic arrival time of each of ``events``
        self.ended: str | None = None  # why the call ended (the server closed it or went silent, or close()); None while it runs

    # -- connection ------------------------------------------------------------------

    async def connect(self) -> None:
        servers = self._ice_servers if self._ice_servers is not None else await self._server_ice_servers()
        configuration = rtc_configuration(servers)
        pc = RTCPeerConnection(configuration)
        self._pc = pc
        channel = pc.createDataChannel(EVENTS_CHANNEL)
        self._channel = channel
        channel.on("open", self._channel_open.set)
        channel.on("message", self._on_message)
        microphone = OpusTrack(self._microphone)
        pc.addTrack(microphone)
        if self.camera is not None:
            pc.addTransceiver(self.camera, direction="sendonly")  # the server never sends video
        self._network = CallNetwork(pc, name="client", outbound=microphone)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        with loopback_candidates(self._ice_loopback):
            await pc.setLocalDescription(await pc.createOffer())
        unrelayed = missing_relay(configuration, pc.localDescription.sdp)
        if unrelayed:
            logger.warning("no relay candidate from %s", ", ".join(unrelayed))
        offer = with_opus_inband_fec(pc.localDescription.sdp)  # as browsers offer
        if not self._offer_candidates:
            offer = re.sub(r"^a=(candidate|end-of-candidates).*\r?\n", "", offer, flags=re.MULTILINE)
        answer = await self._post_offer(offer)
        if self._answer_filter is not None:
            answer = self._answer_filter(answer)
        self.answer_sdp = answer
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        self._network.start()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._next_event(event_type(SessionCreatedEvent), 0)  # sent once the channel opens
        except (TimeoutError, ClientError) as exc:
            await self._hang_up()  # frees the server's slot now, not at its connect timeout
            reason = str(exc) or f"it did not connect within {self._timeout_s:g} s"
            if unrelayed:
                reason += (
                    f"; the TURN server ({', '.join(unrelayed)}) gave no relay candidate: it refused the "
                    "credentials (a --ice-auth-secret that is not coturn's static-auth-secret?) or could not be reached"
                )
            raise ClientError(f"the call failed: {reason}") from None

    async def _server_ice_servers(self) -> list[IceServer]:
        """The server's STUN/TURN servers; none when it has no ``ice_servers`` route (not omni-rtc)."""
        async with httpx.AsyncClient(timeout=self._timeout_s) as http:
            response = await http.get(f"{self.url}/v1/realtime/ice_servers", headers=self._authorization())
        if response.status_code == 404:
            return []
        if response.status_code != 200:
            raise ClientError(f"the server refused its ICE servers: HTTP {response.status_code} {response.text}")
        try:
            return [server for entry in response.json()["ice_servers"] for server in IceServer.from_json(entry)]
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"the server's ICE servers are malformed: {exc}") from None

    async def _hang_up(self) -> None:
        """``DELETE`` the call, as the page does when it gives up (401 for an ``ek_`` secret: best effort)."""
        if self.call_location is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=10.0) as http:
                await http.delete(urljoin(self.url + "/", self.call_location), headers=self._authorization())

    def _authorization(self) -> dict[str, str]:
        """Every request's headers: the given ones, and the API key's."""
        return {**self._headers, **({"Authorization": f"Bearer {self._api_key}"} if self._api_key else {})}

    @property
    def candidate_pair(self) -> CandidatePair | None:
        """The ICE candidate pair the call's media takes (``relay``: through a TURN server)."""
        return selected_candidate_pair(self._pc) if self._pc is not None else None

    async def _post_offer(self, offer: str) -> str:
        headers = self._authorization()
        async with httpx.AsyncClient(timeout=self._timeout_s) as http:
            if self._session is None:
                response = await http.post(
                    f"{self.url}/v1/realtime/calls",
                    content=offer,
                    headers={**headers, "Content-Type": "application/sdp"},
                )
            else:
                response = await http.post(
                    f"{self.url}/v1/realtime/calls",
                    files={"sdp": (None, offer), "session": (None, json.dumps(self._session))},
                    headers=headers,
                )
        if response.status_code != 201:
            raise ClientError(f"the server refused the call: HTTP {response.status_code} {response.text}")
        self.call_location = response.headers.get("location")
        return response.text

    async def close(self) -> None:
        """Hangs up (closes the peer connection, as a browser tab does). Safe twice."""
        if self.ended is None:
            self.ended = "hung up"
        if self._network is not None:
            await self._network.close()
        if self._pc is not None:
            await self._pc.close()
        self._microphone.stop()
        if self.camera is not None:
            self.camera.stop()
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
            self._receiver = None
        if self._source is not None:
            self._source.stop()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self._receiver is not None:
            return
        assert self._pc is not None
        receiver = next(t.receiver for t in self._pc.getTransceivers() if t.receiver.track is track)
        # Frames are recorded, not played: each is handed on as soon as it is due (in order, or
        # concealed at its deadline), as the server's inbound audio is.
        source = receive_audio(receiver, jitter_buffer=self._jitter_buffer)
        self._source = source
        self.receive_stats = getattr(source, "stats", None)
        if self._network is not None:
            self._network.watch_inbound(source)
        self._receiver = asyncio.create_task(self._receive(source), name="client audio receiver")

    async def _receive(self, track: MediaStreamTrack) -> None:
        silence_s = self._server_silence_timeout_s
        while True:
            # Until the server is first heard (a frame or an event) silence means nothing yet:
            # connecting has its own timeout.
            silent_for = 0.0 if self._heard_at is None else time.monotonic() - self._heard_at
            try:
                async with asyncio.timeout(max(silence_s - silent_for, 0.0)):
                    frame = await track.recv()
            except MediaStreamError:
                self._end("the server closed the call")
                return
            except TimeoutError:
                if self._heard_at is not None and time.monotonic() - self._heard_at >= silence_s:
                    self._end(f"nothing heard from the server for {silence_s:g} s (no audio frame, no event)")
                    return
                continue
            assert isinstance(frame, av.AudioFrame)  # the answer's track is audio
            self._heard_at = time.monotonic()
            self._received.add(frame)
            if self._microphone.speaker is not None:
                self._microphone.speaker.heard(self._received.chunks[-1])
            self._notify()

    def _on_connection_state(self) -> None:
        assert self._pc is not None
        if self._pc.connectionState in ("failed", "closed"):
            self._end(f"the connection {self._pc.connectionState}")

    def _end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason
            logger.info("call %s ended: %s", self.call_location, reason)
        self._notify()

    def _server_gone(self) -> str | None:
        return self.ended

    # -- events ----------------------------------------------------------------------

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except json.JSONDecodeError:
            logger.error("the server sent a data-channel message that is not JSON: %.200r", message)
            return
        self._heard_at = time.monotonic()
        self.events.append(event)
        self.event_arrivals.append(self._heard_at)
        self._notify()

    async def send(self, event: dict[str, Any]) -> None:
        """Sends one client event on ``oai-events``."""
        await self._channel_open.wait()
        assert self._channel is not None  # opened by connect()
        self._channel.send(json.dumps(event))

    # -- speaking --------------------------------------------------------------------

    async def say(self, pcm16k: np.ndarray) -> float:
        """Says ``pcm16k`` (float32 mono, 16 kHz) without waiting for any answer (full duplex:
        it may talk over one); returns the wall time its last sample was sent."""
        pcm48k = soxr.resample(np.asarray(pcm16k, dtype=np.float32), SPEECH_RATE, WIRE_RATE)
        return await self._microphone.play(pcm48k)

    @property
    def frames_received(self) -> int:
        """Audio frames received so far; a mark for :meth:`audio_since`."""
        return len(self._received.chunks)

    def frames_since(self, mark: int) -> list[ReceivedFrame]:
        """Each frame received from frame ``mark`` on, as the answer's timeline sees it."""
        received = self._received
        return [
            ReceivedFrame(pts=pts, origin=origin, arrived_at=at, peak=float(np.max(np.abs(chunk), initial=0.0)))
            for pts, origin, at, chunk in zip(
                received.pts[mark:], received.origins[mark:], received.arrived_at[mark:], received.chunks[mark:],
                strict=True,
            )
        ]

    def audio_since(self, mark: int) -> np.ndarray:
        """Everything received from frame ``mark`` on: float32 mono at 48 kHz, silence included."""
        chunks = self._received.chunks[mark:]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    async def speak(self, pcm16k: np.ndarray) -> TurnResult:
        """Says one utterance (float32 mono, 16 kHz) and waits until its answer has played out.

        The server's VAD ends the turn; nothing is committed by hand.
        """
        first_event = len(self.events)
        first_frame = len(self._received.chunks)
        spoken_from_ms = self._microphone.queued_until_ms
        try:
            async with asyncio.timeout(self._timeout_s):
                spoken_at = await self.say(pcm16k)
                done = await self._next_event(event_type(ResponseDoneEvent), first_event)
                response = done["response"]
                if self._expects_playback(first_event, response):
                    await self._next_event(_playback_ended, first_event)
                    tail_from = len(self._received.chunks)
                    while len(self._received.chunks) - tail_from < PLAYOUT_TAIL_FRAMES:
                        await self._changes()
                committed = committed_item(self.events[first_event:])
                if committed is not None and session_transcribes(self.events):
                    await self._next_event(lambda event: transcription_ended(event, committed), first_event)
        except TimeoutError:
            recent = [event.get("type") for event in self.events[first_event:]][-12:]
            raise ClientError(f"the turn did not finish within {self._timeout_s:g} s; last events: {recent}") from None
        audio, audible_samples, first_audible_at = self._answer_audio(first_frame, after=spoken_at)
        return TurnResult(
            events=self.events[first_event:],
            response=response,
            audible_seconds=audible_samples / WIRE_RATE,
            audio=audio,
            latency_s=None if first_audible_at is None else first_audible_at - spoken_at,
            spoken_at=spoken_at,
            spoken_from_ms=spoken_from_ms,
        )

    def _expects_playback(self, first_event: int, response: dict[str, Any]) -> bool:
        """Whether the answer has audio to play out, so that its end is worth waiting for.

        ``response.done`` may overtake ``output_audio_buffer.started``: an answer with audio
        tokens plays even when its start has not been announced yet.
        """
        if any(event.get("type") == event_type(OutputAudioBufferStartedEvent) for event in self.events[first_event:]):
            return True
        details = (response.get("usage") or {}).get("output_token_details") or {}
        return response.get("status") in ("completed", "incomplete") and bool(details.get("audio_tokens"))

    def _answer_audio(self, first_frame: int, *, after: float) -> tuple[np.ndarray, int, float | None]:
        """The received span from the first to the last audible frame, its audible samples, its start."""
        chunks = self._received.chunks[first_frame:]
        arrived = self._received.arrived_at[first_frame:]
        audible = [
            i for i, (chunk, at) in enumerate(zip(chunks, arrived, strict=True))
            if at >= after and len(chunk) and float(np.max(np.abs(chunk))) >= AUDIBLE_PEAK
        ]
        if not audible:
            return np.zeros(0, dtype=np.float32), 0, None
        audible_samples = sum(len(chunks[i]) for i in audible)
        return np.concatenate(chunks[audible[0] : audible[-1] + 1]), audible_samples, arrived[audible[0]]


def _playback_ended(event: dict[str, Any]) -> bool:
    return event.get("type") in (event_type(OutputAudioBufferStoppedEvent), event_type(OutputAudioBufferClearedEvent))
