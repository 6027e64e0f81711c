"""response.done's latency counts to the first frame a paced output hands to the transport."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import app.realtime.response
from tests.fakes import EnergyVad, ScriptedEngine, SessionHarness, VirtualAudioOutput

RATE = 16_000


class PacedOutput(VirtualAudioOutput):
    """A virtual speaker that, like the WebRTC track, reports its first frame when it plays it."""

    paced = True


def utterance() -> np.ndarray:
    speech = (0.3 * np.sin(2 * np.pi * 220 * np.arange(600 * RATE // 1000) / RATE)).astype(np.float32)
    return np.concatenate([speech, np.zeros(700 * RATE // 1000, dtype=np.float32)])


async def paced_harness() -> SessionHarness:
    harness = SessionHarness(ScriptedEngine("Hello there"), EnergyVad())
    harness.output = PacedOutput()
    harness.session._audio.output = harness.output  # the harness builds its session with the plain speaker
    harness.output.set_listener(harness.session)
    await harness.session.start()
    return harness


async def test_latency_runs_until_the_first_frame_is_sent_not_until_the_audio_is_queued() -> None:
    h = await paced_harness()
    try:
        h.push(utterance())
        await h.until("response.output_audio_transcript.delta", 2)  # both words, their audio queued
        await asyncio.sleep(0.3)  # the output has not sent a frame yet: a worker far behind
        assert "response.done" not in h.types()
        h.output.play(480)  # the first frame goes out
        done = await h.until("response.done")
        latency = done["latency"]
        # The 300 ms wait counts, less the timer's resolution (asyncio may wake ~1 ms early).
        assert latency["end_of_speech_to_first_audio_ms"] >= latency["silence_wait_ms"] + 295
        assert latency["other_ms"] >= 295 - latency["engine_first_audio_ms"]
        assert h.types().index("output_audio_buffer.started") < h.types().index("response.done")
    finally:
        await h.session.close()


async def test_an_output_that_never_sends_does_not_hold_response_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.realtime.response, "FIRST_FRAME_WAIT_S", 0.05)
    h = await paced_harness()
    try:
        h.push(utterance())
        done = await h.until("response.done")
        assert done["response"]["status"] == "completed"
        assert done["latency"]["end_of_speech_to_first_audio_ms"] >= done["latency"]["silence_wait_ms"]
        assert "output_audio_buffer.started" not in h.types()
    finally:
        await h.session.close()


async def test_an_unpaced_output_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.realtime.response, "FIRST_FRAME_WAIT_S", 60.0)
    h = SessionHarness(ScriptedEngine("Hello there"), EnergyVad())
    await h.session.start()
    try:
        h.push(utterance())
        await h.until("response.done", timeout_s=30)  # waiting for a first frame would take 60 s
        assert "output_audio_buffer.started" not in h.types()
    finally:
        await h.session.close()
