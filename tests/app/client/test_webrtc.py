"""The WebRTC client's microphone track: what a caller waiting on it learns when it stops."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.client.base import ClientError
from app.client.webrtc import MicrophoneTrack


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
