"""PlayoutTrack and the receiver tap: aiortc's receiver feeds the jitter buffer, the track yields its frames."""

from __future__ import annotations

import asyncio

import av
import pytest
from aiortc import RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RtpPacket

from media.aiortc_version import UnsupportedAiortc
from media.playout import PlayoutTrack, receive_audio
from media.receiver_tap import check_receiver_tap, tap_audio_receiver
from tests.media.test_jitter_buffer import FRAME, speech_packets


class SilentRemote(MediaStreamTrack):
    """aiortc's remote track behind a tap: yields no frame, only its end."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.ended = asyncio.Event()

    async def recv(self) -> av.AudioFrame:
        await self.ended.wait()
        raise MediaStreamError


class _DtlsTransportStub:
    state = "new"  # all RTCRtpReceiver() looks at


def rtp(sequence: int, payload: bytes) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=1234 + sequence * FRAME)
    packet._data = payload  # what aiortc's depacketizer stores for its jitter buffer
    return packet


async def test_frames_come_in_order_with_their_origin_and_rtp_time() -> None:
    packets = speech_packets(0)
    track = PlayoutTrack(SilentRemote())
    loop = asyncio.get_running_loop()
    for sequence in (0, 1, 3):  # 2 is lost: concealed at its deadline, ~40 ms on
        track.push(sequence, 5000 + sequence * FRAME, packets[sequence], loop.time())
    frames = [await asyncio.wait_for(track.recv(), 5) for _ in range(4)]
    assert [(frame.pts, frame.opaque) for frame in frames] == [
        (0, "packet"), (FRAME, "packet"), (2 * FRAME, "plc"), (3 * FRAME, "packet")
    ]
    assert {(frame.sample_rate, frame.layout.name, frame.samples) for frame in frames} == {(48_000, "mono", FRAME)}
    track.stop()


async def test_frames_released_together_are_handed_out_one_loop_iteration_apart() -> None:
    """A backlog (here 0.8 s of packets read at once after a stall) must not hold the loop while
    its reader resamples and runs the VAD over each frame: other calls' pacing shares it."""
    packets = speech_packets(0)
    t0 = 100.0
    track = PlayoutTrack(SilentRemote(), clock=lambda: t0 + 1.0)
    for sequence in range(40):
        track.push(sequence, sequence * FRAME, packets[sequence], t0 + sequence * 0.02)
    turns = 0

    async def other_call() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    neighbour = asyncio.ensure_future(other_call())
    await asyncio.sleep(0)
    start = turns
    frames = [await track.recv() for _ in range(40)]
    neighbour.cancel()
    await asyncio.gather(neighbour, return_exceptions=True)
    assert [frame.pts for frame in frames] == [sequence * FRAME for sequence in range(40)]
    assert turns - start >= 39  # the neighbour ran between every two frames
    track.stop()


async def test_the_track_ends_when_the_receivers_own_track_ends() -> None:
    remote = SilentRemote()
    track = PlayoutTrack(remote)
    waiting = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0)
    remote.ended.set()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(waiting, 5)
    assert track.readyState == "ended"


@pytest.mark.parametrize("turns", range(8))
async def test_a_reader_cancelled_while_the_track_wakes_is_cancelled(turns: int) -> None:
    """Cancelled ``turns`` loop turns after a packet woke recv(): at 3 and 4 the cancellation
    landed while recv() cleaned up its wait, was swallowed, and the reader ran on."""
    track = PlayoutTrack(SilentRemote())
    reader = asyncio.ensure_future(track.recv())
    for _ in range(3):
        await asyncio.sleep(0)  # recv() waits: nothing buffered, no deadline
    track.push(0, 0, b"", asyncio.get_running_loop().time())  # an empty payload wakes it and buffers nothing
    for _ in range(turns):
        await asyncio.sleep(0)
    reader.cancel()
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(reader), 5)
    finally:
        track.stop()


async def test_a_tapped_receiver_hands_its_packets_to_the_playout_track() -> None:
    packets = speech_packets(0)
    receiver = RTCRtpReceiver("audio", _DtlsTransportStub())
    receiver._track = SilentRemote()  # what the peer connection gives an audio receiver
    track = receive_audio(receiver)
    assert isinstance(track, PlayoutTrack)
    buffer = receiver._RTCRtpReceiver__jitter_buffer
    for sequence in range(3):
        assert buffer.add(rtp(sequence, packets[sequence])) == (False, None)  # nothing for aiortc's decoder
    frames = [await asyncio.wait_for(track.recv(), 5) for _ in range(3)]
    assert [frame.opaque for frame in frames] == ["packet"] * 3
    assert track.stats.packets_received == 3
    track.stop()


def test_aiortcs_own_buffer_stalls_where_the_tap_does_not() -> None:
    """Today's path (jitter_buffer off): after a lost packet nothing is released for 15 packets."""
    packets = speech_packets(0)
    receiver = RTCRtpReceiver("audio", _DtlsTransportStub())
    receiver._track = SilentRemote()
    receive_audio(receiver, jitter_buffer=False)
    buffer = receiver._RTCRtpReceiver__jitter_buffer
    released = [buffer.add(rtp(sequence, packets[sequence]))[1] for sequence in range(18) if sequence != 2]
    assert [frame is not None for frame in released[:2]] == [False, True]  # each once the next arrives
    assert all(frame is None for frame in released[2:15])  # 15 packets (300 ms) stuck behind the hole


def test_an_untested_aiortc_is_refused_with_the_way_out() -> None:
    with pytest.raises(UnsupportedAiortc, match="OMNI_RTC_JITTER_BUFFER=false"):
        check_receiver_tap("1.99.0")
    check_receiver_tap("1.16.2")


def test_the_tap_refuses_a_video_receiver() -> None:
    with pytest.raises(TypeError, match="audio RTCRtpReceiver"):
        tap_audio_receiver(RTCRtpReceiver("video", _DtlsTransportStub()), lambda *packet: None)
