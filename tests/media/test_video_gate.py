"""The camera's decoder gate: on its own with coded frames, and before aiortc's own decoder thread
(``decoder_worker``, fed as ``RTCRtpReceiver.receive`` feeds it) with a real receiver's track."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import av
import pytest
from aiortc import RTCRtpCodecParameters, RTCRtpReceiver
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpreceiver import RemoteStreamTrack, decoder_worker

from media.video_gate import (
    KEY_FRAME_REQUEST_INTERVAL_S,
    MAX_DECODED_FRAMES,
    MAX_PENDING_FRAMES,
    DecoderFeed,
    NewestFrames,
    VideoGate,
    gate_video_receiver,
)
from tests import hostile_video
from tests.clock import FakeClock

VP8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90_000, payloadType=96)
SMALL = (64, 48)
HUGE = (2048, 1152)  # 2.4 MP, past the default 1920x1080


def vp8(size: tuple[int, int], count: int = 3) -> tuple[bytes, ...]:
    return hostile_video.coded_frames("libvpx", *size, count=count)


class Wanted:
    def __init__(self) -> None:
        self.now = True

    def __call__(self) -> bool:
        return self.now


def gate(wanted: Wanted | None = None, clock: FakeClock | None = None) -> tuple[VideoGate, list[float]]:
    asked: list[float] = []
    clock = clock or FakeClock()
    return VideoGate(wanted=wanted or Wanted(), ask_key_frame=lambda: asked.append(clock.now), clock=clock), asked


def test_a_stream_past_the_bound_is_refused_from_its_key_frame_until_one_within_it():
    video, _ = gate()
    admitted = [video.admit("VP8", frame) for frame in (*vp8(HUGE), *vp8(SMALL))]
    assert admitted == [False] * 3 + [True] * 3
    assert video.frames_refused == 3 and video.frames_passed == 0  # the feed counts what it passes


def test_an_h264_stream_past_the_bound_is_refused_from_its_sequence_parameter_set():
    video, _ = gate()
    huge = hostile_video.coded_frames("libx264", *HUGE, count=2)
    small = hostile_video.coded_frames("libx264", *SMALL, count=2)
    assert [video.admit("H264", frame) for frame in (*huge, *small)] == [False, False, True, True]


def test_nothing_is_decoded_while_no_frame_is_wanted_and_a_key_frame_is_asked_for_after():
    wanted, clock = Wanted(), FakeClock()
    video, asked = gate(wanted, clock)
    key, *inter = vp8(SMALL, count=4)
    assert video.admit("VP8", key)
    wanted.now = False
    assert not any(video.admit("VP8", frame) for frame in inter)
    assert video.frames_skipped == 3 and asked == []
    wanted.now = True
    assert [video.admit("VP8", frame) for frame in inter] == [False] * 3  # they need the key frame skipped
    assert asked == [clock.now]  # once: the peer answers within a round trip
    clock.now += KEY_FRAME_REQUEST_INTERVAL_S
    assert not video.admit("VP8", inter[0])
    assert len(asked) == 2  # still waiting a second later: asked again
    assert video.admit("VP8", key) and video.admit("VP8", inter[0])


class Transport:
    """What a receiver needs of its DTLS transport until it receives."""

    state = "new"


def receiver_with_track(kind: str) -> Any:
    """A receiver as ``setRemoteDescription`` leaves it: with its remote track, not receiving yet."""
    receiver: Any = RTCRtpReceiver(kind, Transport())  # type: ignore[arg-type]
    receiver._track = RemoteStreamTrack(kind)
    return receiver


@contextlib.asynccontextmanager
async def decoding(max_pixels: int = 1920 * 1080, wanted: Wanted | None = None) -> AsyncIterator[tuple[Any, VideoGate]]:
    """A real video receiver, gated, and aiortc's decoder thread started on its queues as
    ``receive()`` starts it; yields the receiver (its private state) and the gate."""
    receiver = receiver_with_track("video")
    video = gate_video_receiver(receiver, wanted=wanted or Wanted(), max_pixels=max_pixels)
    feed, track = receiver._RTCRtpReceiver__decoder_queue, receiver.track
    thread = threading.Thread(
        target=decoder_worker, args=(asyncio.get_running_loop(), feed, track._queue, threading.Event()), daemon=True
    )
    thread.start()
    try:
        yield receiver, video
    finally:
        feed.put(None)
        await asyncio.to_thread(thread.join, 30)


async def decoded(track: Any, count: int) -> list[av.VideoFrame]:
    async with asyncio.timeout(30):
        return [await track.recv() for _ in range(count)]


async def test_a_frame_past_the_bound_never_reaches_the_decoder_and_one_within_it_does():
    async with decoding() as (receiver, video):
        for timestamp, frame in enumerate((*vp8(HUGE), *vp8(SMALL, count=1))):
            receiver._RTCRtpReceiver__decoder_queue.put((VP8, JitterFrame(frame, timestamp)))
        [first] = await decoded(receiver.track, 1)
    assert (first.width, first.height) == SMALL
    assert video.frames_refused == 3 and video.frames_passed == 1


async def test_the_track_keeps_the_newest_decoded_frames_for_a_reader_that_falls_behind():
    async with decoding() as (receiver, video):
        frames = vp8(SMALL, count=8)
        for timestamp, frame in enumerate(frames):
            receiver._RTCRtpReceiver__decoder_queue.put((VP8, JitterFrame(frame, timestamp)))
        async with asyncio.timeout(30):
            while receiver.track._queue.frames_dropped < len(frames) - MAX_DECODED_FRAMES:
                await asyncio.sleep(0.01)  # nothing reads the track meanwhile
        kept = await decoded(receiver.track, MAX_DECODED_FRAMES)
    assert [frame.pts for frame in kept] == [6, 7]
    assert video.frames_passed == 8


async def test_frames_waiting_for_a_decoder_that_falls_behind_are_dropped_and_a_key_frame_asked_for():
    wanted = Wanted()
    video, asked = gate(wanted)
    feed = DecoderFeed(video)  # nothing reads it: a decoder thread that does not keep up
    frames = vp8(SMALL, count=MAX_PENDING_FRAMES + 2)
    for timestamp, frame in enumerate(frames):
        feed.put((VP8, JitterFrame(frame, timestamp)))
    feed.put(None)  # the receiver stopping: always taken
    assert video.frames_passed == MAX_PENDING_FRAMES
    assert video.frames_dropped == MAX_PENDING_FRAMES + 2  # the pending ones and the next, then one waiting for a key frame
    assert len(asked) == 1
    assert feed.get() is None


async def test_a_full_track_queue_pushes_out_its_oldest_frame_never_its_end():
    queue = NewestFrames()
    for n in range(5):
        await queue.put(n)
    await queue.put(None)
    assert [queue.get_nowait() for _ in range(queue.qsize())] == [4, None]
    assert queue.frames_dropped == 4


async def test_a_receiver_whose_decoder_has_started_is_not_gated():
    receiver = receiver_with_track("video")
    receiver._RTCRtpReceiver__decoder_thread = threading.current_thread()
    with pytest.raises(RuntimeError, match="before media flows"):
        gate_video_receiver(receiver, wanted=Wanted())
    with pytest.raises(TypeError, match="video RTCRtpReceiver"):
        gate_video_receiver(receiver_with_track("audio"), wanted=Wanted())
