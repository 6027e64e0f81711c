from __future__ import annotations

import asyncio
import logging
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack, VideoStreamTrack
from aiortc.rtp import RtpPacket

from media.inbound import InboundAudio, release_audio_promptly
from tests.settle import settle

FRAME_SAMPLES = 960  # 20 ms at 48 kHz, what aiortc's Opus decoder produces


def tone(frequency: float, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(48_000 * seconds)) / 48_000
    return (amplitude * np.sin(2 * np.pi * frequency * t) * 32767).astype(np.int16)


def frames_of(samples: np.ndarray, *, layout: str = "stereo", planar: bool = False) -> list[av.AudioFrame]:
    """48 kHz s16 frames of 960 samples, like aiortc's decoded remote audio."""
    channels = 2 if layout == "stereo" else 1
    frames = []
    for index, start in enumerate(range(0, samples.size, FRAME_SAMPLES)):
        chunk = samples[start : start + FRAME_SAMPLES]
        if planar:
            frame = av.AudioFrame.from_ndarray(np.tile(chunk, (channels, 1)), format="s16p", layout=layout)
        else:
            frame = av.AudioFrame.from_ndarray(np.repeat(chunk, channels)[np.newaxis, :], format="s16", layout=layout)
        frame.sample_rate = 48_000
        frame.pts = index * FRAME_SAMPLES
        frame.time_base = Fraction(1, 48_000)
        frames.append(frame)
    return frames


class FakeTrack(MediaStreamTrack):
    """Yields the given frames, then ends (or stays silent forever with ``end=False``)."""

    kind = "audio"

    def __init__(self, frames: list[av.AudioFrame], *, end: bool = True) -> None:
        super().__init__()
        self._frames = list(frames)
        self._end = end
        self.reads = 0

    async def recv(self) -> av.AudioFrame:
        if self._frames:
            self.reads += 1
            await asyncio.sleep(0)
            return self._frames.pop(0)
        if self._end:
            raise MediaStreamError
        await asyncio.Event().wait()  # a live track with nothing more to say
        raise AssertionError("unreachable")


async def read_all(track: FakeTrack) -> np.ndarray:
    chunks: list[np.ndarray] = []
    ended = asyncio.Event()
    inbound = InboundAudio(track, chunks.append, on_ended=ended.set)
    inbound.start()
    await asyncio.wait_for(ended.wait(), timeout=10)
    await inbound.close()
    assert all(chunk.dtype == np.float32 and chunk.ndim == 1 for chunk in chunks)
    return np.concatenate(chunks)


def peak_frequency(pcm: np.ndarray, rate: int = 16_000) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(pcm.size)))
    return float(np.fft.rfftfreq(pcm.size, 1 / rate)[spectrum.argmax()])


async def test_every_frame_is_read_and_sample_count_is_conserved() -> None:
    track = FakeTrack(frames_of(tone(440, 1.0)))  # 50 frames, 48000 samples
    pcm = await read_all(track)
    assert track.reads == 50
    # swresample holds 16 output samples back until the track ends; they are flushed then.
    assert pcm.size == 16_000


async def test_tone_keeps_its_frequency_and_level() -> None:
    pcm = await read_all(FakeTrack(frames_of(tone(440, 1.0, amplitude=0.5))))
    steady = pcm[800:-800]  # away from the resampler's edges
    assert abs(peak_frequency(steady) - 440) < 2
    # Identical stereo channels are averaged, not summed: the level is unchanged.
    assert np.sqrt(np.mean(steady**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.02)


@pytest.mark.parametrize(("layout", "planar"), [("mono", False), ("stereo", True)])
async def test_mono_and_planar_input_are_converted_too(layout: str, planar: bool) -> None:
    pcm = await read_all(FakeTrack(frames_of(tone(1000, 0.5), layout=layout, planar=planar)))
    assert pcm.size == 8_000
    assert abs(peak_frequency(pcm[800:-800]) - 1000) < 3


async def test_format_change_midway_keeps_every_sample() -> None:
    frames = frames_of(tone(440, 0.5), layout="stereo") + frames_of(tone(440, 0.5), layout="mono")
    pcm = await read_all(FakeTrack(frames))
    assert pcm.size == 16_000


async def test_close_stops_reading_a_live_track_and_is_safe_twice() -> None:
    ended: list[bool] = []
    chunks: list[np.ndarray] = []
    track = FakeTrack(frames_of(tone(440, 0.1)), end=False)
    inbound = InboundAudio(track, chunks.append, on_ended=lambda: ended.append(True))
    inbound.start()
    while track.reads < 5:
        await asyncio.sleep(0)
    await inbound.close()
    await inbound.close()
    assert ended == []  # closing is not the track ending
    assert sum(chunk.size for chunk in chunks) > 0


async def test_failing_consumer_is_logged_and_close_still_works(caplog: pytest.LogCaptureFixture) -> None:
    def broken(pcm: np.ndarray) -> None:
        raise RuntimeError("consumer bug")

    inbound = InboundAudio(FakeTrack(frames_of(tone(440, 0.1)), end=False), broken)
    with caplog.at_level(logging.ERROR, logger="media.inbound"):
        inbound.start()
        await settle()
        await inbound.close()
    assert "consumer bug" in caplog.text


def test_video_track_is_rejected() -> None:
    with pytest.raises(ValueError, match="audio"):
        InboundAudio(VideoStreamTrack(), lambda pcm: None)


class _DtlsTransportStub:
    state = "new"  # all RTCRtpReceiver() looks at


def _opus_packet(sequence_number: int) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=sequence_number, timestamp=960 * sequence_number)
    packet._data = b"opus"  # what aiortc's depacketizer stores for the decoder
    return packet


def test_release_audio_promptly_hands_on_each_packet_once_the_next_arrives():
    receiver = RTCRtpReceiver("audio", _DtlsTransportStub())
    release_audio_promptly(receiver)
    jitter_buffer = receiver._RTCRtpReceiver__jitter_buffer

    assert jitter_buffer.add(_opus_packet(0))[1] is None
    released = jitter_buffer.add(_opus_packet(1))[1]
    assert released is not None and released.timestamp == 0


def test_release_audio_promptly_refuses_a_video_receiver():
    with pytest.raises(TypeError, match="audio RTCRtpReceiver"):
        release_audio_promptly(RTCRtpReceiver("video", _DtlsTransportStub()))
