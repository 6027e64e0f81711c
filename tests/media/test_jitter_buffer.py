"""The jitter buffer's mechanisms, one test each, on real Opus packets of a speech fixture."""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest
import soxr

from media.jitter_buffer import (
    MAX_BUFFERED_PACKETS,
    MAX_DEPTH_S,
    MAX_IDLE_CONCEAL_S,
    RELEASE_RATE,
    START_DEPTH_S,
    AudioJitterBuffer,
    PlayoutFrame,
)
from media.libopus import OpusDecoder, OpusEncoder, carries_fec
from tests.speech import load_fixture

FRAME = 960  # 20 ms at 48 kHz
FRAME_S = 0.02
T0 = 100.0  # arrival of packet 0 on the test's clock


@functools.cache
def speech_packets(expected_loss: int) -> tuple[bytes, ...]:
    """tests/fixtures/hello.wav as 20 ms Opus packets, FEC tuned for ``expected_loss`` % (0: none)."""
    pcm = soxr.resample(load_fixture("hello"), 16_000, 48_000)
    samples = np.clip(np.rint(pcm * 32767), -32768, 32767).astype(np.int16)
    encoder = OpusEncoder(bitrate=48_000)
    encoder.set_expected_loss(expected_loss)
    return tuple(encoder.encode(samples[start : start + FRAME]) for start in range(0, samples.size - FRAME, FRAME))


def push(buffer: AudioJitterBuffer, packets: tuple[bytes, ...], sequences: list[int], *, late_by: float = 0.0) -> None:
    """Packets ``sequences`` arriving on time (each 20 ms after the previous) plus ``late_by``."""
    for sequence in sequences:
        buffer.push(sequence, sequence * FRAME, packets[sequence], T0 + sequence * FRAME_S + late_by)


def play_all(buffer: AudioJitterBuffer, until: float) -> list[PlayoutFrame]:
    return buffer.pop(until)


def reference(packets: tuple[bytes, ...], before: int) -> OpusDecoder:
    """A decoder that has decoded ``packets[:before]``, as the buffer's has."""
    decoder = OpusDecoder()
    for packet in packets[:before]:
        decoder.decode(packet)
    return decoder


def voiced_index(packets: tuple[bytes, ...]) -> int:
    """A packet in the middle of the speech whose successor carries FEC for it."""
    return next(index for index in range(20, len(packets) - 1) if carries_fec(packets[index + 1]))


def test_packets_in_order_are_released_on_arrival_without_waiting() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    released = []
    for sequence in range(10):
        push(buffer, packets, [sequence])
        released += buffer.pop(T0 + sequence * FRAME_S)  # the very moment it arrived
    assert [frame.origin for frame in released] == ["packet"] * 10
    assert [frame.timestamp for frame in released] == [index * FRAME for index in range(10)]


def test_a_single_lost_packet_is_rebuilt_from_the_next_packets_fec() -> None:
    packets = speech_packets(10)
    lost = voiced_index(packets)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [index for index in range(lost + 3) if index != lost])
    frames = buffer.pop(T0 + (lost + 3) * FRAME_S)  # before the slot after the last packet is due

    assert [frame.origin for frame in frames] == ["packet"] * lost + ["fec"] + ["packet"] * 2
    expected = reference(packets, lost).decode_fec(packets[lost + 1], FRAME)
    np.testing.assert_array_equal(frames[lost].pcm, expected)
    # Rebuilt, not invented: the FEC frame is the lost frame at a lower bitrate, PLC is not.
    truth = reference(packets, lost).decode(packets[lost])
    plc = reference(packets, lost).conceal(FRAME)
    assert np.sum((frames[lost].pcm - truth.astype(float)) ** 2) < np.sum((plc - truth.astype(float)) ** 2)
    assert buffer.stats.frames_recovered == 1 and buffer.stats.frames_concealed == 0


def test_a_lost_packet_without_fec_is_concealed_by_plc() -> None:
    packets = speech_packets(0)  # no expected loss: libopus sends no FEC
    lost = 30
    assert not carries_fec(packets[lost + 1])
    buffer = AudioJitterBuffer()
    push(buffer, packets, [index for index in range(lost + 3) if index != lost])
    frames = buffer.pop(T0 + (lost + 3) * FRAME_S)

    assert [frame.origin for frame in frames] == ["packet"] * lost + ["plc"] + ["packet"] * 2
    np.testing.assert_array_equal(frames[lost].pcm, reference(packets, lost).conceal(FRAME))
    assert buffer.stats.frames_concealed == 1 and buffer.stats.frames_recovered == 0


