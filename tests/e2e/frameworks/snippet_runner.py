"""Runs a README snippet ("Use it from your framework") in the frameworks' environment, then
asks the object it made for one answer: the snippet is the documented way to point the
framework at omni-rtc, this is the least an app then does with it.

``.venv-frameworks/bin/python snippet_runner.py FRAMEWORK SNIPPET_FILE``: the snippet runs as
written (top-level ``await`` allowed, as in a notebook or an ``async def main``); it must leave
``llm`` (pipecat), ``session`` (LiveKit's ``AgentSession``) or ``session`` (the Agents SDK's
realtime session) behind. Prints ``{"transcript": …, "errors": [...]}``: the spoken answer's
transcript and the ``error`` events the framework received.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

ANSWER_TIMEOUT_S = 120.0  # against hangs only


async def pipecat_answer(namespace: dict[str, Any], errors: list[Any]) -> str:
    from pipecat.frames.frames import LLMRunFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import WorkerRunner
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.services.openai.realtime import events

    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    parse = events.parse_server_event

    def watching(message: str) -> object:
        event = json.loads(message)
        if event["type"] == "error":
            errors.append(event)
        elif event["type"] == "response.done" and not done.done():
            done.set_result(_transcript(event))
        return parse(message)

    events.parse_server_event = watching
    context = LLMContext(messages=[{"role": "user", "content": "Say hello."}])
    aggregators = LLMContextAggregatorPair(context)
    worker = PipelineWorker(Pipeline([aggregators.user(), namespace["llm"], aggregators.assistant()]))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await worker.queue_frames([LLMRunFrame()])
    try:
        return await asyncio.wait_for(done, ANSWER_TIMEOUT_S)
    finally:
        await worker.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def livekit_answer(namespace: dict[str, Any], errors: list[Any]) -> str:
    realtime = namespace["session"].llm.session()  # what an AgentSession opens on its model
    realtime.on("openai_server_event_received", lambda event: errors.append(event) if event["type"] == "error" else None)
    try:
        generation = await realtime.generate_reply(instructions="Say hello.")
        text = []
        async for message in generation.message_stream:
            async for delta in message.text_stream:
                text.append(str(delta))
        return "".join(text)
    finally:
        await realtime.aclose()


async def openai_agents_answer(namespace: dict[str, Any], errors: list[Any]) -> str:
    session = namespace["session"]
    async with session:
        await session.send_message("Say hello.")
        async for event in session:
            if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                server_event = event.data.data
                if server_event["type"] == "error":
                    errors.append(server_event)
                elif server_event["type"] == "response.done":
                    return _transcript(server_event)
    raise RuntimeError("the session ended without an answer")


def _transcript(done: dict[str, Any]) -> str:
    return "".join(part.get("transcript") or "" for item in done["response"]["output"]
                   if item["type"] == "message" for part in item["content"])


ANSWERS = {"pipecat": pipecat_answer, "livekit": livekit_answer, "openai-agents": openai_agents_answer}


async def run(framework: str, snippet: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    code = compile(snippet, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    made = eval(code, namespace)  # noqa: S307 - the README's own snippet, as a reader runs it
    if asyncio.iscoroutine(made):
        await made
    errors: list[Any] = []
    transcript = await asyncio.wait_for(ANSWERS[framework](namespace, errors), ANSWER_TIMEOUT_S)
    return {"transcript": transcript, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(sys.argv[1], Path(sys.argv[2]).read_text()))), flush=True)
