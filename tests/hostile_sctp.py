"""A hostile data-channel peer: SCTP chunks that aiortc's own sender would never send, sent from an
aiortc transport's association (its ports, verification tag and DTLS keys), bundled as a
peer may bundle them. Used by the guard's tests, tests/e2e/test_abuse.py and
tests/bench/sctp_abuse.py.

Every pattern starts at ``first_tsn``, the TSN the server expects next (the sender's
``_local_tsn`` while it has nothing in flight), and leaves the sender's own TSN counter alone:
after sending one the sender's own channel is not expected to work.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from struct import pack
from typing import Any

from aiortc import RTCSctpTransport
from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    SCTP_DATA_UNORDERED,
    SCTP_MAX_PACKET_LENGTH,
    WEBRTC_BINARY,
    Chunk,
    DataChunk,
    ForwardTsnChunk,
)
from google_crc32c import value as crc32c

TSN_MODULO = 2**32
WHOLE_MESSAGE = SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG


def data_chunk(
    tsn: int,
    payload: bytes = b"x",
    *,
    stream_id: int = 0,
    stream_seq: int = 0,
    flags: int = WHOLE_MESSAGE,
    protocol: int = WEBRTC_BINARY,
) -> DataChunk:
    chunk = DataChunk(flags=flags)
    chunk.tsn = tsn % TSN_MODULO
    chunk.stream_id = stream_id
    chunk.stream_seq = stream_seq % 65_536
    chunk.protocol = protocol
    chunk.user_data = payload
    return chunk


def gapped(first_tsn: int, count: int) -> Iterator[DataChunk]:
    """One-byte messages on every other TSN, the first TSN never sent: each is held out of order."""
    for n in range(count):
        yield data_chunk(first_tsn + 1 + 2 * n, stream_seq=n + 1)


def zero_length(first_tsn: int, count: int) -> Iterator[DataChunk]:
    """DATA chunks with no user data (a middle fragment each, as the issue's reproduction sent them)."""
    for n in range(count):
        yield data_chunk(first_tsn + n, b"", flags=0)


def fragments(first_tsn: int, count: int) -> Iterator[DataChunk]:
    """One message in one-byte fragments, in order, its last never sent."""
    for n in range(count):
        yield data_chunk(first_tsn + n, flags=SCTP_DATA_FIRST_FRAG if n == 0 else 0)


def sliding(first_tsn: int, count: int, *, holes: int = 127) -> Iterator[DataChunk]:
    """One-byte messages in order of ``stream_seq``, sent so that ``holes`` TSNs are always
    missing: the lowest hole is filled as each new message is sent past the highest, so the
    cumulative TSN keeps moving and the out-of-order set stays as large (a sustained load)."""
    def message(offset: int) -> DataChunk:
        return data_chunk(first_tsn + offset, stream_seq=offset)

    ahead = min(holes, count)
    for n in range(ahead):
        yield message(2 * n + 1)
    for n in range(ahead, (count + ahead) // 2):
        yield message(2 * (n - ahead))  # fills the lowest hole: two messages delivered
        yield message(2 * n + 1)


def blocked_unordered(first_tsn: int, count: int, *, head: int = 1_000) -> Iterator[DataChunk]:
    """A message's first ``head`` one-byte fragments, then unordered one-byte messages on the same
    stream, each a TSN apart from the last: held behind the unfinished message."""
    yield from fragments(first_tsn, min(head, count))
    for n in range(count - head):
        yield data_chunk(first_tsn + head + 1 + 2 * n, flags=WHOLE_MESSAGE | SCTP_DATA_UNORDERED)


def forward_tsn(cumulative_tsn: int, streams: list[tuple[int, int]] | None = None) -> ForwardTsnChunk:
    chunk = ForwardTsnChunk()
    chunk.cumulative_tsn = cumulative_tsn % TSN_MODULO
    chunk.streams = list(streams or [])
    return chunk


def packets(chunks: Iterable[Chunk], *, ports: tuple[int, int], verification_tag: int) -> Iterator[bytes]:
    """``chunks`` bundled into SCTP packets of at most aiortc's packet size (1,189 bytes), each
    with its CRC32c, as ``serialize_packet`` makes one of a single chunk."""
    header = pack("!HHL", *ports, verification_tag)
    body = b""
    for chunk in chunks:
        data = bytes(chunk)
        if body and 12 + len(body) + len(data) > SCTP_MAX_PACKET_LENGTH:
            yield _packet(header, body)
            body = b""
        body += data
    if body:
        yield _packet(header, body)


def _packet(header: bytes, body: bytes) -> bytes:
    return header + pack("<L", crc32c(header + b"\x00\x00\x00\x00" + body)) + body


async def send(transport: RTCSctpTransport, chunks: Iterable[Chunk]) -> int:
    """Sends ``chunks`` on ``transport``'s association, bundled; returns the packets sent."""
    sctp: Any = transport  # its association's private state
    sent = 0
    for packet in packets(chunks, ports=(sctp._local_port, sctp._remote_port), verification_tag=sctp._remote_verification_tag):
        await transport.transport._send_data(packet)
        sent += 1
    return sent


def next_tsn(transport: RTCSctpTransport) -> int:
    """The TSN the peer of ``transport`` expects next, while ``transport`` has nothing in flight."""
    sctp: Any = transport
    return int(sctp._local_tsn)
