"""Function calling end to end: the real server, the dev model made to call a tool
(``omni-rtc serve --dev-replies``), and three clients that run the tool and get the answer that
uses it: the OpenAI Agents JS SDK in Chromium over WebRTC, openai-python over the WebSocket, and
the page in static/.

Every session of the server takes the same two replies: first a call of ``get_local_time``,
then the spoken answer; both go through the real tokenizer, Thinker (forced), Talker and Code2Wav.
One server and one Chromium serve the module.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from playwright.async_api import Browser, Page, Route, async_playwright
from pydantic import TypeAdapter

from pipeline.local.tokenizer import load_tokenizer
from tests.e2e.browser_chromium import Silence, launch_chromium, write_fake_microphone
from tests.e2e.conftest import running_server, wait_for_sessions

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

SDK_DIR = Path(__file__).resolve().parent / "sdk"
TEST_OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
SDK_BUNDLE = SDK_DIR / "node_modules" / "@openai" / "agents-realtime" / "dist" / "bundle"
CALL_ARGUMENTS = {"timezone": "Europe/Paris"}
ANSWER = "It is noon in Paris."
REPLIES = [
    '<tool_call>\n{"name": "get_local_time", "arguments": ' + json.dumps(CALL_ARGUMENTS) + "}\n</tool_call>",
    ANSWER,
]
QUESTION = "What time is it in Paris?"
SDK_SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
# Against hangs only: a dev-model turn takes a second or two on a busy CPU.
DEADLINE_MS = 120_000


@pytest.fixture(scope="module")
def tools_server(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("tools-server")
    replies = directory / "replies.json"
    replies.write_text(json.dumps(REPLIES))
    # One process: the media worker pool is tested elsewhere, and every process costs start-up.
    with running_server(dev_model_dir, directory, "--dev-replies", str(replies), "--media-workers", "1") as url:
        yield url


@pytest.fixture(scope="module")
async def chromium(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Browser]:
    microphone = write_fake_microphone(tmp_path_factory.mktemp("mic") / "silence.wav", [Silence(1.0)])
    async with async_playwright() as playwright:
        browser = await launch_chromium(playwright, microphone=microphone)
        yield browser
        await browser.close()


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def responses_done(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event["response"] for event in events if event["type"] == "response.done"]


@dataclass(frozen=True)
class RoundTrip:
    """One tool round trip over openai-python's WebSocket: every message the server sent, the
    events of the first response (the call) and of the second (the answer), and the output given."""

    raw: list[str]
    first: list[dict[str, Any]]
    second: list[dict[str, Any]]
    output: str


async def tool_round_trip(server: str, **extra: str) -> RoundTrip:
    """The question, the model's call, the call's ``function_call_output`` (the timezone asked, a
    time, and ``extra`` fields), and the answer, in a session of its own."""
    client = AsyncOpenAI(api_key="sk-unused", base_url=f"{server}/v1")
    tool = {
        "type": "function", "name": "get_local_time", "description": "The local time in a timezone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    }
    raw: list[str] = []

    async def until_done(connection: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "response.done":
            message = (await connection.recv_bytes()).decode()
            raw.append(message)
            events.append(json.loads(message))
        return events

    async with client.realtime.connect(model="gpt-realtime") as connection:
        await connection.session.update(session={"type": "realtime", "tools": [tool], "tool_choice": "auto"})
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
        )
        await connection.response.create()
        first = await until_done(connection)
        call = first[-1]["response"]["output"][0]
        assert (call["type"], call["name"], call["status"]) == ("function_call", "get_local_time", "completed")
        output = json.dumps({"timezone": json.loads(call["arguments"])["timezone"], "local_time": "12:00", **extra})
        await connection.conversation.item.create(
            item={"type": "function_call_output", "call_id": call["call_id"], "output": output}
        )
        await connection.response.create()
        second = await until_done(connection)
    return RoundTrip(raw, first, second, output)


async def test_openai_python_runs_the_tool_round_trip_over_the_websocket(tools_server: str) -> None:
    trip = await tool_round_trip(tools_server)
    for message in trip.raw:
        SDK_SERVER_EVENT.validate_json(message)  # every event is one openai-python knows, with its fields
    call = trip.first[-1]["response"]["output"][0]
    assert json.loads(call["arguments"]) == CALL_ARGUMENTS
    deltas = [e["delta"] for e in trip.first if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call["arguments"]
    assert "response.output_audio.delta" not in types_of(trip.first)  # the markup is never spoken
    answer = trip.second[-1]["response"]
    assert answer["status"] == "completed"
    assert answer["output"][0]["content"][0]["transcript"] == ANSWER
    assert [e for e in trip.second if e["type"] == "response.output_audio.delta"]
    assert wait_for_sessions(tools_server, 0) == 0


async def test_the_answers_prompt_holds_the_function_output(tools_server: str, dev_model_dir: Path) -> None:
    """Two round trips alike but for the output: one with a note of over ten tokens more. The
    replies are scripted and the call is the same in both, so only the output reaching the prompt
    can make the answer's prompt longer, and by exactly the note's tokens."""
    plain = await tool_round_trip(tools_server)
    noted = await tool_round_trip(tools_server, note="Paris keeps Central European Summer Time until late October.")
    # The prompt writes the output between newlines in its <tool_response> block (Qwen's template).
    tokenizer = load_tokenizer(dev_model_dir)
    note_tokens = (len(tokenizer.encode(f"\n{noted.output}\n", add_special_tokens=False))
                   - len(tokenizer.encode(f"\n{plain.output}\n", add_special_tokens=False)))

    def input_tokens(events: list[dict[str, Any]]) -> int:
        return int(events[-1]["response"]["usage"]["input_tokens"])

    assert input_tokens(noted.first) == input_tokens(plain.first)  # the same prompt up to the call
    assert note_tokens > 10
    assert input_tokens(noted.second) - input_tokens(plain.second) == note_tokens
    assert wait_for_sessions(tools_server, 0) == 0


async def serve_sdk_page(page: Page, base_url: str) -> None:
    """The SDK's test page and browser build, on the server's origin (same origin: no CORS)."""

    async def fulfil(route: Route) -> None:
        name = route.request.url.split("/sdk-test/", 1)[1]
        if name == "index.html":
            await route.fulfill(path=SDK_DIR / "agents_page.html", content_type="text/html")
        else:
            await route.fulfill(path=SDK_BUNDLE / name.removeprefix("bundle/"), content_type="text/javascript")

    await page.route(f"{base_url}/sdk-test/**", fulfil)


@pytest.mark.browser
async def test_the_openai_agents_sdk_runs_the_tool_and_speaks_the_answer(tools_server: str, chromium: Browser) -> None:
    assert (SDK_BUNDLE / "openai-realtime-agents.mjs").is_file(), (
        "the Agents SDK is missing: `make test` installs it (npm ci in tests/e2e/sdk)"
    )
    page = await chromium.new_page()
    try:
        await serve_sdk_page(page, tools_server)
        await page.goto(f"{tools_server}/sdk-test/index.html")
        await page.wait_for_function("window.sdkReady === true")
        await page.evaluate("([url, question]) => window.runAgent(url, question)", [tools_server, QUESTION])
        # The second response (the answer) has played out.
        await page.wait_for_function(
            """() => {
              const types = window.sdkRecord.events.map((e) => e.type);
              const second = types.indexOf("response.done", types.indexOf("response.done") + 1);
              return second >= 0 && types.lastIndexOf("output_audio_buffer.stopped") > types.indexOf("response.created", 4);
            }""",
            timeout=DEADLINE_MS,
        )
        await page.evaluate("window.readInboundAudio()")
        record = await page.evaluate("window.sdkRecord")
    finally:
        await page.close()

    assert record["errors"] == []
    assert record["toolCalls"] == [CALL_ARGUMENTS]  # the SDK ran the tool with what the model wrote
    # Every event of a kind the SDK's schema knows came out of its parser as that kind.
    assert [e["type"] for e in record["events"] if e["known"] and not e["parsed"]] == []
    parsed = {e["type"] for e in record["events"] if e["parsed"]}
    assert {"response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.content_part.added", "response.done"} <= parsed
    events = [e["raw"] for e in record["events"]]
    first, second = responses_done(events)[:2]
    assert [item["type"] for item in first["output"]] == ["function_call"]
    assert second["status"] == "completed"
    assert second["output"][0]["content"][0]["transcript"] == ANSWER
    started = [e["response_id"] for e in events if e["type"] == "output_audio_buffer.started"]
    assert started == [second["id"]]  # the answer was spoken, the call was not
    assert record["inboundAudio"] > 0  # and its audio reached the browser
    history = {(item["type"], item.get("name")) for item in record["history"]}
    assert ("function_call", "get_local_time") in history
    assert wait_for_sessions(tools_server, 0) == 0


@pytest.mark.browser
async def test_the_page_runs_its_tool_and_shows_call_and_result(tools_server: str, chromium: Browser) -> None:
    page = await chromium.new_page()
    try:
        await page.goto(tools_server)
        await page.click("#connect")
        await page.wait_for_function("window.omniRtc.state === 'listening'", timeout=DEADLINE_MS)
        await page.fill("#text-input", QUESTION)
        await page.click("#text-send")
        await page.wait_for_function(
            """(answer) => window.omniRtc.events.some(
                (e) => e.type === "response.output_audio_transcript.done" && e.transcript === answer)""",
            arg=ANSWER, timeout=DEADLINE_MS,
        )
        transcript = await page.evaluate(
            """() => [...document.querySelectorAll("#transcript li.turn")].map((li) => ({
                role: li.dataset.role, who: li.querySelector(".who").textContent,
                text: li.querySelector(".text").textContent }))"""
        )
        sent = await page.evaluate("window.omniRtc.sent")
        TEST_OUTPUT.mkdir(exist_ok=True)
        await page.screenshot(path=TEST_OUTPUT / "page-tool-call.png", full_page=True)  # for a person to look at
        await page.click("#hangup")
    finally:
        await page.close()

    update = next(e for e in sent if e["type"] == "session.update")
    assert [tool["name"] for tool in update["session"]["tools"]] == ["get_local_time"]
    call = next(entry for entry in transcript if entry["who"] == "Tool call: get_local_time")
    assert json.loads(call["text"]) == CALL_ARGUMENTS
    result = json.loads(next(entry for entry in transcript if entry["who"] == "Tool result")["text"])
    assert result["timezone"] == "Europe/Paris" and result["local_time"]
    assert [entry["role"] for entry in transcript] == ["user", "tool", "tool", "assistant"]
    assert transcript[-1]["text"] == ANSWER
    output = next(e for e in sent if e["type"] == "conversation.item.create" and e["item"]["type"] != "message")
    assert json.loads(output["item"]["output"]) == result
