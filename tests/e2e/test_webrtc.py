"""The real server and a real aiortc client over 127.0.0.1: spoken turns, history, release.

One two-turn conversation is recorded once per module (each turn costs seconds of CPU) and
each test checks one thing it shows. The client speaks the fixture WAVs in real time and lets
the server's VAD end each utterance: nothing is committed by hand.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from app.cli import read_utterance
from app.client.turn import TurnResult
from app.client.webrtc import RealtimeClient
from app.config import Settings
from app.http.server import create_app
from tests.e2e.conftest import open_sessions, serving_in_process, wait_for_sessions
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
UTTERANCES = ("hello.wav", "weather.wav")
# With the server's GENERATION (conftest), answers are 12 to 24 tokens long.
SESSION = {"type": "realtime", "max_output_tokens": 24}
# The events of one spoken turn under server VAD, in the order the session sends them, as a subsequence:
# other events (deltas, output_item/content_part events) may come in between.
VOICE_TURN_SEQUENCE = (
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "response.created",
    "output_audio_buffer.started",
    "response.done",
    "output_audio_buffer.stopped",
)


@dataclass(frozen=True)
class Conversation:
    turns: list[TurnResult]
    sessions_after_hang_up: int


@pytest.fixture(scope="module")
async def conversation(server_url: str) -> Conversation:
    async with RealtimeClient(server_url, ice_loopback=True, session=SESSION) as client:
        turns = [await client.speak(read_utterance(FIXTURES / name)) for name in UTTERANCES]
    sessions = await asyncio.to_thread(wait_for_sessions, server_url, 0)
    return Conversation(turns=turns, sessions_after_hang_up=sessions)


def is_subsequence(wanted: tuple[str, ...], seen: list[str]) -> bool:
    remaining = iter(seen)
    return all(any(kind == want for kind in remaining) for want in wanted)


@pytest.mark.parametrize("turn", [0, 1])
def test_voice_turn_has_the_full_event_sequence(conversation: Conversation, turn: int) -> None:
    seen = conversation.turns[turn].event_types()
    assert is_subsequence(VOICE_TURN_SEQUENCE, seen), seen


@pytest.mark.parametrize("turn", [0, 1])
def test_voice_turn_ends_completed_or_at_the_token_limit(conversation: Conversation, turn: int) -> None:
    response = conversation.turns[turn].response
    assert response["status"] in ("completed", "incomplete")
    if response["status"] == "incomplete":
        assert response["status_details"]["reason"] == "max_output_tokens"


@pytest.mark.parametrize("turn", [0, 1])
def test_voice_turn_is_answered_with_half_a_second_of_audio_or_more(conversation: Conversation, turn: int) -> None:
    assert conversation.turns[turn].audio_seconds >= 0.5


@pytest.mark.parametrize("turn", [0, 1])
def test_voice_turn_streams_a_transcript(conversation: Conversation, turn: int) -> None:
    result = conversation.turns[turn]
    deltas = "".join(e["delta"] for e in result.events if e["type"] == "response.output_audio_transcript.delta")
    assert deltas
    assert deltas == result.transcript


def test_second_turn_prompt_holds_the_first_turn(conversation: Conversation) -> None:
    first, second = (turn.usage for turn in conversation.turns)
    # The first answer enters history as text (its audio tokens do not): the second prompt
    # carries the first prompt, that text and a new utterance.
    assert second["input_tokens"] >= first["input_tokens"] + first["output_token_details"]["text_tokens"]


def test_hang_up_leaves_no_open_session(conversation: Conversation) -> None:
    assert conversation.sessions_after_hang_up == 0


async def test_offer_without_candidates_connects_as_peer_reflexive(server_url: str) -> None:
    async with RealtimeClient(server_url, ice_loopback=True, offer_candidates=False) as client:
        created = await client.wait_for("session.created")
    assert created["session"]["id"]


async def test_session_from_the_offer_applies(server_url: str) -> None:
    session = {"type": "realtime", "instructions": "Answer in one word."}
    async with RealtimeClient(server_url, ice_loopback=True, session=session) as client:
        created = await client.wait_for("session.created")
    assert created["session"]["instructions"] == "Answer in one word."


async def test_peer_that_vanishes_without_closing_is_released(server_url: str, tmp_path: Path) -> None:
    assert await asyncio.to_thread(wait_for_sessions, server_url, 0) == 0
    client = subprocess.Popen(
        [
            sys.executable, "-m", "app.cli", "call", server_url, "--ice-loopback",
            "--wav", str(FIXTURES / "long_story.wav"), "--out", str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        connected = await asyncio.to_thread(client.stdout.readline)
        assert "connected" in connected
        assert open_sessions(server_url) == 1
    finally:
        # SIGKILL: no DTLS close, no SCTP abort, no BYE; the peer just stops.
        client.send_signal(signal.SIGKILL)
        client.wait()
        client.stdout.close()
    assert await asyncio.to_thread(wait_for_sessions, server_url, 0) == 0


@pytest_asyncio.fixture(loop_scope="function")
async def scripted_server_url(tmp_path: Path) -> AsyncIterator[str]:
    """The real server in this process with a scripted engine: audible answers, no model."""
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        yield url


async def test_a_scripted_answer_is_heard_whole(scripted_server_url: str) -> None:
    """Independent of the model: the answer's audio crosses the whole path, and its timing is taken."""
    async with RealtimeClient(scripted_server_url, ice_loopback=True) as client:
        turn = await client.speak(read_utterance(FIXTURES / "hello.wav"))
    assert turn.status == "completed"
    assert turn.transcript == ScriptedEngine().reply
    # 9 words, 80 ms of audio each: 0.72 s, give or take the edges of the ramps. A ramp is a
    # 12.5 Hz sawtooth: Opus keeps mostly its steps, so only some frames are audible.
    assert 0.6 <= turn.audio_seconds <= 0.8
    assert 0 < turn.audible_seconds <= turn.audio_seconds
    assert turn.latency_s is not None and turn.latency_s > 0


async def test_client_events_reach_the_session(scripted_server_url: str) -> None:
    async with RealtimeClient(scripted_server_url, ice_loopback=True) as client:
        start = len(client.events)
        await client.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            }
        )
        await client.send({"type": "response.create"})
        done = await client.wait_for("response.done", start=start)
    assert done["response"]["status"] == "completed"
