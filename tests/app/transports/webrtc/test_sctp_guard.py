"""The data-channel guard on a bare aiortc SCTP transport: packets go in through its own
``_handle_data``, as DTLS hands them over, and the SACKs it sends are read back.

The end-to-end side (a real call, a real peer on 127.0.0.1) is in tests/e2e/test_peer_call.py; the
loop-time figures are tests/bench/sctp_abuse.py's.
"""

from __future__ import annotations

import hashlib
import inspect
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    SCTP_DATA_UNORDERED,
    USERDATA_MAX_LENGTH,
    WEBRTC_BINARY,
    Chunk,
    DataChunk,
    InboundStream,
    RTCSctpTransport,
    SackChunk,
    parse_packet,
)

from app.transports.webrtc.sctp_guard import (
    MAX_DROPPED_AHEAD,
    MAX_HELD_CHUNKS,
    MAX_SACK_GAP_BLOCKS,
    MAX_STREAMS,
    MAX_TSN_AHEAD,
    MAX_UNDELIVERED_BYTES,
    Refusal,
    SctpGuard,
    UnsupportedAiortc,
    guard_data_channel,
)
from media.aiortc_version import check_aiortc
from tests import hostile_sctp
from tests.clock import FakeClock

FIRST_TSN = 1_000
PORT = 5000

# aiortc 1.16's methods the guard stands in for or builds on (sha256 of their source, first 16
# hex digits). A new aiortc that changes one fails here: read it again against
# app/transports/webrtc/sctp_guard.py, fix the guard if it must change, then record the new digest.
READ_IN_AIORTC = {
    "RTCSctpTransport._receive_data_chunk": "790c2bb8cd0f5dd7",
    "RTCSctpTransport._mark_received": "2ac68b6a3934ca87",
    "RTCSctpTransport._receive_forward_tsn_chunk": "a7b72a09e9c4bb20",
    "RTCSctpTransport._send_sack": "ac92513522fa60e7",
    "RTCSctpTransport._handle_data": "8661b724e20776bb",
    "RTCSctpTransport._receive_chunk": "830bae988365ba89",
    "InboundStream.add_chunk": "de934faf324b1b4b",
    "InboundStream.pop_messages": "bd29de9aa7c4f8fd",
}


class RecordingDtls:
    """Stands for the DTLS transport under the SCTP transport: keeps what it is asked to send."""

    state = "connected"

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def _register_data_receiver(self, receiver: Any) -> None:
        pass

    async def _send_data(self, data: bytes) -> None:
        self.sent.append(data)


@dataclass
class Association:
    """The receiving end of an established association; ``transport`` is aiortc's (its private state)."""

    transport: Any
    dtls: RecordingDtls
    guard: SctpGuard | None
    delivered: list[tuple[int, int, bytes]] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    async def feed(self, chunks: Iterable[Chunk]) -> None:
        tag = self.transport._local_verification_tag
        for packet in hostile_sctp.packets(chunks, ports=(PORT, PORT), verification_tag=tag):
            await self.transport._handle_data(packet)

    def sacks(self) -> list[SackChunk]:
        return [chunk for packet in self.dtls.sent for chunk in parse_packet(packet)[3] if isinstance(chunk, SackChunk)]

    def held_chunks(self) -> int:
        return sum(len(stream.reassembly) for stream in self.transport._inbound_streams.values())

    def held_bytes(self) -> int:
        """The user data in aiortc's reassembly queues: what the peer makes this side hold."""
        return held_bytes(self.transport)


def held_bytes(transport: Any) -> int:
    return sum(len(chunk.user_data) for stream in transport._inbound_streams.values() for chunk in stream.reassembly)


def association(*, guarded: bool = True, first_tsn: int = FIRST_TSN, **limits: Any) -> Association:
    dtls = RecordingDtls()
    transport: Any = RTCSctpTransport(dtls)  # type: ignore[arg-type]
    transport._last_received_tsn = (first_tsn - 1) % hostile_sctp.TSN_MODULO  # as the peer's INIT set it
    transport._remote_port = PORT
    result = Association(transport, dtls, None)

    async def receive(stream_id: int, protocol: int, data: bytes) -> None:
        result.delivered.append((stream_id, protocol, data))

    transport._receive = receive
    if guarded:
        result.guard = guard_data_channel(transport, result.refusals.append, **limits)
    return result


