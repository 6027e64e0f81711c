from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError

from media.opus import OpusTrack
from media.outbound import FRAME_SAMPLES, OutboundAudioTrack
from tests.clock import FakeClock


def tone(seconds: float, rate: int = 24_000) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 300 * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


@pytest.fixture
def source() -> OutboundAudioTrack:
    clock = FakeClock()
    return OutboundAudioTrack(clock=clock, sleep=clock.sleep)


async def test_one_packet_per_frame_stamped_with_the_frames_clock(source: OutboundAudioTrack) -> None:
    track = OpusTrack(source)
    packets = [await track.recv() for _ in range(10)]
    assert all(isinstance(packet, av.Packet) for packet in packets)
    assert [packet.pts for packet in packets] == [index * FRAME_SAMPLES for index in range(10)]
    assert {packet.time_base for packet in packets} == {Fraction(1, 48_000)}


async def test_a_peer_decodes_the_answer_at_its_level_and_silence_as_silence(source: OutboundAudioTrack) -> None:
    """What aiortc's receiver does with the packets: decode as stereo Opus, the peer's default."""
    track = OpusTrack(source)
    decoder = OpusDecoder()

    async def heard(frames: int) -> np.ndarray:
        pcm = []
        for _ in range(frames):
            packet = await track.recv()
            for frame in decoder.decode(JitterFrame(data=bytes(packet), timestamp=packet.pts)):
                pcm.append(frame.to_ndarray().reshape(-1, 2).mean(axis=1) / 32768)
        return np.concatenate(pcm)

    assert np.abs(await heard(10)).max() < 1e-3
    source.write(tone(1.0))
    answer = await heard(50)
    # 0.3 peak sine: RMS 0.212 (Opus at 48 kbit/s keeps a plain tone's level within a few %).
    assert float(np.sqrt(np.mean(answer[2400:] ** 2))) == pytest.approx(0.3 / np.sqrt(2), rel=0.1)
    assert source.played_samples == 24_000


async def test_stopping_stops_the_source(source: OutboundAudioTrack) -> None:
    track = OpusTrack(source)
    await track.recv()
    track.stop()
    assert source.readyState == "ended"
    with pytest.raises(MediaStreamError):
        await track.recv()
