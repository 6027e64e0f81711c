"""Qwen's own realtime client end to end: the real ``dashscope`` 2.0.2 SDK
(``dashscope.audio.qwen_omni.OmniRealtimeConversation``) against ``omni-rtc serve`` on 127.0.0.1,
the dev model speaking scripted replies (``--dev-replies``) through the real tokenizer, Talker and
Code2Wav.

One conversation, as DashScope documents it (its default session: voice ``Cherry``, ``pcm16``
input at 16 kHz, server VAD, barge-in), is held once for the module and each test checks one
thing of it: the espeak-ng fixtures are spoken at 16 kHz in real time by a microphone thread
(silence between utterances), a camera frame goes in with ``append_video``, the user talks over a
long answer, and ``end_session()`` ends it. The README's DashScope snippet runs too.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dashscope.audio.qwen_omni import MultiModality

from pipeline.images import image_tokens
from tests.dashscope_client import CHUNK_BYTES, CHUNK_MS, Microphone, SdkSession, pcm16
from tests.e2e.conftest import GENERATION, running_server, wait_for_sessions
from tests.pictures import encoded
from tests.speech import load_fixture, silence

pytestmark = pytest.mark.e2e

README_MD = Path(__file__).resolve().parents[2] / "README.md"
FIRST = "Hello, I can hear you."
SECOND = "I see a picture of soft colours."
# Long enough to be generated for seconds (160 tokens, one 80 ms frame each, up to MAX_AUDIO_FRAMES):
# the user talks over it while it is.
LONG = " ".join(["Let me tell you a long story about the sea, the wind and the boats."] * 10)
AFTER = "Yes, go on, I am listening."
REPLIES = [FIRST, SECOND, LONG, AFTER]
MAX_AUDIO_FRAMES = 160  # 12.8 s: the long answer is still being generated when the user speaks
VOICE_RATE = 24_000


@dataclass
class Conversation:
    """What the SDK's callback got in the module's conversation, and how it ended."""

    client: SdkSession
    updated: dict[str, Any]
    turns: list[dict[str, Any]]  # response.done's response: first, second (with the frame), cut, after
    end_session_error: BaseException | None
    closed: tuple[Any, Any]


@pytest.fixture(scope="module")
def dashscope_server(dev_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("dashscope-server")
    replies = directory / "replies.json"
    replies.write_text(json.dumps(REPLIES))
    generation = json.dumps({**GENERATION, "max_audio_frames": MAX_AUDIO_FRAMES})
    with running_server(dev_model_dir, directory, "--dev-replies", str(replies), "--media-workers", "1",
                        env={"OMNI_RTC_GENERATION": generation}) as url:
        yield url


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/api-ws/v1/realtime"


@pytest.fixture(scope="module")
def conversation(dashscope_server: str) -> Conversation:
    client = SdkSession(ws_url(dashscope_server))
    client.conversation.connect()
    # Its documentation's call; every other setting is the SDK's default (pcm16 at 16 kHz in,
    # server VAD at its threshold 0.2 with an 800 ms silence wait, input transcription on).
    client.conversation.update_session([MultiModality.AUDIO, MultiModality.TEXT], voice="Cherry")
    updated = client.wait_for("session.updated")["session"]
    microphone = Microphone(client.conversation)
    microphone.start()
    turns = []
    try:
        start = len(client.events)
        microphone.say(load_fixture("hello"))
        turns.append(client.wait_for("response.done", start=start)["response"])

        start = len(client.events)
        client.conversation.append_video(base64.b64encode(encoded(640, 480, seed=3)).decode())
        microphone.say(load_fixture("weather"))
        turns.append(client.wait_for("response.done", start=start)["response"])

        start = len(client.events)
        microphone.say(load_fixture("hello"))
        client.wait_for("response.audio.delta", start=start)  # the long answer is being spoken…
        microphone.say(load_fixture("weather"))  # …and the user talks over it
        cut = client.wait_for("response.done", start=start)
        turns.append(cut["response"])
        turns.append(client.wait_for(lambda e: e["type"] == "response.done" and e is not cut, start=start)["response"])
    finally:
        microphone.stop()
    end_session_error = None
    try:
        client.conversation.end_session(timeout=20)
    except (RuntimeError, TimeoutError) as exc:  # what the SDK raises: an error event, or no session.finished
        end_session_error = exc
    return Conversation(client, updated, turns, end_session_error, client.wait_closed())


def test_the_documented_session_is_taken_as_dashscope_reports_it(conversation):
    session = conversation.updated
    assert (session["voice"], session["modalities"]) == ("Chelsie", ["text", "audio"])
    assert (session["input_audio_format"], session["output_audio_format"]) == ("pcm16", "pcm24")
    assert session["turn_detection"]["threshold"] == 0.2 and session["turn_detection"]["interrupt_response"]


def test_the_server_sends_no_error_event(conversation):
    assert not conversation.client.of_type("error")


def test_two_spoken_turns_are_answered_with_the_scripted_replies(conversation):
    first, second = conversation.turns[:2]
    assert (first["status"], second["status"]) == ("completed", "completed")
    assert conversation.client.transcript(first["id"]) == FIRST
    assert conversation.client.transcript(second["id"]) == SECOND


def test_the_answers_audio_arrives_as_response_audio_delta(conversation):
    for turn in conversation.turns[:2]:
        audio = conversation.client.audio(turn["id"])
        assert len(audio) / 2 / VOICE_RATE >= 0.5  # seconds of PCM16 at 24 kHz
    assert conversation.client.conversation.get_last_first_audio_delay() is not None  # the SDK's own metric
    types = {event["type"] for event in conversation.client.events}
    assert not types & {"response.output_audio.delta", "response.output_audio_transcript.delta",
                        "conversation.item.added", "conversation.item.done"}


def test_the_camera_frame_puts_image_tokens_into_its_turn(conversation):
    first, second = conversation.turns[:2]
    assert first["usage"]["input_token_details"]["image_tokens"] == 0
    assert second["usage"]["input_token_details"]["image_tokens"] == image_tokens(640, 480, 100_352) == 88


def test_a_barge_in_truncates_the_answer_and_is_then_answered(conversation):
    cut, after = conversation.turns[2:]
    assert (cut["status"], cut["status_details"]["reason"]) == ("cancelled", "turn_detected")
    (truncated,) = [e for e in conversation.client.of_type("conversation.item.truncated")
                    if e["item_id"] == cut["output"][0]["id"]]
    heard = cut["output"][0]["content"][0]["transcript"]
    assert heard == LONG[:len(heard)] and len(heard) < len(LONG)  # the item keeps what was heard
    assert truncated["audio_end_ms"] < MAX_AUDIO_FRAMES * 80
    assert after["status"] == "completed"
    assert conversation.client.transcript(after["id"]) == AFTER


def test_end_session_returns_cleanly_and_the_server_closes(dashscope_server, conversation):
    assert conversation.end_session_error is None
    assert conversation.client.events[-1]["type"] == "session.finished"
    assert conversation.closed == (1000, "session_finished")
    assert wait_for_sessions(dashscope_server, 0) == 0


# -- the README's DashScope snippet ("Use it from your framework") ---------------------------------


def documented_snippet() -> str:
    """The fenced block after ``<!-- framework: dashscope -->`` in README.md."""
    match = re.search(r"<!-- framework: dashscope -->\n```python\n(.*?)\n```", README_MD.read_text(), re.DOTALL)
    assert match is not None, "README.md has no block marked 'framework: dashscope'"
    return match.group(1)


def test_the_documented_snippet_speaks_a_turn(dashscope_server):
    snippet = documented_snippet()
    documented_url = "ws://localhost:8000/api-ws/v1/realtime"
    assert documented_url in snippet
    printed = io.StringIO()
    played: list[bytes] = []

    def microphone() -> Iterator[bytes]:
        """hello.wav at 16 kHz in real time, then silence until the whole answer has been printed
        (the snippet ends each answer's line at its ``response.done``)."""
        speech = pcm16(np.concatenate([silence(500), load_fixture("hello")]))
        give_up = time.monotonic() + 120  # against hangs only
        due = time.monotonic()
        offset = 0
        while not printed.getvalue().endswith("\n") and time.monotonic() < give_up:
            yield speech[offset:offset + CHUNK_BYTES].ljust(CHUNK_BYTES, b"\0")
            offset += CHUNK_BYTES
            due += CHUNK_MS / 1000
            time.sleep(max(0.0, due - time.monotonic()))

    namespace = {"play": played.append, "stop_playing": played.clear, "microphone": microphone}
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet.replace(documented_url, ws_url(dashscope_server)), str(README_MD), "exec"), namespace)
    assert printed.getvalue() == FIRST + "\n"
    assert sum(len(chunk) for chunk in played) / 2 / VOICE_RATE >= 0.5
    assert wait_for_sessions(dashscope_server, 0) == 0
