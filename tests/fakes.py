"""Stand-ins for the model, the VAD model and the speaker, to drive a RealtimeSession without them.

Used by the session tests and by any test that needs a whole server without a checkpoint:
- ``ScriptedEngine``: an ``Engine`` that answers every turn with a scripted reply, one text
  delta and one 80 ms audio chunk per word, and records the requests it got.
- ``EnergyVad``: a ``SileroVad`` stand-in whose "speech probability" is 1 for loud windows
  and 0 for quiet ones, so a test can write speech as a tone and silence as zeros.
- ``VirtualAudioOutput``: an ``AudioOutput`` that plays only when told (``play()``), with the
  listener calls of ``media.outbound.OutboundAudioTrack``.
- ``SessionHarness``: a ``RealtimeSession`` wired to those, recording every server event.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from app.realtime.protocol import server_event_adapter
from app.realtime.session import RealtimeSession
from app.realtime.session_config import SessionConfig
from media.rates import VOICE_RATE
from pipeline.turn import (
    AudioChunk,
    Engine,
    TextDelta,
    TurnDone,
    TurnEvent,
    TurnRequest,
    TurnTimings,
    Usage,
)

CODEC_FRAME_SAMPLES = 1920  # one 80 ms Code2Wav frame at 24 kHz
INPUT_CHUNK_SAMPLES = 320  # 20 ms at 16 kHz: what the inbound WebRTC track delivers


class ScriptedEngine:
    """Answers ``reply`` word by word: TextDelta, then one codec frame of audio, per word."""

    name = "scripted-engine"

    def __init__(self, reply: str = "Hello there, how can I help you today?") -> None:
        self.reply = reply
        self.requests: list[TurnRequest] = []
        self.cancelled_turns = 0
        # When set, each turn waits on it after its first word (a long answer being generated).
        self.hold: asyncio.Event | None = None
        # Raised by the next turn after its first word (then cleared).
        self.fail_next: Exception | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run_turn(self, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        self.requests.append(request)
        words = [word + " " for word in self.reply.split(" ")]
        words[-1] = words[-1].rstrip()
        finish_reason = "stop"
        if request.max_output_tokens is not None and len(words) > request.max_output_tokens:
            words, finish_reason = words[: request.max_output_tokens], "length"
        try:
            for index, word in enumerate(words):
                yield TextDelta(word)
                if request.output_audio:
                    # A quiet ramp, so that tests can tell the samples apart.
                    yield AudioChunk(np.linspace(0.0, 0.1, CODEC_FRAME_SAMPLES, dtype=np.float32))
                if index == 0:
                    if self.fail_next is not None:
                        failure, self.fail_next = self.fail_next, None
                        raise failure
                    if self.hold is not None:
                        await self.hold.wait()
                await asyncio.sleep(0)  # let the session's other work run, as a real engine would
            audio_frames = len(words) if request.output_audio else 0
            yield TurnDone(
                text="".join(words),
                usage=Usage(
                    input_text_tokens=10 * len(request.conversation.items) + 20,
                    input_audio_tokens=0,
                    output_text_tokens=len(words),
                    output_audio_tokens=audio_frames,
                ),
                finish_reason=finish_reason,  # type: ignore[arg-type]
                timings=TurnTimings(queue_wait=0.0, first_text=0.001, first_audio=0.002, total=0.003),
            )
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled_turns += 1
            raise


class _EnergyStream:
    def __init__(self, level: float) -> None:
        self._level = level

    def probability(self, window: np.ndarray) -> float:
        return 1.0 if float(np.sqrt(np.mean(np.square(window)))) > self._level else 0.0

    def reset(self) -> None:
        return None


class EnergyVad:
    """A ``SileroVad`` stand-in: windows louder than ``level`` (RMS) are speech."""

    def __init__(self, level: float = 0.01) -> None:
        self._level = level

    def new_stream(self) -> _EnergyStream:
        return _EnergyStream(self._level)


class VirtualAudioOutput:
    """An ``AudioOutput`` that plays queued audio only when ``play()`` says so."""

    def __init__(self) -> None:
        self._queue: deque[np.ndarray] = deque()
        self._listener: Any = None
        self._playing = False
        self.played_samples = 0
        self.played: list[np.ndarray] = []  # what was "heard", in order

    @property
    def queued_samples(self) -> int:
        return sum(chunk.size for chunk in self._queue)

    def set_listener(self, listener: Any) -> None:
        self._listener = listener

    def write(self, pcm: np.ndarray) -> None:
        if pcm.dtype != np.float32 or pcm.ndim != 1:
            raise ValueError(f"expected 1-D float32 24 kHz PCM, got {pcm.dtype} {pcm.shape}")
        self._queue.append(pcm)

    def clear(self) -> None:
        self._queue.clear()
        if self._playing:
            self._playing = False
            self._listener.on_playback_stopped()

    def play(self, samples: int | None = None) -> int:
        """Play up to ``samples`` (everything queued when None); returns how many were played.

        Calls ``on_playback_started`` when audio starts after idle and ``on_playback_stopped``
        when the queue runs dry, like the real track.
        """
        budget = self.queued_samples if samples is None else samples
        played = 0
        if budget > 0 and self._queue and not self._playing:
            self._playing = True
            self._listener.on_playback_started()
        while budget > 0 and self._queue:
            chunk = self._queue.popleft()
            take = min(budget, chunk.size)
            self.played.append(chunk[:take])
            if take < chunk.size:
                self._queue.appendleft(chunk[take:])
            budget -= take
            played += take
            self.played_samples += take
        if self._playing and not self._queue:
            self._playing = False
            self._listener.on_playback_stopped()
        return played

    def play_seconds(self, seconds: float) -> int:
        return self.play(int(seconds * VOICE_RATE))


class SessionHarness:
    """A RealtimeSession with a ``VirtualAudioOutput``, keeping every server event it sends.

    Each event is checked on the way: JSON-ready, and a known server event with its fields.
    """

    def __init__(self, engine: Engine, vad: Any = None, config: SessionConfig | None = None) -> None:
        self.engine = engine
        self.output = VirtualAudioOutput()
        self.events: list[dict[str, Any]] = []
        self._new_event = asyncio.Event()
        self.session = RealtimeSession(
            engine=engine, vad=vad if vad is not None else EnergyVad(), output=self.output, send=self._record,
            config=config,
        )

    def _record(self, event: dict[str, Any]) -> None:
        json.dumps(event)
        server_event_adapter.validate_python(event)
        self.events.append(event)
        self._new_event.set()

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == event_type]

    def last(self, event_type: str) -> dict[str, Any]:
        return self.of_type(event_type)[-1]

    def push(self, pcm: np.ndarray) -> None:
        """16 kHz input, in the 20 ms pieces a WebRTC track delivers."""
        for start in range(0, pcm.size, INPUT_CHUNK_SAMPLES):
            self.session.push_audio(pcm[start : start + INPUT_CHUNK_SAMPLES])

    async def send(self, **event: Any) -> None:
        await self.session.handle_message(json.dumps(event))

    async def until(self, event_type: str, count: int = 1, *, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait until ``count`` events of ``event_type`` were sent; returns the ``count``-th."""
        async with asyncio.timeout(timeout_s):  # a guard against hangs, not a speed limit
            while len(self.of_type(event_type)) < count:
                self._new_event.clear()
                await self._new_event.wait()
        await asyncio.sleep(0)  # let done-callbacks of finished tasks run
        return self.of_type(event_type)[count - 1]

    async def turn_done(self, count: int = 1, *, timeout_s: float = 10.0) -> dict[str, Any]:
        """Wait for the ``count``-th ``response.done``, then play out all queued audio."""
        done = await self.until("response.done", count, timeout_s=timeout_s)
        self.output.play()
        return done
