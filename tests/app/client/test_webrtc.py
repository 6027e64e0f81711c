"""The WebRTC client's microphone track: what a caller waiting on it learns when it stops, and its speakerphone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.client.base import ClientError
from app.client.webrtc import MicrophoneTrack, Speakerphone, _EchoPath
from media.pacing import FRAME_SAMPLES
from media.rates import WIRE_RATE


async def test_audio_still_queued_when_the_track_stops_fails_its_wait() -> None:
    microphone = MicrophoneTrack()
    sent = microphone.play(np.full(4_800, 0.1, dtype=np.float32))  # 100 ms, never paced out
    microphone.stop()  # as aiortc's RTP sender does when its transport fails
    # A guard against the hang this replaces, not a speed limit: it fails at once or never resolves.
    with pytest.raises(ClientError, match="ended before this audio was all sent"):
        async with asyncio.timeout(5.0):
            await sent


async def test_a_stopped_track_refuses_new_audio() -> None:
    microphone = MicrophoneTrack()
    microphone.stop()
    with pytest.raises(ClientError, match="has ended"):
        microphone.play(np.zeros(480, dtype=np.float32))


async def test_stopping_after_the_audio_was_sent_keeps_its_send_time() -> None:
    microphone = MicrophoneTrack()
    sent = microphone.play(np.full(480, 0.1, dtype=np.float32))  # 10 ms: one 20 ms frame takes it
    await microphone.recv()
    microphone.stop()
    assert isinstance(await sent, float)


def test_a_speakerphone_sends_the_answer_back_late_and_quieter_with_its_reverb():
    echo = _EchoPath(Speakerphone(delay_ms=150, gain_db=-12.0, reverb_ms=200))
    pulse = np.zeros(FRAME_SAMPLES, np.float32)
    pulse[0] = 1.0
    echo.heard(pulse)
    for _ in range(30):  # the speaker goes quiet: the reverb still rings through the next frames
        echo.heard(np.zeros(FRAME_SAMPLES, np.float32))
    heard = np.concatenate([echo.take(FRAME_SAMPLES) for _ in range(31)])

    delay = 150 * WIRE_RATE // 1000
    assert np.all(heard[:delay] == 0.0)
    assert abs(heard[delay] - 10 ** (-12 / 20) / np.sqrt(1 + 0.09)) < 1e-3  # the direct path, in unit energy with the tail
    tail = heard[delay + 1 : delay + 200 * WIRE_RATE // 1000]
    assert np.sqrt(np.sum(np.square(tail))) > 0.05  # the room rings on
    assert np.allclose(np.sum(np.square(heard)), 10 ** (-12 / 10), rtol=1e-3)  # -12 dB of energy in all
