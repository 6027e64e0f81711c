"""Stand-ins for the model, the VAD model and the speaker, to drive a RealtimeSession without them.

Used by the session tests and by any test that needs a whole server without a checkpoint:
- ``ScriptedEngine``: an ``Engine`` that answers every turn with a scripted reply, one text
  delta (one "Thinker token") and one 80 ms codec frame of audio per word, counting frames
  and voiced tokens as ``AudioChunk`` does (transcription turns: ``transcript``, text only, or
  what a function of the clip says), and records the requests it got. It keeps the preemptible-turn rules of ``pipeline.contract``
  with a batch of ``max_batch`` turns (None: room for any number).
- ``EnergyVad``: a ``SileroVad`` stand-in whose "speech probability" is 1 for loud windows
  and 0 for quiet ones, so a test can write speech as a tone and silence as zeros.
- ``VirtualAudioOutput``: an ``AudioOutput`` that plays only when told (``play()``), with the
  listener calls of ``media.outbound.OutboundAudioTrack``.
- ``SessionHarness``: a ``RealtimeSession`` wired to those, recording every server event.
- ``SocketSessionHarness``: the same as the WebSocket carries it (``EventAudioOutput``).
- ``RecordingWriter``: a ``StreamWriter`` stand-in for the workers' IPC that keeps what is written.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Literal, Self

import numpy as np

from app.realtime.protocol import server_event_adapter
from app.realtime.session import RealtimeSession
from app.realtime.session_config import SessionConfig, TurnDetection
from app.realtime.shares import ClientShares
from app.realtime.turn_report import SessionObserver
from app.transports.websocket.event_audio import EventAudioOutput
from media.rates import SPEECH_RATE, VOICE_RATE
from pipeline.contract import (
    AudioChunk,
    Engine,
    EngineCapabilities,
    EngineError,
    EngineHealth,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    GenerationTimings,
    TextDelta,
    Usage,
)
from pipeline.conversation import UserAudio, UserImage

# Server VAD without barge-in: the user's speech over an answer is heard but not acted on. Tests
# of half-duplex say so, since a session's default is OpenAI's interrupt_response: true.
HALF_DUPLEX = SessionConfig(turn_detection=TurnDetection(interrupt_response=False))
# A steady tone longer than 8 s is the room's own level (media.speech_level's background rule),
# not speech standing out of it: tests that hold one that long as "speech" take that rule off.
STEADY_TONE_SPEECH = SessionConfig(turn_detection=TurnDetection(speech_over_background_db=None))
HALF_DUPLEX_STEADY_TONE = SessionConfig(turn_detection=TurnDetection(interrupt_response=False,
                                                                    speech_over_background_db=None))
# What the in-process engine can do: the stand-ins' default (a test turns one off to see it refused).
FULL_CAPABILITIES = EngineCapabilities(function_calls=True, forced_function_calls=True, end_of_turn_scores=True, images=True,
                                       preemptible_generations=True)

CODEC_FRAME_SAMPLES = 1920  # one 80 ms Code2Wav frame at 24 kHz
INPUT_CHUNK_SAMPLES = 320  # 20 ms at 16 kHz: what the inbound WebRTC track delivers
AUDIO_TOKENS_PER_SECOND = 12.5  # Qwen3-Omni's audio encoder: one token per 80 ms of input


class ScriptedEngine:
    """Answers ``reply`` word by word: TextDelta, then one codec frame of audio, per word.

    Each word is one Thinker token with one frame of audio: the audio speaks the text evenly.
    ``text_first`` streams the whole text before any
    audio (a Thinker far ahead of its audio), then the audio in chunks of
    ``frames_per_chunk`` frames, ``chunk_interval_s`` apart (a decoder that keeps just up
    with playback). ``waveform="tone"`` makes every frame clearly audible after Opus.
    ``capabilities``: what it declares it can do (it answers whatever it is asked).
    """

    name = "scripted-engine"

    def __init__(
        self,
        reply: str = "Hello there, how can I help you today?",
        *,
        transcript: str | Callable[[UserAudio], str] = "What is the weather like?",
        text_first: bool = False,
        frames_per_chunk: int = 1,
        chunk_interval_s: float = 0.0,
        waveform: Literal["ramp", "tone"] = "ramp",
        capabilities: EngineCapabilities = FULL_CAPABILITIES,
    ) -> None:
        self.reply = reply
        self.capabilities = capabilities
        self.transcript = transcript  # what every transcription turn "hears" (text only), or of each clip
        self.text_first = text_first
        self.frames_per_chunk = frames_per_chunk
        self.chunk_interval_s = chunk_interval_s
        self.waveform = waveform
        self.requests: list[GenerationRequest] = []
        self.cancelled_turns = 0
        # When set, each turn waits on it after its first word (a long answer being generated).
        self.hold: asyncio.Event | None = None
        # When set, each transcription turn waits on it after its first word (answers do not).
        self.hold_transcriptions: asyncio.Event | None = None
        # Raised by the next turn after its first word (then cleared).
        self.fail_next: Exception | None = None
        self.max_batch: int | None = None  # turns at once; a preemptible one needs a free slot
        self.running: dict[int, GenerationRequest] = {}  # by turn number, oldest first
        self.preemptible: dict[int, asyncio.Event] = {}  # running preemptible turns: set to preempt
        self.promoted: list[str] = []  # preemptible ids promoted, in order
        self._turns = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def health(self) -> EngineHealth:
        return EngineHealth(alive=True)

    def frame(self) -> np.ndarray:
        if self.waveform == "tone":  # 250 Hz at -10 dBFS: 20 whole periods per frame
            return (0.3 * np.sin(2 * np.pi * 250 * np.arange(CODEC_FRAME_SAMPLES) / VOICE_RATE)).astype(np.float32)
        # A quiet ramp, so that tests can tell the samples apart.
        return np.linspace(0.0, 0.1, CODEC_FRAME_SAMPLES, dtype=np.float32)

    def used_requests(self) -> list[GenerationRequest]:
        """The requests whose turns were used: ordinary ones, and preemptible ones once promoted
        (a speculative answer thrown away is in ``requests`` only)."""
        return [request for request in self.requests
                if request.preemptible_id is None or request.preemptible_id in self.promoted]

    async def promote(self, preemptible_id: str) -> bool:
        self.promoted.append(preemptible_id)
        for turn, running in self.running.items():
            if running.preemptible_id == preemptible_id and turn in self.preemptible:
                if self.preemptible[turn].is_set():
                    return False
                del self.preemptible[turn]
                return True
        return False

    def _admit(self, request: GenerationRequest) -> int:
        full = self.max_batch is not None and len(self.running) >= self.max_batch
        if request.preemptible_id is not None and full:
            raise EngineError("no spare capacity", code="no_spare_capacity")
        if full:
            victims = [turn for turn, preempt in self.preemptible.items() if not preempt.is_set()]
            if victims:
                self.preemptible[victims[-1]].set()
        self._turns += 1
        self.running[self._turns] = request
        if request.preemptible_id is not None:
            self.preemptible[self._turns] = asyncio.Event()
        return self._turns

    async def _pause(self, turn: int, until: asyncio.Event | None = None) -> None:
        """A decoding step (or a wait on ``until``) that a preemption interrupts."""
        preempt = self.preemptible.get(turn)
        if until is None:
            await asyncio.sleep(0)
        elif preempt is None:
            await until.wait()
        else:
            waits = {asyncio.ensure_future(until.wait()), asyncio.ensure_future(preempt.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        if preempt is not None and preempt.is_set():
            raise EngineError("preempted", code="preempted")

    async def run_generation(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        self.requests.append(request)
        turn = self._admit(request)
        try:
            async with contextlib.aclosing(self._answer(request, turn)) as events:
                async for event in events:
                    yield event
        finally:
            del self.running[turn]
            self.preemptible.pop(turn, None)

    async def _answer(self, request: GenerationRequest, turn: int) -> AsyncGenerator[GenerationEvent, None]:
        said = self.reply
        if request.task == "transcribe":
            said = self.transcript if isinstance(self.transcript, str) else self.transcript(_the_clip(request))
        words = [word + " " for word in said.split(" ")]
        words[-1] = words[-1].rstrip()
        finish_reason = "stop"
        if request.max_output_tokens is not None and len(words) > request.max_output_tokens:
            words, finish_reason = words[: request.max_output_tokens], "length"

        def chunk(count: int) -> AudioChunk:
            pcm = np.concatenate([self.frame() for _ in range(count)])
            return AudioChunk(pcm, frames=count)

        try:
            for index, word in enumerate(words):
                yield TextDelta(word)
                if request.output_audio and not self.text_first:
                    yield chunk(1)
                if index == 0:
                    if self.fail_next is not None:
                        failure, self.fail_next = self.fail_next, None
                        raise failure
                    if self.hold is not None and not self.text_first:
                        await self._pause(turn, self.hold)
                    if self.hold_transcriptions is not None and request.task == "transcribe":
                        await self._pause(turn, self.hold_transcriptions)
                await self._pause(turn)  # let the session's other work run, as a real engine would
            if request.output_audio and self.text_first:
                for start in range(0, len(words), self.frames_per_chunk):
                    yield chunk(min(self.frames_per_chunk, len(words) - start))
                    if start == 0 and self.hold is not None:
                        await self._pause(turn, self.hold)
                    await asyncio.sleep(self.chunk_interval_s)
            audio_frames = len(words) if request.output_audio else 0
            yield GenerationDone(
                text="".join(words),
                usage=Usage(
                    input_text_tokens=10 * len(request.conversation.items) + 20,
                    input_audio_tokens=audio_tokens(request),
                    output_text_tokens=len(words),
                    output_audio_tokens=audio_frames,
                    input_image_tokens=sum(
                        item.tokens for item in request.conversation.items if isinstance(item, UserImage)
                    ),
                ),
                finish_reason=finish_reason,  # type: ignore[arg-type]
                timings=GenerationTimings(queue_wait=0.0, first_text=0.001, first_audio=0.002, total=0.003),
            )
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled_turns += 1
            raise


def _the_clip(request: GenerationRequest) -> UserAudio:
    clip = request.conversation.items[-1]
    assert isinstance(clip, UserAudio), "a transcription turn transcribes one clip"
    return clip


def audio_tokens(request: GenerationRequest) -> int:
    """The fake's audio encoder: 12.5 tokens per second of user audio (Qwen3-Omni's rate), per clip."""
    return sum(
        int(len(item.pcm) / SPEECH_RATE * AUDIO_TOKENS_PER_SECOND)
        for item in request.conversation.items
        if isinstance(item, UserAudio)
    )


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

    paced = False
    playback_reports = None

    def __init__(self) -> None:
        self._queue: deque[np.ndarray] = deque()
        self._listener: Any = None
        self._playing = False
        self.played_samples = 0
        self.played: list[np.ndarray] = []  # what was "heard", in order
        self.paused = False  # play() plays nothing while paused, like the real track

    @property
    def queued_samples(self) -> int:
        return sum(chunk.size for chunk in self._queue)

    def set_listener(self, listener: Any) -> None:
        self._listener = listener

    def write(self, pcm: np.ndarray) -> None:
        if pcm.dtype != np.float32 or pcm.ndim != 1:
            raise ValueError(f"expected 1-D float32 24 kHz PCM, got {pcm.dtype} {pcm.shape}")
        self._queue.append(pcm)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def clear(self) -> None:
        self.paused = False
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
        if self.paused:
            return 0
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

    def __init__(
        self,
        engine: Engine,
        vad: Any = None,
        config: SessionConfig | None = None,
        on_ignored_speech: Callable[[], None] | None = None,
        end_of_turn: Any = None,
        text_judge: Any = None,
        session_fields: Any = None,
        clock: Callable[[], float] = time.monotonic,
        observer: SessionObserver | None = None,
        client: str | None = None,
        client_shares: ClientShares | None = None,
    ) -> None:
        self.engine = engine
        self.output = VirtualAudioOutput()
        self.events: list[dict[str, Any]] = []
        self.speculations: list[tuple[str | None, float]] = []  # the session's on_speculation reports
        self.partials: list[tuple[str, float]] = []  # the session's on_partial_transcript reports
        self.engine_tokens: list[int] = []  # the session's on_engine_tokens report (at close)
        self.interruptions: list[str] = []  # the session's on_interruption reports
        self.share_refusals: list[tuple[str, str]] = []  # the session's on_share_refused reports: (limit, work)
        self._new_event = asyncio.Event()
        self.session = RealtimeSession(
            engine=engine, vad=vad if vad is not None else EnergyVad(), output=self.output, send=self._record,
            config=config, on_ignored_speech=on_ignored_speech, end_of_turn=end_of_turn, text_judge=text_judge,
            session_fields=session_fields,
            clock=clock,
            on_speculation=lambda outcome, seconds: self.speculations.append((outcome, seconds)),
            on_partial_transcript=lambda outcome, seconds: self.partials.append((outcome, seconds)),
            on_engine_tokens=self.engine_tokens.append,
            on_interruption=self.interruptions.append,
            on_share_refused=lambda limit, work: self.share_refusals.append((limit, work)),
            client=client, client_shares=client_shares,
            observer=observer,
        )

    async def __aenter__(self) -> Self:
        """The session started; leaving the ``async with`` closes it."""
        await self.session.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.session.close()

    def _record(self, event: dict[str, Any]) -> None:
        json.dumps(event)
        server_event_adapter.validate_python(event)
        self.events.append(event)
        self._new_event.set()

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    def outcomes(self) -> list[str]:
        """The speculations' outcomes reported so far, in order ("started", "used"...)."""
        return [outcome for outcome, _ in self.speculations if outcome is not None]

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


