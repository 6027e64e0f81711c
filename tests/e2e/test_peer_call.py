"""The call glue with real aiortc peers on 127.0.0.1 and a recording stand-in for the session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcsctptransport import USERDATA_MAX_LENGTH

from app.client.webrtc import MicrophoneTrack
from app.transports.webrtc import peer_call as call_module
from app.transports.webrtc.ice import loopback_candidates, rtc_configuration
from app.transports.webrtc.peer_call import MAX_QUEUED_MESSAGES, Call, OfferError
from app.transports.webrtc.sctp_guard import MAX_UNDELIVERED_BYTES, Refusal, SctpGuard, guard_data_channel
from media.frames import FramePlan, SampledFrame
from tests import hostile_sctp, hostile_video

pytestmark = pytest.mark.e2e

# Generous: waiting is not measured, a call that never gets there fails the wait.
DEADLINE_S = 30.0


class RecordingSession:
    """Sends three events on start, echoes every message, counts the audio it is given."""

    def __init__(self, output: Any, send: Callable[[dict[str, Any]], None]) -> None:
        self.busy: asyncio.Event | None = None  # when set, handling waits until it is set
        self.output = output
        self.send = send
        self.messages: list[str] = []
        self.audio_samples = 0
        self.audio_dtypes: set[str] = set()
        self.closed = False
        self.transport_events: list[dict[str, Any]] = []  # what the call sent of its own

    async def start(self) -> None:
        for number in range(3):
            self.send({"type": "early", "number": number})

    async def handle_message(self, raw: str | bytes) -> None:
        if self.busy is not None:
            await self.busy.wait()
        self.messages.append(raw if isinstance(raw, str) else raw.decode())
        self.send({"type": "echo", "raw": self.messages[-1]})

    echo_cancellation = False  # the peer's audio as it arrives: what this test counts
    flooding = False  # the flood these tests send is the channel's to bound, not the session's

    def push_audio(self, pcm: np.ndarray) -> None:
        self.audio_samples += len(pcm)
        self.audio_dtypes.add(str(pcm.dtype))

    async def close(self) -> None:
        self.closed = True

    def video_plan(self) -> None:
        return None  # the camera is off: frames are read and none kept

    def add_video_frame(self, frame: Any) -> None:
        raise AssertionError("no frame is kept while the camera is off")

    def on_playback_started(self) -> None:
        pass

    def on_playback_stopped(self) -> None:
        pass

    def transport_sent(self, event: dict[str, Any]) -> None:
        self.transport_events.append(event)


class WatchingSession(RecordingSession):
    """Wants a camera frame every 50 ms, scaled to a 32nd of its size; keeps what it is given."""

    def __init__(self, output: Any, send: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(output, send)
        self.frames: list[SampledFrame] = []

    def video_plan(self) -> FramePlan:  # type: ignore[override]
        return FramePlan(0.05, lambda width, height: (max(width // 32, 1), max(height // 32, 1)))

    def add_video_frame(self, frame: SampledFrame) -> None:
        self.frames.append(frame)


@contextlib.asynccontextmanager
async def call_under_test(
    session: type[RecordingSession] = RecordingSession, **options: Any
) -> AsyncIterator[tuple[Call, list[Any], list[str]]]:
    sessions: list[RecordingSession] = []
    reasons: list[str] = []

    def make_session(output: Any, send: Callable[[dict[str, Any]], None]) -> RecordingSession:
        sessions.append(session(output, send))
        return sessions[-1]

    call = Call(
        make_session=make_session,
        configuration=rtc_configuration([]),
        ice_loopback=True,
        on_closed=lambda call, reason: reasons.append(reason),
        **options,
    )
    try:
        yield call, sessions, reasons
    finally:
        await call.close()


@contextlib.asynccontextmanager
async def peer(
    microphone: MicrophoneTrack | None = None, camera: MediaStreamTrack | None = None
) -> AsyncIterator[tuple[RTCPeerConnection, RTCDataChannel, list[dict]]]:
    pc = RTCPeerConnection(rtc_configuration([]))
    received: list[dict] = []
    channel = pc.createDataChannel("oai-events")
    channel.on("message", lambda message: received.append(json.loads(message)))
    pc.addTrack(microphone or MicrophoneTrack())
    if camera is not None:
        pc.addTransceiver(camera, direction="sendonly")
    with loopback_candidates():
        await pc.setLocalDescription(await pc.createOffer())
    try:
        yield pc, channel, received
    finally:
        await pc.close()


async def connect(call: Call, pc: RTCPeerConnection) -> None:
    answer = await call.answer(pc.localDescription.sdp)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not condition():
            await asyncio.sleep(0.02)


async def test_events_sent_before_the_channel_opens_arrive_first_and_in_order():
    async with call_under_test() as (call, _, _), peer() as (pc, _, received):
        await connect(call, pc)
        await until(lambda: len(received) >= 3)
    assert [event["number"] for event in received[:3]] == [0, 1, 2]


async def test_client_messages_reach_the_session_in_order():
    async with call_under_test() as (call, sessions, _), peer() as (pc, channel, received):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        for number in range(20):
            channel.send(json.dumps({"type": "probe", "n": number}))
        await until(lambda: len(sessions[0].messages) == 20)
    assert [json.loads(raw)["n"] for raw in sessions[0].messages] == list(range(20))


async def test_a_flood_of_client_events_is_bounded_and_the_excess_answered_with_errors():
    flood = MAX_QUEUED_MESSAGES + 40
    async with call_under_test() as (call, sessions, _), peer() as (pc, channel, received):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open" and bool(sessions))
        sessions[0].busy = asyncio.Event()  # the session is stuck on one event meanwhile
        for number in range(flood):
            channel.send(json.dumps({"type": "probe", "n": number}))
        await until(lambda: sum(event.get("type") == "error" for event in received) >= flood - MAX_QUEUED_MESSAGES - 1)
        sessions[0].busy.set()
        errors = [event for event in received if event.get("type") == "error"]
        await until(lambda: len(sessions[0].messages) + len(errors) == flood)
    assert {event["error"]["code"] for event in errors} == {"rate_limit_exceeded"}
    assert len(sessions[0].messages) + len(errors) == flood
    # The call's own refusals reach the session's observers (a recording, the traces) as sent.
    assert sessions[0].transport_events == errors
    assert [json.loads(raw)["n"] for raw in sessions[0].messages] == sorted(json.loads(raw)["n"] for raw in sessions[0].messages)


async def test_events_dropped_in_a_flood_are_logged_once_a_second_not_once_an_event(caplog: pytest.LogCaptureFixture):
    flood = MAX_QUEUED_MESSAGES + 400
    async with call_under_test() as (call, sessions, _), peer() as (pc, channel, received):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open" and bool(sessions))
        sessions[0].busy = asyncio.Event()
        with caplog.at_level(logging.WARNING, logger="app.transports.webrtc.peer_call"):
            for number in range(flood):
                channel.send(json.dumps({"type": "probe", "n": number}))
            await until(lambda: sum(event.get("type") == "error" for event in received) >= 399)
        sessions[0].busy.set()
    warnings = [record.getMessage() for record in caplog.records if "client events wait to be handled" in record.getMessage()]
    # 400 dropped within a second or so (one error event each all the same): a line a second, not 400.
    assert 1 <= len(warnings) <= 10


async def test_a_peer_that_ignores_the_receive_window_ends_its_call_before_its_message_fills_memory(
    monkeypatch: pytest.MonkeyPatch,
):
    """One 8 MiB message that the peer sends past the answer's max-message-size (256 KiB) and the
    1 MiB window the server advertised: aiortc would reassemble all of it. The call's own SCTP
    transport is kept to measure what it holds (the data in its reassembly queue) once refused."""
    transports: list[Any] = []

    def guard_and_keep(transport: Any, on_refused: Callable[[Refusal], None], **limits: Any) -> SctpGuard:
        transports.append(transport)
        return guard_data_channel(transport, on_refused, **limits)

    monkeypatch.setattr(call_module, "guard_data_channel", guard_and_keep)
    async with call_under_test() as (call, sessions, reasons), peer() as (pc, channel, _):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        assert pc.sctp is not None
        pc.sctp._remote_max_message_size = 0  # this peer reads no a=max-message-size
        channel.send(b"x" * (4 * MAX_UNDELIVERED_BYTES))
        await until(lambda: reasons == ["data_channel_overrun"])
        (server_transport,) = transports
        held = sum(len(chunk.user_data) for stream in server_transport._inbound_streams.values()
                   for chunk in stream.reassembly)
    assert MAX_UNDELIVERED_BYTES < held <= MAX_UNDELIVERED_BYTES + USERDATA_MAX_LENGTH  # a quarter of the message
    assert sessions[0].messages == []


async def test_messages_of_the_largest_size_in_a_burst_are_delivered_without_ending_the_call():
    """Twelve 250 KB messages at once (3 MB, past the guard's bound if it counted delivered data)."""
    async with call_under_test() as (call, sessions, reasons), peer() as (pc, channel, _):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        for number in range(12):
            channel.send(json.dumps({"type": "probe", "n": number, "padding": "x" * 250_000}))
        await until(lambda: len(sessions[0].messages) == 12)
        assert reasons == []
    assert [json.loads(raw)["n"] for raw in sessions[0].messages] == list(range(12))


async def test_a_peer_sending_data_chunks_with_no_user_data_is_ended():
    """RFC 4960 §6.2: a DATA chunk has at least one byte. aiortc kept each and counted 0 bytes
    (200,000 of them held 33 MB)."""
    async with call_under_test() as (call, sessions, reasons), peer() as (pc, channel, _):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        assert pc.sctp is not None
        await hostile_sctp.send(pc.sctp, hostile_sctp.zero_length(hostile_sctp.next_tsn(pc.sctp), 2_000))
        await until(lambda: reasons == ["data_channel_violation"])
    assert sessions[0].messages == []


async def test_a_peer_skipping_every_other_tsn_is_ended_once_it_keeps_sending_past_the_window():
    """One-byte chunks with every other TSN missing: aiortc sorted every one it held on each chunk
    (16,000 took 31 s of loop time) and counted 16 KB."""
    async with call_under_test() as (call, _, reasons), peer() as (pc, channel, _):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        assert pc.sctp is not None
        await hostile_sctp.send(pc.sctp, hostile_sctp.gapped(hostile_sctp.next_tsn(pc.sctp), 6_000))
        await until(lambda: reasons == ["data_channel_overrun"])


async def test_a_message_sent_in_one_byte_fragments_ends_the_call_past_the_held_chunk_bound():
    """4 KB of data, but 4,000 chunks aiortc keeps and walks for every one."""
    async with call_under_test() as (call, sessions, reasons), peer() as (pc, channel, _):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        assert pc.sctp is not None
        await hostile_sctp.send(pc.sctp, hostile_sctp.fragments(hostile_sctp.next_tsn(pc.sctp), 4_000))
        await until(lambda: reasons == ["data_channel_overrun"])
    assert sessions[0].messages == []


HUGE_CAMERA = (2048, 1152)  # 2.4 MP: past the 1920x1080 decoded by default
SMALL_CAMERA = (64, 48)


async def test_a_camera_past_the_decoded_size_is_never_decoded_and_one_within_it_is():
    """aiortc decoded frames of any size (a 4096x4096 VP8 stream held 353 MB). The
    same peer's camera turns small: from then on its frames reach the session, and only those."""
    camera = hostile_video.CodedVideoTrack(hostile_video.coded_frames("libvpx", *HUGE_CAMERA, count=2), fps=10)
    async with call_under_test(WatchingSession) as (call, sessions, reasons), peer(camera=camera) as (pc, _, _):
        await connect(call, pc)
        await until(lambda: camera.sent >= 20)  # two seconds of the huge stream
        camera.replace(hostile_video.coded_frames("libvpx", *SMALL_CAMERA, count=2))
        await until(lambda: len(sessions[0].frames) >= 3)
        assert reasons == []
    small = (SMALL_CAMERA[0] // 32, SMALL_CAMERA[1] // 32)
    assert {(frame.width, frame.height) for frame in sessions[0].frames} == {small}


async def test_no_camera_frame_is_decoded_while_the_session_wants_none():
    camera = hostile_video.CodedVideoTrack(hostile_video.coded_frames("libvpx", *SMALL_CAMERA, count=2), fps=20)
    async with call_under_test() as (call, _, _), peer(camera=camera) as (pc, _, _):
        await connect(call, pc)
        await until(lambda: call._video is not None and camera.sent >= 20)
        video = call._video
        assert video is not None
        # aiortc decoded every frame for the sampler to throw away; the gate skips them undecoded.
        await until(lambda: video.frames_received > 0 or video.gate.frames_skipped >= 10)
        assert video.frames_received == 0
        assert video.gate.frames_passed == 0


async def test_peer_audio_reaches_the_session_as_16khz_float32():
    microphone = MicrophoneTrack()
    async with call_under_test() as (call, sessions, _), peer(microphone) as (pc, _, _):
        await connect(call, pc)
        microphone.play(np.zeros(48_000, dtype=np.float32))
        await until(lambda: sessions[0].audio_samples >= 8_000)  # half a second at 16 kHz
    assert sessions[0].audio_dtypes == {"float32"}


async def test_peer_close_ends_the_call_and_closes_the_session():
    async with call_under_test() as (call, sessions, reasons), peer() as (pc, channel, _):
        await connect(call, pc)
        await until(lambda: channel.readyState == "open")
        await pc.close()
        async with asyncio.timeout(DEADLINE_S):
            await call.closed.wait()
    assert sessions[0].closed
    assert reasons == ["connection_closed"]


async def test_peer_that_stops_sending_media_is_released_after_the_disconnect_timeout():
    microphone = MicrophoneTrack()
    async with call_under_test(disconnect_timeout_s=0.5) as (call, sessions, reasons), peer(microphone) as (pc, _, _):
        await connect(call, pc)
        await until(lambda: sessions[0].audio_samples > 0)
        microphone.stop()  # the sender stops; ICE and DTLS stay up, as with a frozen tab
        async with asyncio.timeout(DEADLINE_S):
            await call.closed.wait()
    assert reasons == ["peer_gone"]
    assert sessions[0].closed


async def test_peer_that_never_connects_is_released_after_the_connect_timeout():
    async with call_under_test(connect_timeout_s=0.5) as (call, sessions, reasons), peer() as (pc, _, _):
        await call.answer(pc.localDescription.sdp)  # the answer never reaches the peer
        async with asyncio.timeout(DEADLINE_S):
            await call.closed.wait()
    assert reasons == ["connect_timeout"]
    assert sessions[0].closed


async def test_a_call_says_once_that_its_peer_connected():
    connected: list[Call] = []
    async with call_under_test(on_connected=connected.append) as (call, _, _), peer() as (pc, _, _):
        await connect(call, pc)
        await until(lambda: bool(connected))
    assert connected == [call]


async def test_close_is_safe_twice():
    async with call_under_test() as (call, sessions, reasons), peer() as (pc, _, _):
        await connect(call, pc)
        await call.close("hangup")
        await call.close("again")
    assert reasons == ["hangup"]


@pytest.mark.parametrize("kind", ["audio", "video"])
async def test_an_offer_with_a_second_audio_or_video_m_line_is_refused(kind: str):
    """aiortc would decode the second line's media into a queue nobody reads."""
    async with call_under_test() as (call, _, _):
        pc = RTCPeerConnection(rtc_configuration([]))
        pc.createDataChannel("oai-events")
        for line in ["audio", "audio"] if kind == "audio" else ["audio", "video", "video"]:
            pc.addTransceiver(line)
        with loopback_candidates():
            await pc.setLocalDescription(await pc.createOffer())
        try:
            with pytest.raises(OfferError, match=f"more than one {kind} m-line"):
                await call.answer(pc.localDescription.sdp)
        finally:
            await pc.close()


async def test_offer_without_a_data_channel_is_refused():
    async with call_under_test() as (call, _, _):
        pc = RTCPeerConnection(rtc_configuration([]))
        pc.addTransceiver("audio")
        with loopback_candidates():
            await pc.setLocalDescription(await pc.createOffer())
        try:
            with pytest.raises(OfferError, match="data channel"):
                await call.answer(pc.localDescription.sdp)
        finally:
            await pc.close()

