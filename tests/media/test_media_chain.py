"""The whole media path without a network: outbound track → aiortc's Opus → inbound → VAD."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import soxr
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.detector_events import UtteranceCommitted
from media.detector_params import TurnDetectionParams
from media.inbound import InboundAudio
from media.outbound import OutboundAudioTrack
from media.vad import SileroVad
from media.voice_activity_detector import VoiceActivityDetector
from tests.speech import load_fixture, silence


class OpusLoopback(MediaStreamTrack):
    """A remote track as aiortc would deliver it: the sender's frames through Opus and back."""

    kind = "audio"

    def __init__(self, source: OutboundAudioTrack, frames: int) -> None:
        super().__init__()
        self._source = source
        self._remaining = frames
        self._encoder, self._decoder = OpusEncoder(), OpusDecoder()
        self._decoded: list[av.AudioFrame] = []

    async def recv(self) -> av.AudioFrame:
        while not self._decoded:
            if self._remaining == 0:
                raise MediaStreamError
            self._remaining -= 1
            payloads, timestamp = self._encoder.encode(await self._source.recv())
            for payload in payloads:
                self._decoded.extend(self._decoder.decode(JitterFrame(data=payload, timestamp=timestamp)))
        return self._decoded.pop(0)


async def no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


async def test_spoken_answer_survives_opus_and_is_heard_as_one_utterance(silero: SileroVad) -> None:
    speech = np.concatenate([silence(300), load_fixture("hello"), silence(1000)])
    outbound = OutboundAudioTrack(sleep=no_wait)  # paced on the real clock but never waits
    outbound.write(soxr.resample(speech, 16_000, 24_000).astype(np.float32))

    detector = VoiceActivityDetector(silero, TurnDetectionParams())
    events: list = []
    ended = asyncio.Event()
    inbound = InboundAudio(
        OpusLoopback(outbound, frames=speech.size // 320 + 10),
        lambda pcm: events.extend(detector.push(pcm)),
        on_ended=ended.set,
    )
    inbound.start()
    await asyncio.wait_for(ended.wait(), timeout=30)
    await inbound.close()

    committed = [event for event in events if isinstance(event, UtteranceCommitted)]
    assert len(committed) == 1
    # Speech starts at 300 ms; Opus adds a few ms of codec delay, the prefix reaches back 300 ms.
    assert 0 <= committed[0].audio_start_ms <= 150
    assert outbound.played_samples == round(speech.size * 1.5)
