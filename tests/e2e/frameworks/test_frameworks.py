"""pipecat, LiveKit Agents and the OpenAI Agents SDK for Python, their released packages at the
versions pinned in requirements.txt, each driven by its own code against a real ``omni-rtc serve`` (dev
model, ``--dev-replies`` scripted replies) over ``GET /v1/realtime``.

Each framework runs in ``.venv-frameworks`` (``make frameworks-venv``, which ``make test`` runs:
their pins clash with the server's), as a driver script beside this file that says the
espeak-ng fixtures into it in real time (``scenario.py``: two spoken turns, a tool call, a
barge-in) and prints what the framework saw as JSON. The three run at once against one server,
each in its own session; every test below reads their records and the server's own count of
``error`` events (``/metrics``).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import running_server, wait_for_sessions
from tests.e2e.frameworks.scenario import REPLIES, TOOL_CITY, audio_deltas, audio_ms

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
FRAMEWORKS_PYTHON = REPO / ".venv-frameworks" / "bin" / "python"
DRIVERS = {"pipecat": "pipecat_driver.py", "livekit": "livekit_driver.py", "openai-agents": "openai_agents_driver.py"}
# Answers as long as a voice speaks them (3 codec frames, 240 ms, per token), so the long one is
# still being generated when the user talks over it: up to 12 s of audio per answer.
GENERATION = {"max_audio_frames": 150, "talker_frames_per_token": 3}
DRIVER_TIMEOUT_S = 600  # against hangs only: a run takes ~30-60 s


def error_counts(base_url: str) -> dict[str, float]:
    """The server's own record of the ``error`` events it sent: ``omni_rtc_errors_total`` by code."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts = {}
    for match in re.finditer(r'^omni_rtc_errors_total\{([^}]*)\} ([0-9.e+]+)$', text, flags=re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        counts[f"{labels.get('type')}/{labels.get('code')}"] = float(match.group(2))
    return counts


@pytest.fixture(scope="module")
def framework_server(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("frameworks-server")
    replies = directory / "replies.json"
    replies.write_text(json.dumps(REPLIES))
    with running_server(dev_model_dir, directory, "--dev-replies", str(replies), "--media-workers", "1",
                        "--generation", json.dumps(GENERATION)) as url:
        yield url


def run_driver(name: str, base_url: str, log_dir: Path) -> dict[str, Any]:
    """The driver's record; one that failed says why (``driver_error``, its exit status and log)."""
    started = time.monotonic()
    log = log_dir / f"{name}.log"
    with open(log, "wb") as stderr:
        result = subprocess.run([str(FRAMEWORKS_PYTHON), str(HERE / DRIVERS[name]), base_url], stdout=subprocess.PIPE,
                                stderr=stderr, timeout=DRIVER_TIMEOUT_S, cwd=REPO)
    lines = result.stdout.decode().strip().splitlines()
    record = json.loads(lines[-1]) if lines else {"server_events": [], "tool_calls": [], "framework_errors": []}
    record.update(returncode=result.returncode, seconds=round(time.monotonic() - started, 1), log=str(log))
    if result.returncode != 0:
        record.setdefault("driver_error", f"exit status {result.returncode}")
        record["log_tail"] = log.read_text(errors="replace")[-2000:]
    (log_dir / f"{name}.json").write_text(json.dumps(record, indent=1))  # for a person to read
    return record


@pytest.fixture(scope="module")
def runs(framework_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every framework's record, from one run each, all at once; and the server's error count around them."""
    assert FRAMEWORKS_PYTHON.is_file(), "the frameworks' environment is missing: `make frameworks-venv` (make test) builds it"
    log_dir = tmp_path_factory.mktemp("framework-logs")
    before = error_counts(framework_server)
    with ThreadPoolExecutor(len(DRIVERS)) as pool:
        futures = {name: pool.submit(run_driver, name, framework_server, log_dir) for name in DRIVERS}
        records = {name: future.result() for name, future in futures.items()}
    after = error_counts(framework_server)
    errors = {code: count - before.get(code, 0.0) for code, count in after.items() if count > before.get(code, 0.0)}
    print({name: record["seconds"] for name, record in records.items()}, "seconds per framework run")
    return {"records": records, "server_errors": errors, "sessions_after": wait_for_sessions(framework_server, 0)}


def responses(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [event["response"] for event in record["server_events"] if event["type"] == "response.done"]


def spoken(response: dict[str, Any]) -> list[str]:
    return [part["transcript"] for item in response["output"] if item["type"] == "message" for part in item["content"]]


FRAMEWORKS = list(DRIVERS)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_the_framework_went_through_the_whole_conversation(runs, name):
    record = runs["records"][name]
    steps = [(e["type"], e.get("response", {}).get("status")) for e in record["server_events"]
             if e["type"] in ("input_audio_buffer.speech_started", "response.done", "error")]
    assert record["returncode"] == 0, f"{record.get('driver_error')}\nsteps: {steps}\nlog: {record['log']}"


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_its_default_session_is_taken_as_sent(runs, name):
    record = runs["records"][name]
    updated = [e["session"] for e in record["server_events"] if e["type"] == "session.updated"]
    assert updated, "the framework's session.update was answered"
    detection = updated[-1]["audio"]["input"]["turn_detection"]
    # pipecat sends no turn detection: the server's, with OpenAI's barge-in; the others send semantic_vad.
    expected = "server_vad" if name == "pipecat" else "semantic_vad"
    assert (detection["type"], detection["interrupt_response"]) == (expected, True)
    assert [tool["name"] for tool in updated[-1]["tools"]] == ["get_weather"]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_two_spoken_turns_are_answered_with_the_scripted_replies(runs, name):
    first, second = responses(runs["records"][name])[:2]
    assert (first["status"], second["status"]) == ("completed", "completed")
    assert (spoken(first), spoken(second)) == ([REPLIES[0]], [REPLIES[1]])


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_the_framework_runs_the_tool_and_the_answer_uses_it(runs, name):
    record = runs["records"][name]
    assert record["tool_calls"] == [{"name": "get_weather", "arguments": {"city": TOOL_CITY}}]
    call, answer = responses(record)[2:4]
    assert [item["type"] for item in call["output"]] == ["function_call"]
    outputs = [e for e in record["server_events"]
               if e["type"] == "conversation.item.added" and e["item"]["type"] == "function_call_output"]
    assert [o["item"]["call_id"] for o in outputs] == [call["output"][0]["call_id"]]
    assert (answer["status"], spoken(answer)) == ("completed", [REPLIES[3]])


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_barge_in_cuts_the_long_answer_and_is_answered(runs, name):
    record = runs["records"][name]
    cut, answer = responses(record)[4:6]
    truncated = [e for e in record["server_events"]
                 if e["type"] == "conversation.item.truncated" and e["item_id"] == cut["output"][0]["id"]]
    # Cut where the user spoke: the server's own truncation counts what it sent (a WebSocket client
    # that acknowledges no playback), the framework's what it played; never past what was sent.
    sent_ms = audio_ms(audio_deltas(record["server_events"], cut["id"]))
    assert truncated
    cut_at_ms = min(e["audio_end_ms"] for e in truncated)
    assert cut_at_ms <= sent_ms
    if cut["status"] == "cancelled":  # still being generated at the barge-in
        # On a loaded box the answer may come slower than it plays (936 ms sent in the ~1.2 s before
        # the cut): then all of it was heard, and the cut shows in the text the item keeps.
        assert cut["status_details"]["reason"] == "turn_detected"
        heard = spoken(cut)[0]
        assert REPLIES[4].startswith(heard) and len(heard) < len(REPLIES[4])  # the item keeps what was heard
    else:  # all generated before it (a speculative answer starts earlier): cut in its playback alone
        assert cut["status"] == "completed"
        assert cut_at_ms < sent_ms
    assert (answer["status"], spoken(answer)) == ("completed", [REPLIES[5]])


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_no_error_event_reaches_the_framework(runs, name):
    record = runs["records"][name]
    assert [e for e in record["server_events"] if e["type"] == "error"] == []
    assert record["framework_errors"] == []


def test_the_server_sent_no_error_event_in_any_run(runs):
    assert runs["server_errors"] == {}
    assert runs["sessions_after"] == 0


# -- the README's "Use it from your framework" snippets ------------------------------------------

README = REPO / "README.md"
DOCUMENTED_SERVER = "localhost:8000"


def readme_snippet(name: str, server_url: str) -> str:
    """The README's snippet for ``name`` (after its ``<!-- framework: NAME -->`` marker), pointed
    at ``server_url`` instead of the documented ``localhost:8000``, which it must name."""
    match = re.search(rf"<!-- framework: {re.escape(name)} -->\n```python\n(.*?)\n```", README.read_text(), flags=re.DOTALL)
    if match is None:
        raise LookupError(f"README.md has no snippet marked 'framework: {name}'")
    snippet = match.group(1)
    if DOCUMENTED_SERVER not in snippet:
        raise LookupError(f"README.md's {name} snippet no longer names {DOCUMENTED_SERVER}")
    return snippet.replace(DOCUMENTED_SERVER, server_url.removeprefix("http://"))


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_the_readme_snippet_runs_and_its_framework_gets_an_answer(framework_server, tmp_path, name):
    assert FRAMEWORKS_PYTHON.is_file(), "the frameworks' environment is missing: `make frameworks-venv` (make test) builds it"
    snippet = tmp_path / "snippet.py"
    snippet.write_text(readme_snippet(name, framework_server))
    result = subprocess.run([str(FRAMEWORKS_PYTHON), str(HERE / "snippet_runner.py"), name, str(snippet)],
                            capture_output=True, timeout=DRIVER_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    answer = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert answer == {"transcript": REPLIES[0], "errors": []}  # each session's first scripted reply
