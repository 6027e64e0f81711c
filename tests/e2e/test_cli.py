"""``omni-rtc call``: a real call (WebRTC or WebSocket, audio in real time) from the command line
against a scripted server served by uvicorn on 127.0.0.1. Its flags: tests/app/test_cli.py."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import soundfile

from app.config import Settings
from app.http.server import create_app
from tests.e2e.conftest import serving_in_process
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest_asyncio.fixture(loop_scope="function")
async def scripted_server_url(tmp_path: Path) -> AsyncIterator[str]:
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        yield url


async def run_cli(*argv: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await process.communicate()
    return process.returncode, stdout.decode(), stderr.decode()


async def test_call_says_each_wav_and_saves_each_answer(scripted_server_url, tmp_path):
    out = tmp_path / "answers"
    code, stdout, stderr = await run_cli(
        "call", scripted_server_url, "--ice-loopback", "--json", "--out", str(out),
        "--wav", str(FIXTURES / "hello.wav"), "--wav", str(FIXTURES / "weather.wav"),
    )
    assert code == 0, stderr
    report = json.loads(stdout)
    [session] = report["sessions"]
    assert [turn["transcript"] for turn in session["turns"]] == [ScriptedEngine().reply] * 2
    for turn in session["turns"]:
        audio, rate = soundfile.read(turn["output"])
        assert rate == 48_000
        assert len(audio) / rate == pytest.approx(turn["audio_seconds"], abs=0.001)
        assert turn["audio_seconds"] > 0.5
        assert turn["latency_s"] > 0


async def test_call_prints_a_line_per_turn_and_runs_concurrent_sessions(scripted_server_url, tmp_path):
    code, stdout, stderr = await run_cli(
        "call", scripted_server_url, "--ice-loopback", "--sessions", "2", "--out", str(tmp_path),
        "--wav", str(FIXTURES / "hello.wav"),
    )
    assert code == 0, stderr
    turn_lines = sorted(line for line in stdout.splitlines() if " turn " in line)
    assert [line.split(" [")[0] for line in turn_lines] == ["session 1 turn 1", "session 2 turn 1"]
    assert (tmp_path / "session-1" / "turn-1.wav").is_file()
    assert (tmp_path / "session-2" / "turn-1.wav").is_file()


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
async def test_call_reports_what_the_user_said_when_the_session_transcribes(scripted_server_url, tmp_path, transport):
    session = {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}}
    argv = ("call", scripted_server_url, "--ice-loopback", "--out", str(tmp_path), "--wav", str(FIXTURES / "hello.wav"),
            "--session", json.dumps(session), "--transport", transport)
    code, stdout, stderr = await run_cli(*argv, "--json")
    assert code == 0, stderr
    [turn] = json.loads(stdout)["sessions"][0]["turns"]
    assert turn["user_transcript"] == ScriptedEngine().transcript

    code, stdout, stderr = await run_cli(*argv)
    assert code == 0, stderr
    assert f"session 1 turn 1 user said: {ScriptedEngine().transcript!r}" in stdout.splitlines()


async def test_call_without_transcription_reports_no_user_transcript(scripted_server_url, tmp_path):
    code, stdout, stderr = await run_cli(
        "call", scripted_server_url, "--ice-loopback", "--json", "--out", str(tmp_path), "--wav", str(FIXTURES / "hello.wav"),
    )
    assert code == 0, stderr
    assert json.loads(stdout)["sessions"][0]["turns"][0]["user_transcript"] is None


async def test_call_exits_non_zero_when_the_server_refuses(tmp_path):
    app = create_app(Settings(ice_loopback=True, cache_dir=tmp_path, api_key="right-key"), engine=ScriptedEngine())
    async with serving_in_process(app) as url:
        code, _, stderr = await run_cli(
            "call", url, "--ice-loopback", "--api-key", "wrong-key", "--out", str(tmp_path), "--wav", str(FIXTURES / "hello.wav"),
        )
    assert code == 1
    assert "401" in stderr