class SocketSessionHarness(SessionHarness):
    """A RealtimeSession as the WebSocket carries it: an ``EventAudioOutput`` sends the audio as
    delta events, and the events that describe a media track are not sent (``observe``)."""

    def __init__(self, engine: Engine, vad: Any = None, config: SessionConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.events = []
        self._new_event = asyncio.Event()
        self.output = EventAudioOutput(self._record)  # type: ignore[assignment]
        self.session = RealtimeSession(
            engine=engine, vad=vad if vad is not None else EnergyVad(), output=self.output, send=self._send,
            config=config, clock=clock,
        )

    def _send(self, event: dict[str, Any]) -> None:
        if self.output.observe(event):
            self._record(event)

    async def turn_done(self, count: int = 1, *, timeout_s: float = 10.0) -> dict[str, Any]:
        return await self.until("response.done", count, timeout_s=timeout_s)

    def answer_audio(self, response_id: str) -> bytes:
        """The decoded bytes of every audio delta of one response, in order."""
        return b"".join(
            base64.b64decode(event["delta"])
            for event in self.of_type("response.output_audio.delta")
            if event["response_id"] == response_id
        )


class RecordingWriter:
    """A ``StreamWriter`` stand-in that keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written += data

    @property
    def transport(self) -> RecordingWriter:
        return self

    def get_write_buffer_size(self) -> int:
        return 0  # everything written is read at once

    def abort(self) -> None:
        raise AssertionError("a writer whose bytes are all read is never aborted")