def test_aiortcs_receive_path_is_the_one_the_guard_was_read_against():
    owners = {"RTCSctpTransport": RTCSctpTransport, "InboundStream": InboundStream}
    found = {}
    for name in READ_IN_AIORTC:
        owner, method = name.split(".")
        source = inspect.getsource(getattr(owners[owner], method))
        found[name] = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert found == READ_IN_AIORTC


def test_an_aiortc_the_guard_was_not_read_against_is_refused():
    check_aiortc("the guard", "1.16.2")
    with pytest.raises(UnsupportedAiortc, match="aiortc 1.17.0 is installed; the guard stands in"):
        check_aiortc("the guard", "1.17.0")


def _well_behaved_traffic(rng: random.Random, first_tsn: int) -> list[list[DataChunk]]:
    """Messages a peer's sender would make (1-4 fragments, three streams, some unordered), sent
    as packets of 1-6 chunks in an order shuffled within 24 TSNs, some chunks sent twice."""
    chunks: list[DataChunk] = []
    sequence = {stream: 0 for stream in range(3)}
    tsn = first_tsn
    for _ in range(rng.randint(5, 60)):
        stream = rng.randrange(3)
        unordered = rng.random() < 0.3
        parts = rng.randint(1, 4)
        for part in range(parts):
            flags = (SCTP_DATA_FIRST_FRAG if part == 0 else 0) | (SCTP_DATA_LAST_FRAG if part == parts - 1 else 0)
            payload = bytes([rng.randrange(256)]) * rng.randint(1, 40)
            chunks.append(hostile_sctp.data_chunk(
                tsn, payload, stream_id=stream, stream_seq=sequence[stream],
                flags=flags | (SCTP_DATA_UNORDERED if unordered else 0), protocol=WEBRTC_BINARY,
            ))
            tsn += 1
        if not unordered:
            sequence[stream] += 1
    order = sorted(range(len(chunks)), key=lambda n: n + rng.uniform(0, 24))
    sent = [chunks[n] for n in order]
    sent += [rng.choice(chunks) for _ in range(len(chunks) // 8)]  # retransmissions already received
    packets: list[list[DataChunk]] = []
    while sent:
        size = rng.randint(1, 6)
        packets.append(sent[:size])
        sent = sent[size:]
    return packets


async def test_a_well_behaved_peer_gets_from_the_guard_what_aiortc_alone_gives_it():
    """The same packets to aiortc's own receive path and to the guarded one: the same messages,
    cumulative TSN, out-of-order set, advertised window and SACKs, packet after packet."""
    rng = random.Random(34)
    for _ in range(150):
        plain, guarded = association(guarded=False), association()
        for packet in _well_behaved_traffic(rng, FIRST_TSN):
            for end in (plain, guarded):
                await end.feed(packet)
            for name in ("_last_received_tsn", "_sack_misordered", "_advertised_rwnd"):
                assert getattr(guarded.transport, name) == getattr(plain.transport, name), name
            assert guarded.delivered == plain.delivered
        assert [(s.cumulative_tsn, s.advertised_rwnd, s.gaps, s.duplicates) for s in guarded.sacks()] == [
            (s.cumulative_tsn, s.advertised_rwnd, s.gaps, s.duplicates) for s in plain.sacks()
        ]
        assert guarded.refusals == []
        assert guarded.transport._sack_misordered == set()  # everything arrived in the end


async def test_after_a_forward_tsn_the_sacks_report_the_holes_left_as_aiortc_alone_does():
    """aiortc's own FORWARD TSN handler moves the cumulative TSN and filters the out-of-order set:
    the guard's blocks follow."""
    plain, guarded = association(guarded=False), association()
    traffic = [
        [hostile_sctp.data_chunk(FIRST_TSN + offset, stream_seq=offset) for offset in (2, 3, 5, 9, 10, 11, 30)],
        [hostile_sctp.forward_tsn(FIRST_TSN + 4, [(0, 4)])],  # abandons 1 and 4: delivers 0-5, holes left 6-8, 12-29
        [hostile_sctp.data_chunk(FIRST_TSN + 7, stream_seq=7)],
        [hostile_sctp.forward_tsn(FIRST_TSN + 40)],  # past everything held
        [hostile_sctp.data_chunk(FIRST_TSN + 42, stream_seq=42)],
    ]
    for packet in traffic:
        for end in (plain, guarded):
            await end.feed(packet)
        assert guarded.transport._last_received_tsn == plain.transport._last_received_tsn
        assert guarded.transport._sack_misordered == plain.transport._sack_misordered
    assert [(s.cumulative_tsn, s.gaps) for s in guarded.sacks()] == [(s.cumulative_tsn, s.gaps) for s in plain.sacks()]
    assert guarded.sacks()[-1].gaps == [(2, 2)]
    assert guarded.delivered == plain.delivered


async def test_out_of_order_chunks_across_the_wrap_of_2_32_move_the_cumulative_tsn():
    """aiortc's own walk sorts raw TSNs: 0 before 2**32 - 1, and its cumulative TSN stops there."""
    top = 2**32 - 1
    end = association(first_tsn=top - 1)
    await end.feed([hostile_sctp.data_chunk(0, stream_seq=2), hostile_sctp.data_chunk(top, stream_seq=1)])
    await end.feed([hostile_sctp.data_chunk(top - 1, stream_seq=0)])
    assert end.transport._last_received_tsn == 0
    assert [data for _, _, data in end.delivered] == [b"x"] * 3


async def test_one_byte_chunks_skipping_every_other_tsn_are_held_only_within_the_window_then_end_the_call():
    """The issue's 16,000 gapped chunks: aiortc alone held every one (and sorted them all per chunk)."""
    end = association()
    await end.feed(hostile_sctp.gapped(FIRST_TSN, 16_000))
    assert len(end.transport._sack_misordered) == MAX_TSN_AHEAD // 2
    assert end.held_chunks() == MAX_TSN_AHEAD // 2
    assert end.refusals == [Refusal(
        "data_channel_overrun",
        f"{MAX_DROPPED_AHEAD + 1} DATA chunks more than {MAX_TSN_AHEAD} TSNs past the cumulative TSN "
        "while filling none of its holes",
    )]


async def test_a_peer_that_fills_its_holes_keeps_going_past_the_window():
    """Dropped chunks past the window are retransmitted by a real sender: when the holes fill,
    they are taken, and the count of drops starts again."""
    end = association()
    ahead = [hostile_sctp.data_chunk(FIRST_TSN + n, stream_seq=n) for n in range(1, 2 * MAX_TSN_AHEAD)]
    await end.feed(ahead)  # the first TSN is missing: half of these are past the window
    await end.feed([hostile_sctp.data_chunk(FIRST_TSN, stream_seq=0)])
    await end.feed(ahead)  # sent again: the first half are duplicates now, the rest are taken
    assert end.transport._last_received_tsn == FIRST_TSN + 2 * MAX_TSN_AHEAD - 1
    assert len(end.delivered) == 2 * MAX_TSN_AHEAD
    assert end.refusals == []


async def test_a_data_chunk_with_no_user_data_ends_the_call_and_is_not_kept():
    end = association()
    await end.feed(hostile_sctp.zero_length(FIRST_TSN, 200))
    assert end.refusals[0].reason == "data_channel_violation"
    assert "no user data" in end.refusals[0].detail
    assert end.held_chunks() == 0
    assert end.transport._last_received_tsn == FIRST_TSN - 1


async def test_nothing_is_kept_once_the_call_is_ending():
    end = association()
    await end.feed(hostile_sctp.zero_length(FIRST_TSN, 1))
    await end.feed([hostile_sctp.data_chunk(FIRST_TSN, flags=SCTP_DATA_FIRST_FRAG)])
    assert end.held_chunks() == 0 and len(end.refusals) == 1


async def test_a_message_past_the_byte_bound_is_held_only_up_to_it_then_ends_the_call():
    """A peer that ignores the window sends one message that never ends, in full-size fragments:
    the bytes held in aiortc's reassembly queue, measured after every packet, pass the bound by
    one fragment at most, the guard counts the same, and nothing more is kept once it refused."""
    end = association()
    assert end.guard is not None
    fragment = b"x" * USERDATA_MAX_LENGTH
    held: list[int] = []
    for n in range(MAX_UNDELIVERED_BYTES // len(fragment) + 100):  # 100 fragments past the bound
        await end.feed([hostile_sctp.data_chunk(FIRST_TSN + n, fragment, flags=SCTP_DATA_FIRST_FRAG if n == 0 else 0)])
        held.append(end.held_bytes())
        assert end.guard.held()[0] == held[-1]
    assert MAX_UNDELIVERED_BYTES < max(held) <= MAX_UNDELIVERED_BYTES + len(fragment)
    assert end.refusals == [Refusal(
        "data_channel_overrun", f"{max(held)} bytes held undelivered (at most {MAX_UNDELIVERED_BYTES})"
    )]
    assert held[-1] == max(held)  # the fragments after the refusal were not kept


async def test_a_message_in_one_byte_fragments_ends_the_call_past_the_held_chunk_bound():
    """16 KB of data counted, but each fragment is a chunk aiortc keeps and walks."""
    end = association()
    await end.feed(hostile_sctp.fragments(FIRST_TSN, 16_000))
    assert end.refusals == [Refusal(
        "data_channel_overrun", f"{MAX_HELD_CHUNKS + 1} DATA chunks held undelivered (at most {MAX_HELD_CHUNKS})"
    )]
    assert end.held_chunks() == MAX_HELD_CHUNKS + 1


async def test_fragments_are_not_walked_until_the_message_can_be_delivered(monkeypatch: pytest.MonkeyPatch):
    """aiortc walks the stream's whole queue for every chunk (the cost grows with the square of a
    message's fragments); the guard walks it when the last fragment comes."""
    walks: list[int] = []
    pop_messages = InboundStream.pop_messages

    def counted(stream: InboundStream) -> Any:
        walks.append(len(stream.reassembly))
        return pop_messages(stream)

    monkeypatch.setattr(InboundStream, "pop_messages", counted)
    end = association()
    message = [*hostile_sctp.fragments(FIRST_TSN, 1_000)]
    message.append(hostile_sctp.data_chunk(FIRST_TSN + 1_000, flags=SCTP_DATA_LAST_FRAG))
    await end.feed(message)
    assert walks == [1_001]
    assert end.delivered == [(0, WEBRTC_BINARY, b"x" * 1_001)]


async def test_messages_held_behind_a_missing_one_are_not_walked_for_each_arrival(monkeypatch: pytest.MonkeyPatch):
    """Ordered messages after a lost one wait for it: a later one's arrival cannot deliver them."""
    walks: list[int] = []
    pop_messages = InboundStream.pop_messages
    monkeypatch.setattr(InboundStream, "pop_messages", lambda stream: walks.append(1) or pop_messages(stream))
    end = association()
    await end.feed(hostile_sctp.data_chunk(FIRST_TSN + n, stream_seq=n) for n in range(1, 100))
    assert walks == []
    await end.feed([hostile_sctp.data_chunk(FIRST_TSN, stream_seq=0)])
    assert walks == [1] and len(end.delivered) == 100


async def test_data_on_more_streams_than_the_bound_ends_the_call():
    end = association()
    await end.feed(hostile_sctp.data_chunk(FIRST_TSN + n, stream_id=n, flags=SCTP_DATA_FIRST_FRAG) for n in range(64))
    assert end.refusals == [Refusal("data_channel_overrun", f"DATA on more than {MAX_STREAMS} streams")]
    assert len(end.transport._inbound_streams) == MAX_STREAMS


async def test_a_sack_reports_the_lowest_gap_blocks_only():
    end = association()
    await end.feed(hostile_sctp.gapped(FIRST_TSN, 100))
    last = end.sacks()[-1]
    assert last.cumulative_tsn == FIRST_TSN - 1
    assert last.gaps == [(2 + 2 * n, 2 + 2 * n) for n in range(MAX_SACK_GAP_BLOCKS)]


async def test_forward_tsns_past_their_rate_are_dropped():
    clock = FakeClock()
    end = association(clock=clock, forward_tsn_per_s=4.0)
    await end.feed(hostile_sctp.forward_tsn(FIRST_TSN + n) for n in range(20))
    assert end.transport._last_received_tsn == FIRST_TSN + 7  # a burst of 8
    clock.now += 1.0
    await end.feed(hostile_sctp.forward_tsn(FIRST_TSN + 100 + n) for n in range(20))
    assert end.transport._last_received_tsn == FIRST_TSN + 103  # 4 a second
    assert end.refusals == []


async def test_a_forward_tsn_naming_a_stream_twice_ends_the_call():
    """aiortc would walk the stream's queue once per mention (and make any stream it names)."""
    end = association()
    await end.feed([hostile_sctp.forward_tsn(FIRST_TSN, [(0, 0)] * 300)])
    assert [refusal.reason for refusal in end.refusals] == ["data_channel_overrun"]
    assert end.transport._inbound_streams == {}


def test_a_transport_without_the_state_the_guard_reads_is_refused():
    with pytest.raises(UnsupportedAiortc, match="_sack_misordered"):
        guard_data_channel(object(), lambda refusal: None)  # type: ignore[arg-type]
