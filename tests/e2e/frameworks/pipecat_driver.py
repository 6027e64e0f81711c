"""pipecat (pipecat-ai 1.14.0) against omni-rtc: ``OpenAIRealtimeLLMService(base_url=…)`` with its
defaults (its session sends no turn detection: the server's decides, and OpenAI's default
``interrupt_response: true`` is what pipecat relies on), a function registered with it, in a
pipeline as pipecat's realtime examples build it: transport input → user context aggregator →
the service → transport output → assistant context aggregator. The transport is a microphone
(16 kHz, 10 ms frames; pipecat resamples to the session's 24 kHz) and a virtual speaker that
plays in real time, so pipecat's own barge-in (its truncate at the user's speech) runs as with a
real one.

Run in the frameworks' environment: ``.venv-frameworks/bin/python pipecat_driver.py BASE_URL``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import ErrorFrame, Frame, InputAudioRawFrame, OutputAudioRawFrame, StartFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import WorkerRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime import events as realtime_events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenario import TOOL, TOOL_RESULT, Microphone, Record, main, run_scenario  # noqa: E402

MICROPHONE_RATE = 16_000
SPEAKER_RATE = 24_000


class MicrophoneInput(BaseInputTransport):
    """The pipeline's input: the frames the scenario's microphone sends."""

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def push(self, pcm: bytes) -> None:
        await self.push_audio_frame(InputAudioRawFrame(audio=pcm, sample_rate=MICROPHONE_RATE, num_channels=1))


class VirtualSpeaker(BaseOutputTransport):
    """The pipeline's output: plays each audio frame in real time (nothing comes out)."""

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        await asyncio.sleep(len(frame.audio) / 2 / frame.sample_rate)
        return True


class ErrorsSeen(FrameProcessor):
    """Keeps the pipeline's error frames (pipecat's own view of what failed)."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self._record = record

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            self._record.add("framework_errors", frame.error)
        await self.push_frame(frame, direction)


def record_server_events(record: Record) -> None:
    """Every server event pipecat's service parses passes through the record first."""
    parse = realtime_events.parse_server_event

    def recording(message: str) -> object:
        record.server_event(json.loads(message))
        return parse(message)

    realtime_events.parse_server_event = recording


async def run(base_url: str, record: Record) -> None:
    record_server_events(record)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")

    async def get_weather(params: FunctionCallParams) -> None:
        record.add("tool_calls", {"name": params.function_name, "arguments": dict(params.arguments)})
        await params.result_callback(TOOL_RESULT)

    tools = ToolsSchema(standard_tools=[FunctionSchema(
        name=TOOL["name"], description=TOOL["description"],
        properties=TOOL["parameters"]["properties"], required=TOOL["parameters"]["required"],
    )])
    # The tools in the session's properties, as pipecat's realtime example has them: its first
    # session.update carries them (the context's own reach the session only once it is set up).
    llm = OpenAIRealtimeLLMService(
        api_key="sk-unused", base_url=base_url.replace("http", "ws", 1) + "/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(session_properties=realtime_events.SessionProperties(tools=tools)),
    )
    llm.register_function("get_weather", get_weather)
    context = LLMContext()
    aggregators = LLMContextAggregatorPair(context)
    params = TransportParams(audio_in_enabled=True, audio_in_sample_rate=MICROPHONE_RATE,
                             audio_out_enabled=True, audio_out_sample_rate=SPEAKER_RATE)
    microphone_input, speaker = MicrophoneInput(params), VirtualSpeaker(params)
    pipeline = Pipeline([microphone_input, aggregators.user(), llm, speaker, aggregators.assistant(), ErrorsSeen(record)])
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=MICROPHONE_RATE,
                                                            audio_out_sample_rate=SPEAKER_RATE))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    microphone = Microphone(MICROPHONE_RATE, microphone_input.push)
    try:
        await record.until(lambda: record.of_type("session.updated"), "session.updated")
        microphone.start()
        await run_scenario(record, microphone)
    finally:
        await microphone.close()
        await worker.cancel()
        await asyncio.gather(running, return_exceptions=True)
    record.data["chat"] = [
        {"role": message.get("role"), "content": message.get("content")}
        for message in context.get_messages() if isinstance(message, dict)
    ]


if __name__ == "__main__":
    main("pipecat-ai", run)
