"""What every framework driver shares: the scripted conversation, a microphone, and the record.

The drivers run in the frameworks' environment (``.venv-frameworks``, ``make frameworks-venv``),
not the server's: this module imports only numpy, soundfile and soxr, which both have. Each
driver connects its framework to a real ``omni-rtc serve`` (dev model, ``--dev-replies
REPLIES``), says the espeak-ng fixtures into it in real time through a :class:`Microphone`, lets
the framework do what it does (its default session, its tool calls, its barge-in), keeps what it
saw in a :class:`Record`, and prints the record as one JSON line for the pytest that launched it
(``test_frameworks.py``).

The conversation, one response per scripted reply:

1. "What is the weather like today?" → ``REPLIES[0]``;
2. "My name is Sarah and I live in London." → ``REPLIES[1]``;
3. "What is the weather like today?" (another voice) → a call of ``get_weather``
   (``REPLIES[2]``), which the framework runs and answers → ``REPLIES[3]`` spoken;
4. "Can you tell me a joke?" → ``REPLIES[4]``, a long answer, and ``BARGE_IN_AFTER_S`` after its
   first audio the user talks over it ("Send a message to my brother."): the framework and the
   server cut it, and the barge-in is answered → ``REPLIES[5]``.

Every utterance is one sentence without a pause inside: LiveKit and the Agents SDK ask for
semantic_vad, which may take "Hello," (hello.wav's first word, then a comma's pause) for a whole
turn and answer it before the rest, which then barges in on that answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
import soxr

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOOL_CITY = "Paris"
TOOL_RESULT = {"city": TOOL_CITY, "forecast": "sunny", "celsius": 24}
LONG_REPLY = (
    "Once upon a time there was a little robot who lived in a quiet village by the sea, and every "
    "morning it walked along the beach to count the waves, greet the fishermen and collect the "
    "shells the night had left behind."
)
REPLIES = [
    "Hello, nice to meet you.",
    "It is sunny today.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + TOOL_CITY + '"}}\n</tool_call>',
    "It is sunny in Paris, twenty four degrees.",
    LONG_REPLY,
    "Sorry, go ahead.",
]
UTTERANCES = ["weather.wav", "turns/finished_04_awb110.wav", "turns/finished_00_slt100.wav", "turns/finished_02_rms115.wav"]
BARGE_IN_UTTERANCE = "turns/finished_11_slt100.wav"
BARGE_IN_AFTER_S = 0.8  # into the long answer's audio
FRAME_MS = 10  # LiveKit's and WebRTC's frame: 100 events a second
TOOL = {
    "name": "get_weather",
    "description": "The weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
AUDIO_RATE = 24_000  # every framework's output audio: PCM16 mono at 24 kHz
AFTER_THE_ANSWER_S = 0.3  # the user's pause between hearing the answer and talking
# Against hangs only: a dev-model turn takes a second or two on a busy CPU.
TURN_TIMEOUT_S = 90.0


def speech(name: str, rate: int) -> bytes:
    """A fixture as PCM16 mono at ``rate``."""
    audio, source_rate = soundfile.read(FIXTURES / name, dtype="float32")
    if source_rate != rate:
        audio = soxr.resample(audio, source_rate, rate)
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()


class Microphone:
    """Sends ``FRAME_MS`` frames of PCM16 at ``rate`` in real time, paced by the clock: the
    utterances it is given, silence between them, as a microphone streams."""

    def __init__(self, rate: int, send: Callable[[bytes], Awaitable[None] | None]) -> None:
        self.rate = rate
        self._send = send
        self._frame_bytes = rate * FRAME_MS // 1000 * 2
        self._queue: list[tuple[bytes, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self.frames_sent = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="microphone")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def say(self, name: str) -> None:
        """Says the fixture ``name``; returns when its last frame has been sent."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((speech(name, self.rate), done))
        await done

    async def _run(self) -> None:
        silence = bytes(self._frame_bytes)
        start = time.monotonic()
        pending = b""
        finishing: asyncio.Future[None] | None = None
        while True:
            if not pending and self._queue:
                pending, finishing = self._queue.pop(0)
            frame, pending = (pending[: self._frame_bytes], pending[self._frame_bytes:]) if pending else (silence, b"")
            frame = frame.ljust(self._frame_bytes, b"\0")
            result = self._send(frame)
            if result is not None:
                await result
            self.frames_sent += 1
            if not pending and finishing is not None:
                finishing.set_result(None)
                finishing = None
            await asyncio.sleep(max(0.0, start + self.frames_sent * FRAME_MS / 1000 - time.monotonic()))


