"""A headless WebSocket client: speaks to ``GET /v1/realtime`` as a server-side program does.

The counterpart of ``app.client.webrtc.RealtimeClient`` for the WebSocket transport, with the
same surface::

    async with RealtimeSocketClient("http://127.0.0.1:8000") as client:
        turn = await client.speak(pcm16k)        # one utterance; the server's VAD ends it
        print(turn.transcript, turn.audio_seconds, turn.latency_s)
        client.events                            # every server event so far, in order

Speech goes up as ``input_audio_buffer.append`` (PCM16 at 24 kHz) paced at real time, in
``CHUNK_MS`` pieces, like a microphone: first ``LEAD_SILENCE_MS`` of silence (a half-duplex
server ignores the first 400 ms after an answer as its echo tail), then the utterance, then
silence until the server commits it. The answer is the ``response.output_audio.delta`` audio of
the response. With ``acknowledge_playback`` the client acknowledges each answer as played
(vllm-omni's ``playback.ack``) once it has it all, and waits for ``playback.acknowledged``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import soxr
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.client.base import ClientError, RealtimeClientBase
from app.client.turn import TurnResult, committed_item, session_transcribes, transcription_ended
from app.realtime.protocol import (
    InputAudioBufferAppendEvent,
    InputAudioBufferCommittedEvent,
    PlaybackAckEvent,
    PlaybackAcknowledgedEvent,
    ResponseDoneEvent,
    ResponseOutputAudioDeltaEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
    SessionUpdateEvent,
    event_type,
)
from media import g711
from media.rates import SPEECH_RATE, VOICE_RATE

logger = logging.getLogger(__name__)

CHUNK_MS = 100  # one append per 100 ms of audio (OpenAI's examples send 20-100 ms)
LEAD_SILENCE_MS = 600  # before each utterance: past a half-duplex server's 400 ms echo tail
_DELTA = event_type(ResponseOutputAudioDeltaEvent)
_SESSION_EVENTS = (event_type(SessionCreatedEvent), event_type(SessionUpdatedEvent))


class RealtimeSocketClient(RealtimeClientBase):
    """One WebSocket session with an omni-rtc (or OpenAI Realtime) server."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        session: dict[str, Any] | None = None,
        model: str | None = None,
        acknowledge_playback: bool = False,
        timeout_s: float = 120.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``url`` is the server's base URL (http:// or ws://); ``session`` is sent as ``session.update``;
        ``headers`` go with the upgrade request (a proxy's ``X-Forwarded-For``, in tests and benches)."""
        base = url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        self.url = base + "/v1/realtime" + (f"?model={model}" if model else "")
        self._api_key = api_key
        self._headers = dict(headers or {})
        self._session = session
        self._acknowledge = acknowledge_playback
        super().__init__(timeout_s)
        self.arrived_at: list[float] = []  # time.monotonic() of each event's arrival
        self.call_location: str | None = None  # the session id, once created
        self._output_format = "audio/pcm"
        self._ws: ClientConnection | None = None
        self._receiver: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        headers = {**self._headers, **({"Authorization": f"Bearer {self._api_key}"} if self._api_key else {})}
        try:
            self._ws = await websockets.connect(self.url, additional_headers=headers, open_timeout=self._timeout_s)
        except InvalidStatus as exc:
            body = exc.response.body.decode(errors="replace") if exc.response.body else ""
            raise ClientError(f"the server refused the session: HTTP {exc.response.status_code} {body}") from None
        self._receiver = asyncio.create_task(self._receive(self._ws), name="socket client receiver")
        created = await self.wait_for(event_type(SessionCreatedEvent))
        self.call_location = str(created["session"]["id"])
        if self._session is not None:
            start = len(self.events)
            await self.send(SessionUpdateEvent(type="session.update", session=self._session).model_dump())
            await self.wait_for(lambda e: e.get("type") in (event_type(SessionUpdatedEvent), "error"), start=start)

    async def close(self) -> None:
        """Closes the socket (a normal close frame) and the receiver. Safe twice."""
        if self._ws is not None:
            await self._ws.close()
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
            self._receiver = None

    async def _receive(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                try:
                    event = json.loads(message)
                except json.JSONDecodeError:
                    logger.error("the server sent a frame that is not JSON: %.200r", message)
                    continue
                if event.get("type") in _SESSION_EVENTS:
                    audio_output = ((event.get("session") or {}).get("audio") or {}).get("output") or {}
                    self._output_format = str((audio_output.get("format") or {}).get("type", "audio/pcm"))
                self.events.append(event)
                self.arrived_at.append(time.monotonic())
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            self._notify()

    # -- events ----------------------------------------------------------------------

    def _server_gone(self) -> str | None:
        return "the server closed the session" if self._receiver is not None and self._receiver.done() else None

    async def send(self, event: dict[str, Any]) -> None:
        assert self._ws is not None, "connect() first"
        await self._ws.send(json.dumps({key: value for key, value in event.items() if value is not None}))

    # -- speaking --------------------------------------------------------------------

    async def speak(self, pcm16k: np.ndarray) -> TurnResult:
        """Says one utterance (float32 mono, 16 kHz) and waits for its whole answer (and for the
        utterance's transcription, when the session transcribes input audio)."""
        first_event = len(self.events)
        committed = event_type(InputAudioBufferCommittedEvent)
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._stream(np.zeros(LEAD_SILENCE_MS * SPEECH_RATE // 1000, dtype=np.float32))
                await self._stream(np.asarray(pcm16k, dtype=np.float32))
                spoken_at = time.monotonic()
                silence = np.zeros(CHUNK_MS * SPEECH_RATE // 1000, dtype=np.float32)
                while not any(event.get("type") == committed for event in self.events[first_event:]):
                    await self._stream(silence)
                done = await self._next(event_type(ResponseDoneEvent), first_event)
                response = done["response"]
                audio, sample_rate, first_audio_at = self._answer_audio(str(response["id"]), first_event)
                if self._acknowledge and audio.size:
                    start = len(self.events)
                    ack = PlaybackAckEvent(type="playback.ack", played_ms=audio.size * 1000 // sample_rate,
                                           response_id=str(response["id"]))
                    await self.send(ack.model_dump())
                    await self._next(event_type(PlaybackAcknowledgedEvent), start)
                item_id = committed_item(self.events[first_event:])
                if item_id is not None and session_transcribes(self.events):
                    await self.wait_for(lambda event: transcription_ended(event, item_id), start=first_event)
        except TimeoutError:
            recent = [event.get("type") for event in self.events[first_event:]][-12:]
            raise ClientError(f"the turn did not finish within {self._timeout_s:g} s; last events: {recent}") from None
        return TurnResult(
            events=self.events[first_event:],
            response=response,
            audio=audio,
            latency_s=None if first_audio_at is None else first_audio_at - spoken_at,
            audible_seconds=audio.size / sample_rate,
            sample_rate=sample_rate,
        )

    async def _next(self, event_type_name: str, start: int) -> dict[str, Any]:
        return await self.wait_for(event_type_name, start=start)

    async def _stream(self, pcm16k: np.ndarray) -> None:
        """Appends 16 kHz audio as PCM16 at 24 kHz, ``CHUNK_MS`` per event, paced at real time: each
        chunk leaves when its last sample would have been captured, as from a microphone."""
        pcm24 = soxr.resample(pcm16k, SPEECH_RATE, VOICE_RATE) if pcm16k.size else pcm16k
        samples = (np.clip(pcm24, -1.0, 1.0) * 32767).astype("<i2")
        step = CHUNK_MS * VOICE_RATE // 1000
        loop = asyncio.get_running_loop()
        started = loop.time()
        for offset in range(0, samples.size, step):
            end = min(offset + step, samples.size)
            await asyncio.sleep(max(0.0, started + end / VOICE_RATE - loop.time()))
            audio = base64.b64encode(samples[offset:end].tobytes()).decode("ascii")
            await self.send(InputAudioBufferAppendEvent(type="input_audio_buffer.append", audio=audio).model_dump())

    def _answer_audio(self, response_id: str, first_event: int) -> tuple[np.ndarray, int, float | None]:
        """The response's audio as float32 mono, its rate, and when its first delta arrived."""
        chunks: list[bytes] = []
        first_at: float | None = None
        for event, at in zip(self.events[first_event:], self.arrived_at[first_event:], strict=True):
            if event.get("type") == _DELTA and event.get("response_id") == response_id:
                chunks.append(base64.b64decode(event["delta"]))
                first_at = at if first_at is None else first_at
        data = b"".join(chunks)
        if self._output_format in g711.G711_FORMATS:
            return g711.decode(data, self._output_format), g711.G711_RATE, first_at
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0, VOICE_RATE, first_at
