"""LiveKit Agents (livekit-agents and livekit-plugins-openai 1.8.9) against omni-rtc: an
``AgentSession`` with ``openai.realtime.RealtimeModel(base_url=…)``, its defaults (semantic_vad,
server-side interruptions, input transcription), an ``Agent`` with a function tool that LiveKit
runs, and no room: the session's audio input is the microphone (10 ms frames, LiveKit's native
size) and its output a virtual speaker that plays in real time, so LiveKit's own interruption
logic (what was played, the truncate it sends) runs as in a room.

Run in the frameworks' environment: ``.venv-frameworks/bin/python livekit_driver.py BASE_URL``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from livekit import rtc
from livekit.agents import Agent, AgentSession, function_tool
from livekit.agents.voice import io
from livekit.plugins import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenario import FRAME_MS, TOOL_RESULT, Microphone, Record, main, run_scenario  # noqa: E402

RATE = 24_000


class MicrophoneInput(io.AudioInput):
    """The session's audio input: the frames the scenario's microphone sends."""

    def __init__(self) -> None:
        super().__init__(label="microphone")
        self._frames: asyncio.Queue[rtc.AudioFrame] = asyncio.Queue()

    def push(self, pcm: bytes) -> None:
        self._frames.put_nowait(rtc.AudioFrame(pcm, RATE, 1, RATE * FRAME_MS // 1000))

    async def __anext__(self) -> rtc.AudioFrame:
        return await self._frames.get()


class VirtualSpeaker(io.AudioOutput):
    """Plays what it is given in real time (nothing comes out): a segment ends when its audio has
    had its duration, or at ``clear_buffer`` (LiveKit's interruption) with what had played."""

    def __init__(self) -> None:
        super().__init__(label="speaker", capabilities=io.AudioOutputCapabilities(pause=False), sample_rate=RATE)
        self._pushed = 0.0
        self._started_at = 0.0
        self._cleared = asyncio.Event()
        self._playout: asyncio.Task[None] | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._pushed:
            self._started_at = time.monotonic()
            self.on_playback_started(created_at=time.time())
        self._pushed += frame.duration

    def flush(self) -> None:
        super().flush()
        if self._pushed:
            self._cleared.clear()
            self._playout = asyncio.create_task(self._play_out(self._pushed))

    def clear_buffer(self) -> None:
        self._cleared.set()

    async def _play_out(self, duration: float) -> None:
        remaining = self._started_at + duration - time.monotonic()
        try:
            await asyncio.wait_for(self._cleared.wait(), max(0.0, remaining))
            played, interrupted = min(time.monotonic() - self._started_at, duration), True
        except TimeoutError:
            played, interrupted = duration, False
        self._pushed = 0.0
        self.on_playback_finished(playback_position=played, interrupted=interrupted)


async def run(base_url: str, record: Record) -> None:

    @function_tool
    async def get_weather(city: str) -> dict[str, Any]:
        """The weather forecast for a city."""
        record.add("tool_calls", {"name": "get_weather", "arguments": {"city": city}})
        return TOOL_RESULT

    class RecordedModel(openai.realtime.RealtimeModel):
        """The plugin's model; each session it opens reports the server's events to the record."""

        def session(self, **kwargs: Any) -> Any:
            opened = super().session(**kwargs)
            opened.on("openai_server_event_received", record.server_event)
            return opened

    async with aiohttp.ClientSession() as http:
        model = RecordedModel(base_url=base_url + "/v1", api_key="sk-unused", http_session=http)
        session = AgentSession(llm=model)
        microphone_input, speaker = MicrophoneInput(), VirtualSpeaker()
        session.input.audio = microphone_input
        session.output.audio = speaker
        session.on("error", lambda event: record.add("framework_errors", repr(event.error)))
        session.on("conversation_item_added", lambda event: record.add("chat", _said(event.item)))
        await session.start(agent=Agent(instructions="You are a helpful voice assistant.", tools=[get_weather]))
        microphone = Microphone(RATE, microphone_input.push)
        microphone.start()
        try:
            await record.until(lambda: record.of_type("session.updated"), "session.updated")
            await run_scenario(record, microphone)
        finally:
            await microphone.close()
            await session.aclose()


def _said(item: Any) -> dict[str, Any]:
    """A chat item as LiveKit's app sees it."""
    return {"role": getattr(item, "role", None), "text": getattr(item, "text_content", None),
            "interrupted": getattr(item, "interrupted", None)}


if __name__ == "__main__":
    main("livekit-agents", run)