def audio_deltas(server_events: list[dict[str, Any]], response_id: str) -> list[dict[str, Any]]:
    """The response's audio deltas as a :class:`Record` keeps them (each one's base64 length)."""
    return [event for event in server_events
            if event.get("type") in ("response.output_audio.delta", "response.audio.delta")
            and event.get("response_id") == response_id]


def audio_ms(deltas: list[dict[str, Any]]) -> int:
    """The audio those deltas carry, in ms: base64 of PCM16 mono at ``AUDIO_RATE``."""
    return sum(event["delta"] * 3 // 4 for event in deltas) * 1000 // (2 * AUDIO_RATE)


class Record:
    """What a driver saw: the server's events as its framework received them, and its own notes."""

    def __init__(self, framework: str, version: str) -> None:
        self.data: dict[str, Any] = {
            "framework": framework, "version": version, "server_events": [], "tool_calls": [],
            "framework_errors": [], "transcripts": [], "chat": [], "notes": {},
        }
        self._changed = asyncio.Event()

    def server_event(self, event: dict[str, Any]) -> None:
        if event.get("type") in ("response.output_audio.delta", "response.audio.delta"):
            # The size, not the audio; and when it came, for the time the answer takes to hear.
            event = {**event, "delta": len(event.get("delta") or ""), "received_at": time.monotonic()}
        self.data["server_events"].append(event)
        self._changed.set()

    def note(self, key: str, value: Any) -> None:
        self.data["notes"][key] = value
        self._changed.set()

    def add(self, key: str, value: Any) -> None:
        self.data[key].append(value)
        self._changed.set()

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [event for event in self.data["server_events"] if event.get("type") == event_type]

    async def until(self, ready: Callable[[], Any], what: str, timeout_s: float = TURN_TIMEOUT_S) -> Any:
        """Waits until ``ready()`` is truthy, and returns it."""
        try:
            async with asyncio.timeout(timeout_s):
                while not (result := ready()):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}") from None
        return result

    async def responses_done(self, count: int) -> list[dict[str, Any]]:
        return await self.until(lambda: len(done := self.of_type("response.done")) >= count and done,
                                f"response.done #{count}")

    async def answer_heard(self, count: int) -> None:
        """Until response #``count`` is done and its audio has been heard: a person answers what
        they heard, not the server's ``response.done``, which a speculative answer sends a few
        milliseconds after the commit. (LiveKit also replaces the microphone by silence for its
        first 3 s of an agent's speech, its AEC warm-up: words said then are never sent.)"""
        response_id = (await self.responses_done(count))[count - 1]["response"]["id"]
        deltas = audio_deltas(self.data["server_events"], response_id)
        if deltas:
            audio_s = audio_ms(deltas) / 1000
            first_heard = min(event["received_at"] for event in deltas)
            await asyncio.sleep(max(0.0, first_heard + audio_s + AFTER_THE_ANSWER_S - time.monotonic()))

    def print(self) -> None:
        print(json.dumps(self.data), flush=True)


async def run_scenario(record: Record, microphone: Microphone, *, tool_answered: Callable[[], Any] | None = None) -> None:
    """The conversation of the module docstring; the framework answers the tool call itself."""
    await microphone.say(UTTERANCES[0])
    await record.answer_heard(1)
    await microphone.say(UTTERANCES[1])
    await record.answer_heard(2)
    await microphone.say(UTTERANCES[2])
    await record.answer_heard(4)  # the call, then the answer that used its output
    await microphone.say(UTTERANCES[3])
    long_id = (await record.until(lambda: len(record.of_type("response.created")) >= 5 and
                                  record.of_type("response.created")[4], "the long answer"))["response"]["id"]
    await record.until(lambda: any(e.get("response_id") == long_id for e in record.of_type("response.output_audio.delta")),
                       "the long answer's audio")
    await asyncio.sleep(BARGE_IN_AFTER_S)
    record.note("barge_in_at", time.time())
    await microphone.say(BARGE_IN_UTTERANCE)
    await record.responses_done(6)
    await asyncio.sleep(1.0)  # late events of the last answer (truncations, transcripts)


def main(framework: str, run: Callable[[str, Record], Awaitable[None]]) -> None:
    """``python <driver> BASE_URL``: runs the driver and prints its record, with what stopped it
    if it failed (then the exit status is 1)."""
    from importlib.metadata import version

    record = Record(framework, version(framework))
    try:
        asyncio.run(run(sys.argv[1], record))
    except BaseException:
        record.data["driver_error"] = traceback.format_exc()
        record.print()
        raise SystemExit(1) from None
    record.data["transcripts"] = [
        part.get("transcript")
        for done in record.of_type("response.done") for item in done["response"]["output"]
        if item["type"] == "message" for part in item["content"]
    ]
    record.print()