def test_a_stalled_sequence_is_released_at_the_missing_frames_deadline() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [0, 1, 2, 3, 4, 6, 7, 8, 9])  # 5 never comes
    before = buffer.pop(T0 + 6 * FRAME_S)  # when 6 came
    assert [frame.timestamp // FRAME for frame in before] == [0, 1, 2, 3, 4]  # held behind the hole
    deadline = buffer.next_deadline()
    assert deadline is not None
    assert buffer.pop(deadline - 0.001) == []
    # Due when packet 5 would have been, plus the buffer's depth: nothing stalls until 16 packets pile up.
    assert deadline == pytest.approx(T0 + 5 * FRAME_S + buffer.depth_s)
    after = buffer.pop(deadline)
    assert [(frame.timestamp // FRAME, frame.origin) for frame in after] == [
        (5, "plc"), (6, "packet"), (7, "packet"), (8, "packet"), (9, "packet")
    ]


def test_a_packet_after_its_deadline_is_dropped_and_counted_late() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [0, 1, 3, 4])
    assert [frame.origin for frame in buffer.pop(T0 + 4 * FRAME_S)] == ["packet", "packet"]
    assert [frame.origin for frame in buffer.pop(T0 + 2 * FRAME_S + buffer.depth_s)] == ["plc", "packet", "packet"]
    push(buffer, packets, [2], late_by=buffer.depth_s)  # its slot has been concealed
    push(buffer, packets, [5])
    frames = buffer.pop(T0 + 5 * FRAME_S)
    assert [frame.timestamp // FRAME for frame in frames] == [5]
    assert buffer.stats.packets_late == 1
    assert buffer.stats.packets_lost == 0  # it arrived: late, not lost


def test_a_stream_that_comes_later_from_some_packet_on_loses_only_the_slots_concealed_meanwhile() -> None:
    """A sender that stalled 300 ms with its timestamps going on: packets 30 on come 300 ms late.
    The first late packet moves the deadline to them; the fastest packets of the last 2 s do not
    keep every later one late."""
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    shift = 0.3
    arrivals = [(T0 + sequence * FRAME_S + (shift if sequence >= 30 else 0.0), sequence)
                for sequence in range(len(packets))]
    played: list[PlayoutFrame] = []
    now, end = T0, arrivals[-1][0] + 0.5
    while now < end:  # a reader that pops every 5 ms, a packet as it arrives
        while arrivals and arrivals[0][0] <= now:
            _, sequence = arrivals.pop(0)
            buffer.push(sequence, sequence * FRAME, packets[sequence], now)
        played.extend(buffer.pop(now))
        now += 0.005
    # Concealed while nothing came: the depth's wait, then at most 200 ms, one frame per period.
    assert buffer.stats.packets_late <= MAX_IDLE_CONCEAL_S / FRAME_S
    decoded = [frame.timestamp // FRAME for frame in played if frame.origin == "packet"]
    assert decoded[-1] == len(packets) - 1
    assert len(decoded) == len(packets) - buffer.stats.packets_late
    assert len(packets) - 30 > 2 * buffer.stats.packets_late  # most of what came late is heard


def test_reordered_and_duplicated_packets_play_once_in_order() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    arrivals = ((0, 0.0), (2, 0.040), (1, 0.041), (1, 0.042), (3, 0.060), (0, 0.061))  # 1 overtaken by 2
    for sequence, arrival in arrivals:
        buffer.push(sequence, sequence * FRAME, packets[sequence], T0 + arrival)
    frames = buffer.pop(T0 + 0.061)
    assert [(frame.timestamp // FRAME, frame.origin) for frame in frames] == [(i, "packet") for i in range(4)]
    assert buffer.stats.packets_duplicate == 2


def test_the_timeline_has_no_gap_under_random_loss() -> None:
    """N packets sent are N frames heard, whatever was lost: the VAD sees the spoken duration."""
    packets = speech_packets(10)
    rng = np.random.default_rng(27)
    arrived = [index for index in range(len(packets)) if rng.random() >= 0.1]
    buffer = AudioJitterBuffer()
    push(buffer, packets, arrived)
    frames = buffer.pop(T0 + len(packets) * FRAME_S + 1.0)
    last = arrived[-1]
    assert sum(frame.pcm.size for frame in frames[: last + 1]) == (last + 1) * FRAME
    assert [frame.timestamp for frame in frames[: last + 1]] == [index * FRAME for index in range(last + 1)]
    assert buffer.stats.frames_recovered > 0  # most single losses were rebuilt from FEC


def test_concealment_pauses_when_the_peer_stops_and_fills_the_gap_when_it_resumes() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [0, 1, 2])
    frames = buffer.pop(T0 + 5.0)  # nothing more for seconds
    assert [frame.origin for frame in frames] == ["packet"] * 3 + ["plc"]  # one frame per period, not a burst
    for tick in range(1, 20):
        frames += buffer.pop(T0 + 5.0 + tick * FRAME_S)
    concealed = [frame for frame in frames if frame.origin == "plc"]
    assert sum(frame.pcm.size for frame in concealed) == MAX_IDLE_CONCEAL_S * 48_000
    assert buffer.next_deadline() is None  # paused: nothing to do until a packet comes
    push(buffer, packets, [30])  # 27 frames (540 ms) after the last one: the gap is filled
    timeline = frames + buffer.pop(T0 + 6.0)
    assert [frame.timestamp for frame in timeline[:31]] == [index * FRAME for index in range(31)]
    assert timeline[30].origin == "packet"


def test_after_a_gap_over_a_second_the_timeline_jumps_to_the_new_packet() -> None:
    """A peer silent for 1.9 s, past MAX_FILL_S: 200 ms concealed while it was gone, then its next
    packet plays at once at its own time, with no 1.7 s of made-up audio before it."""
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [0, 1, 2])
    frames = buffer.pop(T0 + 3 * FRAME_S)
    for tick in range(4, 100):  # the playout asks every frame period while the peer is silent
        frames += buffer.pop(T0 + tick * FRAME_S)
    resumed = 100  # 97 frames after the last one; the timeline stands at frame 13
    buffer.push(resumed, resumed * FRAME, packets[3], T0 + resumed * FRAME_S)
    after = buffer.pop(T0 + resumed * FRAME_S)
    assert [(frame.timestamp // FRAME, frame.origin) for frame in after] == [(resumed, "packet")]
    assert [frame.origin for frame in frames] == ["packet"] * 3 + ["plc"] * round(MAX_IDLE_CONCEAL_S / FRAME_S)


def test_a_sequence_jump_over_3000_restarts_the_stream_where_the_timeline_stands() -> None:
    """A sender that starts again (new sequence numbers and timestamps: RFC 3550 lets a stream start
    anywhere): its packets follow the old ones on the timeline at once, and none counts as lost."""
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [0, 1, 2, 3, 4])
    frames = buffer.pop(T0 + 4 * FRAME_S)
    new_sequence, new_timestamp = 10_000, 123_456_789
    for index in range(5):
        arrival = T0 + (5 + index) * FRAME_S
        buffer.push(new_sequence + index, new_timestamp + index * FRAME, packets[5 + index], arrival)
        frames += buffer.pop(arrival)
    assert [(frame.timestamp // FRAME, frame.origin) for frame in frames] == [(index, "packet") for index in range(10)]
    assert buffer.stats.packets_lost == 0


def test_depth_follows_the_jitter_within_its_bounds() -> None:
    packets = speech_packets(0)
    steady = AudioJitterBuffer()
    push(steady, packets, list(range(40)))
    jittery = AudioJitterBuffer()
    rng = np.random.default_rng(1)
    for sequence in range(40):
        jittery.push(sequence, sequence * FRAME, packets[sequence], T0 + sequence * FRAME_S + rng.uniform(0, 0.03))
    wild = AudioJitterBuffer()
    for sequence in range(40):
        wild.push(sequence, sequence * FRAME, packets[sequence], T0 + sequence * FRAME_S + rng.uniform(0, 0.5))
    assert steady.depth_s == pytest.approx(0.03)  # the least: one frame for the next packet's FEC, and slack
    assert 0.045 < jittery.depth_s < 0.056  # 20 ms + up to 30 ms (the most of 0-30 ms) + 5 ms
    assert wild.depth_s == MAX_DEPTH_S
    assert jittery.stats.jitter_s > steady.stats.jitter_s


def test_an_undecodable_packet_is_concealed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    packets = list(speech_packets(0)[:3])
    packets[1] = b"\xff\xff\xff"  # code 3 with an impossible frame count
    buffer = AudioJitterBuffer()
    with caplog.at_level(logging.WARNING, logger="media.jitter_buffer"):
        push(buffer, tuple(packets), [0, 1, 2])
        frames = buffer.pop(T0 + 1.0)
    assert [frame.origin for frame in frames][:3] == ["packet", "plc", "packet"]
    assert "undecodable" in caplog.text


def test_after_a_stall_of_this_process_unread_packets_are_not_turned_late() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    push(buffer, packets, [0, 1, 2])
    buffer.pop(T0 + 2 * FRAME_S)
    stalled_until = T0 + 0.5  # the loop was blocked: packets 3-24 wait unread in the socket
    assert [frame.origin for frame in buffer.pop(stalled_until)] == ["plc"]  # one slot, not 22
    for sequence in range(3, 25):
        buffer.push(sequence, sequence * FRAME, packets[sequence], stalled_until)
    frames = buffer.pop(stalled_until)
    assert [frame.origin for frame in frames] == ["packet"] * 21
    assert buffer.stats.packets_late == 1  # only the one whose slot was concealed


def test_a_peer_sending_faster_than_real_time_is_held_to_the_buffers_bound() -> None:
    packets = speech_packets(0)
    buffer = AudioJitterBuffer()
    sent = 3 * MAX_BUFFERED_PACKETS  # 30 s of audio within 0.3 s
    for sequence in range(sent):
        buffer.push(sequence, sequence * FRAME, packets[sequence % len(packets)], T0 + sequence * 0.0001)
    assert buffer.stats.packets_overrun == sent - MAX_BUFFERED_PACKETS
    played = buffer.pop(T0 + 1.0)  # playout goes on in real time from what was kept
    assert [frame.origin for frame in played[:10]] == ["packet"] * 10


def test_a_peer_whose_timestamps_jump_gets_no_more_than_real_time_released() -> None:
    """1,000 one-byte packets within a second, each RTP timestamp 0.99 s past the last: concealing
    every gap at once would make 989 s of audio (49,944 frames); at most real time plus the
    buffer's depth comes out, and so at most that many frames are made."""
    buffer = AudioJitterBuffer()
    released: list[PlayoutFrame] = []
    for sequence in range(1000):
        now = T0 + sequence / 1000
        buffer.push(sequence, sequence * 47_520 % 2**32, b"\x08", now)  # TOC only: SILK 20 ms, no frame
        released += buffer.pop(now)  # as the playout track does at every packet
    released += buffer.pop(T0 + 1.0)
    seconds = sum(frame.pcm.size for frame in released) / 48_000
    bound = START_DEPTH_S + RELEASE_RATE * 1.0 + FRAME_S  # the depth, real time (+5 %), one frame over
    assert seconds <= bound  # 1.11 s
    assert len(released) < 60  # the decoder's work, a call per frame: 55 of 20 ms, and a gap's shorter last one


def test_a_spent_release_budget_puts_the_next_deadline_in_the_future() -> None:
    """The playout track sleeps until next_deadline(): with the budget spent it must be later, not
    now (a deadline in the past would spin its loop)."""
    buffer = AudioJitterBuffer()
    for sequence in range(50):  # 1 s of audio at once
        buffer.push(sequence, sequence * FRAME, b"\x08", T0)
    frames = buffer.pop(T0)
    assert sum(frame.pcm.size for frame in frames) <= (START_DEPTH_S + FRAME_S) * 48_000
    deadline = buffer.next_deadline()
    assert deadline is not None and deadline > T0
    assert buffer.pop(deadline)  # and then the next frame comes


def test_a_malformed_packet_after_a_loss_is_concealed_and_the_stream_goes_on() -> None:
    """A lost packet, then one that claims FEC but is corrupt (1302 bytes, TOC config 1, its LBRR
    bit set): decoding its FEC must not raise out of pop() and stop the call's inbound audio. The
    lost slot and the corrupt packet are concealed; the next ones decode."""
    packets = list(speech_packets(0)[:6])
    packets[3] = bytes([1 << 3, 0x40]) + bytes(1300)  # longer than any Opus frame may be (1275 bytes)
    assert carries_fec(packets[3])
    buffer = AudioJitterBuffer()
    push(buffer, tuple(packets), [0, 1, 3, 4, 5])  # 2 is lost
    frames = buffer.pop(T0 + 5 * FRAME_S + buffer.depth_s)
    assert [frame.origin for frame in frames] == ["packet", "packet", "plc", "plc", "packet", "packet"]
    assert [frame.timestamp for frame in frames] == [index * FRAME for index in range(6)]
