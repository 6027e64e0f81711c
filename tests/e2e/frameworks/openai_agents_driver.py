"""The OpenAI Agents SDK for Python (openai-agents 0.24.0) against omni-rtc: ``RealtimeRunner``
with ``model_config={"url": …}``, its default session (semantic_vad, interrupt_response, input
transcription), a function tool it runs itself, and the microphone through ``session.send_audio``.

Run in the frameworks' environment: ``.venv-frameworks/bin/python openai_agents_driver.py BASE_URL``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenario import TOOL_RESULT, Microphone, Record, main, run_scenario  # noqa: E402


async def run(base_url: str, record: Record) -> None:

    @function_tool
    def get_weather(city: str) -> dict:
        """The weather forecast for a city."""
        record.add("tool_calls", {"name": "get_weather", "arguments": {"city": city}})
        return TOOL_RESULT

    agent = RealtimeAgent(name="Assistant", instructions="You are a helpful voice assistant.", tools=[get_weather])
    runner = RealtimeRunner(agent)
    url = base_url.replace("http", "ws", 1) + "/v1/realtime?model=gpt-realtime"
    session = await runner.run(model_config={"url": url, "api_key": "sk-unused"})
    async with session:
        microphone = Microphone(24_000, session.send_audio)  # pcm16 at 24 kHz: the SDK's default format

        async def listen() -> None:
            async for event in session:
                if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    record.server_event(event.data.data)
                elif event.type == "error":
                    record.add("framework_errors", repr(event.error))
                elif event.type == "audio_interrupted":
                    record.note("audio_interrupted", True)
                elif event.type == "history_updated":
                    record.note("history", [_item(item) for item in event.history])

        listening = asyncio.create_task(listen())
        microphone.start()
        try:
            await record.until(lambda: record.of_type("session.updated"), "session.updated")
            await run_scenario(record, microphone)
        finally:
            await microphone.close()
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)


def _item(item: object) -> dict:
    """The SDK's own history item, as the app sees it."""
    dump = item.model_dump(mode="json") if hasattr(item, "model_dump") else {"repr": repr(item)}
    return {key: dump.get(key) for key in ("type", "role", "status", "name", "content")}


if __name__ == "__main__":
    main("openai-agents", run)
