"""The one place omni-rtc reaches into aiortc's SCTP transport: what a peer sends on the data
channel is bounded in memory and in work, whatever it sends.

Why. aiortc reassembles data-channel messages in memory and keeps every DATA chunk a peer sends:
it advertises a 1 MiB receive window (``a_rwnd``) but drops nothing past it, and the answer's
``a=max-message-size`` (256 KiB) binds only a sender that reads it. Browsers (and aiortc's own
sender) keep to both; a peer that keeps to neither could hold the worker's memory (one
never-finished message grew by 20 MB in 40 s) or its event loop, and with it every
call of the worker, because aiortc's receive path costs more per chunk the more it holds
(aiortc 1.16, ``rtcsctptransport.py``; the figures are tests/bench/sctp_abuse.py's):

- ``_mark_received`` sorts and filters the whole set of out-of-order TSNs on every chunk: 16,000
  one-byte chunks with every other TSN missing took 31 s of loop time (the cost grows with the
  square of the count), and counted 16 KB;
- ``InboundStream.pop_messages`` walks the stream's whole reassembly queue on every chunk: a
  message sent in one-byte fragments costs the same square;
- a DATA chunk with no user data is kept and counted as 0 bytes: 200,000 held 33 MB;
- every SACK (one per packet that carries DATA) lists every hole, found by walking the set again;
- a FORWARD TSN chunk names any number of streams, each made on demand (up to 65,536) and each
  walked once per mention, and again by every later FORWARD TSN.

What this does, on the one transport of a call. It stands in for aiortc's DATA-chunk handler
(``_receive_data_chunk``) and SACK builder (``_send_sack``) and guards its FORWARD TSN handler
(``_receive_forward_tsn_chunk``):

- **refused, the call ends** (``on_refused``, once; nothing more is kept meanwhile): a DATA chunk
  with no user data (``data_channel_violation``: RFC 4960 §6.2, and RFC 9260's, say a DATA chunk
  carries at least one byte and its receiver aborts the association); more than
  ``MAX_UNDELIVERED_BYTES`` or ``MAX_HELD_CHUNKS`` held undelivered, DATA on more than
  ``MAX_STREAMS`` streams, a FORWARD TSN naming a stream twice or past that bound, or
  ``MAX_DROPPED_AHEAD`` chunks past the window while the peer fills none of its holes
  (``data_channel_overrun``);
- **dropped, the sender sends it again** (as Chrome's dcsctp drops data past the TSNs it
  accepts): a DATA chunk more than ``MAX_TSN_AHEAD`` TSNs past the cumulative TSN, so that at
  most that many TSNs are ever held out of order; a FORWARD TSN past ``FORWARD_TSN_PER_S`` (one
  may move the cumulative TSN any distance: that releases what is held, and a sender abandoning
  queued messages skips TSNs it never sent);
- **kept at a flat cost per chunk**: the TSN bookkeeping of aiortc's ``_mark_received`` without
  its sort (the out-of-order TSNs also kept as blocks, ``_Blocks``, updated by bisection; each
  TSN leaves the set once); a chunk is queued without walking the stream's queue when it cannot
  complete a message (``_may_deliver``); a SACK reports the lowest ``MAX_SACK_GAP_BLOCKS`` holes
  and ``MAX_SACK_DUPLICATES`` duplicates, as dcsctp does, read from those blocks. Otherwise what aiortc keeps and reports is unchanged: the
  same cumulative TSN, out-of-order set, advertised window, SACKs and delivered messages
  (tests/app/transports/webrtc/test_sctp_guard.py feeds both the same traffic), except across a wrap of
  the TSN through 2**32, where aiortc's sort of raw numbers stops its cumulative TSN for good.

*Decided*: the bounds sit where no well-behaved peer goes. A peer that keeps to the window in
full-size chunks (1,160 bytes of data in aiortc, about as many in browsers) has at most 904 TSNs
in flight, within the 1,024 taken past a hole (a first version took 256, as dcsctp first did:
chunks dropped within the window a sender may fill come again only when its retransmission
timer fires, which backs off, and a test moving 18 MB through the data channel then stalled on
a loaded box), and one message of at most 226 fragments being reassembled (a message's
fragments are sent in a row). The 2 MiB and 2,048-chunk bounds leave room for a peer that
ignores ``a=max-message-size`` (tests/e2e/test_peer_call.py makes one).

The private names (``_RECEIVER_STATE``) and the three methods were read in aiortc 1.16
(``media.aiortc_version``; pyproject.toml pins the same range): another version, or a transport without
them, is refused with a message that says so, and a test fails when any of aiortc's methods
this builds on changes.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiortc import RTCSctpTransport
from aiortc.rtcsctptransport import (
    SCTP_DATA_LAST_FRAG,
    SCTP_DATA_UNORDERED,
    DataChunk,
    ForwardTsnChunk,
    SackChunk,
)
from aiortc.utils import uint16_gt, uint32_gt, uint32_gte

from app.token_bucket import TokenBucket
from media.aiortc_version import UnsupportedAiortc, check_aiortc

# Twice the window aiortc advertises (1 MiB). A peer that keeps to the window never holds more
# than 1 MiB here; aiortc's own sender ignores the window but never has more in flight than its
# congestion window, which stays under 1 MiB for event traffic (messages of at most 256 KiB).
MAX_UNDELIVERED_BYTES = 2 * 1024 * 1024
# Chunks held undelivered (out of order, or fragments of a message not yet whole): 2 MiB of
# full-size chunks is 1,808. Each held chunk costs ~200 bytes besides its data.
MAX_HELD_CHUNKS = 2048
# TSNs accepted past the cumulative TSN; later ones are dropped (as in Chrome's dcsctp,
# ``kMaxAcceptedOutstandingFragments``): more than the 904 full-size chunks of the 1 MiB window.
MAX_TSN_AHEAD = 1024
# Chunks dropped past the window since the cumulative TSN last moved: a sender retransmitting
# after a loss sends at most its congestion window (under 1 MiB, 904 full chunks) per round.
MAX_DROPPED_AHEAD = 4096
# Streams the peer sends on (one per data channel; the call uses one, "oai-events").
MAX_STREAMS = 16
# Gap blocks and duplicate TSNs one SACK reports, the lowest first, as Chrome's dcsctp does
# (``kMaxGapAckBlocksReported``, ``kMaxDuplicateTsnReported``): aiortc lists every one, built by
# walking the whole out-of-order set, for every packet that carries DATA.
MAX_SACK_GAP_BLOCKS = 20
MAX_SACK_DUPLICATES = 20
# FORWARD TSN chunks handled per second (a burst of twice as many). Each walks the out-of-order set
# and every stream's queue; a sender needs one per SACK it gets for abandoned messages, and
# one dropped is sent again with the next.
FORWARD_TSN_PER_S = 16.0

_SERIAL_HALF = 2**31  # RFC 1982 serial arithmetic: a TSN up to this far ahead is later
_TSN_MODULO = 2**32
# aiortc 1.16's attributes this module reads or keeps as aiortc's own handler would.
_RECEIVER_STATE = (
    "_advertised_rwnd", "_last_received_tsn", "_sack_misordered", "_sack_duplicates", "_sack_needed",
    "_inbound_streams", "_get_inbound_stream", "_receive", "_reset_deferred_streams", "_send_chunk",
)
_DATA_HANDLER = "_receive_data_chunk"
_FORWARD_TSN_HANDLER = "_receive_forward_tsn_chunk"
_SACK_SENDER = "_send_sack"
_STOOD_IN_FOR = (_DATA_HANDLER, _FORWARD_TSN_HANDLER, _SACK_SENDER)


@dataclass(frozen=True)
class Refusal:
    """Why a peer's call ends: ``reason`` is the call's end reason, ``detail`` says what it sent."""

    reason: str  # "data_channel_violation" (RFC 4960 broken) or "data_channel_overrun" (a bound passed)
    detail: str


class SctpGuard:
    """The bounds of one transport's receive side; :func:`guard_data_channel` installs it."""

    def __init__(
        self,
        transport: RTCSctpTransport,
        on_refused: Callable[[Refusal], None],
        *,
        max_undelivered_bytes: int = MAX_UNDELIVERED_BYTES,
        max_held_chunks: int = MAX_HELD_CHUNKS,
        max_tsn_ahead: int = MAX_TSN_AHEAD,
        max_dropped_ahead: int = MAX_DROPPED_AHEAD,
        max_streams: int = MAX_STREAMS,
        forward_tsn_per_s: float = FORWARD_TSN_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport: Any = transport  # its private state: typed as aiortc keeps it, not declared
        self._on_refused = on_refused
        self._max_undelivered_bytes = max_undelivered_bytes
        self._max_held_chunks = max_held_chunks
        self._max_tsn_ahead = max_tsn_ahead
        self._max_dropped_ahead = max_dropped_ahead
        self._max_streams = max_streams
        self._forward_tsns = TokenBucket(2 * forward_tsn_per_s, forward_tsn_per_s, clock=clock)
        self._window: int = transport._advertised_rwnd
        self._forward_tsn_handler: Callable[[ForwardTsnChunk], Awaitable[None]] = getattr(
            transport, _FORWARD_TSN_HANDLER
        )
        self._dropped_since_progress = 0
        self._ahead = _Blocks.of(transport._last_received_tsn, transport._sack_misordered)
        self.refusal: Refusal | None = None
        self.chunks_dropped = 0  # DATA chunks past the window, and FORWARD TSNs past the rate

    # -- DATA ------------------------------------------------------------------------

    async def receive_data_chunk(self, chunk: DataChunk) -> None:
        """aiortc's ``_receive_data_chunk``, bounded (see the module docstring)."""
        transport = self._transport
        if self.refusal is not None:
            return  # the call is ending: hold nothing more of this peer's
        if not chunk.user_data:
            self._refuse("data_channel_violation", "a DATA chunk with no user data (RFC 4960 §6.2: at least one byte)")
            return
        last = transport._last_received_tsn
        if last is None:
            return  # no association yet: aiortc would fail on it
        if self._past_window(chunk.tsn, last):
            self.chunks_dropped += 1
            self._dropped_since_progress += 1
            if self._dropped_since_progress > self._max_dropped_ahead:
                self._refuse(
                    "data_channel_overrun",
                    f"{self._dropped_since_progress} DATA chunks more than {self._max_tsn_ahead} TSNs past the "
                    "cumulative TSN while filling none of its holes",
                )
            return
        streams = transport._inbound_streams
        if chunk.stream_id not in streams and len(streams) >= self._max_streams:
            self._refuse("data_channel_overrun", f"DATA on more than {self._max_streams} streams")
            return
        transport._sack_needed = True
        if self._mark_received(chunk.tsn):
            return  # a duplicate: reported in the next SACK

        stream = transport._get_inbound_stream(chunk.stream_id)
        queue = stream.reassembly
        appended = not queue or uint32_gt(chunk.tsn, queue[-1].tsn)
        stream.add_chunk(chunk)
        transport._advertised_rwnd -= len(chunk.user_data)
        if not appended or _may_deliver(chunk, stream.sequence_number):
            for message in stream.pop_messages():
                transport._advertised_rwnd += len(message[2])
                await transport._receive(*message)
        await transport._reset_deferred_streams()
        self._check_held()

    def _mark_received(self, tsn: int) -> bool:
        """aiortc's ``_mark_received`` without its sort: True for a duplicate.

        The out-of-order set holds only TSNs past the cumulative TSN (aiortc filters it so after
        every chunk); ``_ahead`` holds the same TSNs as blocks, so the cumulative TSN moves past
        a whole block at once (each TSN leaves the set once). Duplicates are kept as aiortc keeps
        them: those past the new cumulative TSN.
        """
        transport = self._transport
        last = transport._last_received_tsn
        misordered: set[int] = transport._sack_misordered
        if uint32_gte(last, tsn) or tsn in misordered:
            transport._sack_duplicates.append(tsn)
            return True
        ahead = self._ahead_of(last, misordered)
        misordered.add(tsn)
        moved = ahead.add((tsn - last) % _TSN_MODULO)
        if moved:
            for step in range(1, moved + 1):
                misordered.discard((last + step) % _TSN_MODULO)
            last = (last + moved) % _TSN_MODULO
            transport._last_received_tsn = last
            self._dropped_since_progress = 0
        ahead.synced = (last, len(misordered))
        if transport._sack_duplicates:
            transport._sack_duplicates = [seen for seen in transport._sack_duplicates if uint32_gt(seen, last)]
        return False

    def _ahead_of(self, last: int, misordered: set[int]) -> _Blocks:
        """``_ahead``, made again from aiortc's set if anything else moved either (a FORWARD TSN,
        an INIT from the peer): they are compared after every chunk, so this is rare."""
        if self._ahead.synced != (last, len(misordered)):
            self._ahead = _Blocks.of(last, misordered)
        return self._ahead

    # -- SACK ------------------------------------------------------------------------

    async def send_sack(self) -> None:
        """aiortc's ``_send_sack``, reporting at most ``MAX_SACK_GAP_BLOCKS`` gap blocks and
        ``MAX_SACK_DUPLICATES`` duplicates, the lowest first (RFC 4960 §3.3.4), read from the
        blocks kept as chunks come (aiortc sorts the whole set for every SACK, by raw number, which
        puts TSNs past a wrap through 2**32 first)."""
        transport = self._transport
        last = transport._last_received_tsn
        sack = SackChunk()
        sack.cumulative_tsn = last
        sack.advertised_rwnd = max(0, transport._advertised_rwnd)
        sack.duplicates = transport._sack_duplicates[:MAX_SACK_DUPLICATES]
        sack.gaps = self._ahead_of(last, transport._sack_misordered).first(MAX_SACK_GAP_BLOCKS)
        await transport._send_chunk(sack)
        transport._sack_duplicates.clear()
        transport._sack_needed = False

    # -- FORWARD TSN ---------------------------------------------------------------------

    async def receive_forward_tsn_chunk(self, chunk: ForwardTsnChunk) -> None:
        """aiortc's ``_receive_forward_tsn_chunk``, for chunks within the rate that name few streams."""
        transport = self._transport
        if self.refusal is not None:
            return
        last = transport._last_received_tsn
        if last is None:
            return
        if not uint32_gt(chunk.cumulative_tsn, last):
            await self._forward_tsn_handler(chunk)  # nothing moves: aiortc only asks for a SACK
            return
        streams = transport._inbound_streams
        named = [stream_id for stream_id, _ in chunk.streams]
        if len(set(named)) != len(named) or len(set(named) | set(streams)) > self._max_streams:
            self._refuse(
                "data_channel_overrun",
                f"a FORWARD TSN naming {len(named)} streams ({len(set(named))} distinct; at most {self._max_streams})",
            )
            return
        if not self._forward_tsns.take(1):
            self.chunks_dropped += 1
            return
        self._dropped_since_progress = 0
        await self._forward_tsn_handler(chunk)
        self._check_held()

    # -- bounds ----------------------------------------------------------------------

    def _past_window(self, tsn: int, last: int) -> bool:
        """``tsn`` is more than ``max_tsn_ahead`` past ``last`` (and not behind it: a duplicate)."""
        return self._max_tsn_ahead < (tsn - last) % _TSN_MODULO < _SERIAL_HALF

    def held(self) -> tuple[int, int]:
        """Bytes and chunks held undelivered."""
        transport = self._transport
        chunks = sum(len(stream.reassembly) for stream in transport._inbound_streams.values())
        return self._window - transport._advertised_rwnd, chunks

    def _check_held(self) -> None:
        undelivered, chunks = self.held()
        if undelivered > self._max_undelivered_bytes:
            self._refuse("data_channel_overrun", f"{undelivered} bytes held undelivered (at most {self._max_undelivered_bytes})")
        elif chunks > self._max_held_chunks:
            self._refuse("data_channel_overrun", f"{chunks} DATA chunks held undelivered (at most {self._max_held_chunks})")

    def _refuse(self, reason: str, detail: str) -> None:
        if self.refusal is None:
            self.refusal = Refusal(reason, detail)
            self._on_refused(self.refusal)


class _Blocks:
    """The TSNs held past the cumulative TSN as blocks of consecutive ones (a SACK's gap blocks):
    ``starts`` and ``ends`` in order, apart (no two touch), counted on a line that does not wrap,
    on which the cumulative TSN is ``origin``. Kept as chunks come, at ``bisect``'s cost: aiortc
    walks a sorted copy of the whole set instead, for every chunk and every SACK."""

    def __init__(self, last: int | None) -> None:
        self.origin = 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.synced: tuple[int | None, int] = (last, 0)  # aiortc's cumulative TSN and set size they match

    @classmethod
    def of(cls, last: int | None, misordered: set[int]) -> _Blocks:
        blocks = cls(last)
        if last is not None:
            for distance in sorted((tsn - last) % _TSN_MODULO for tsn in misordered):
                if blocks.ends and distance == blocks.ends[-1] + 1:
                    blocks.ends[-1] = distance
                else:
                    blocks.starts.append(distance)
                    blocks.ends.append(distance)
        blocks.synced = (last, len(misordered))
        return blocks

    def add(self, distance: int) -> int:
        """One more TSN, ``distance`` past the cumulative TSN (not held yet); returns how far the
        cumulative TSN moves: 0, or to the end of the first block once it starts right after it."""
        point = self.origin + distance
        at = bisect.bisect_left(self.starts, point)
        joins_left = at > 0 and self.ends[at - 1] + 1 == point
        joins_right = at < len(self.starts) and self.starts[at] == point + 1
        if joins_left and joins_right:
            self.ends[at - 1] = self.ends[at]
            del self.starts[at], self.ends[at]
        elif joins_left:
            self.ends[at - 1] = point
        elif joins_right:
            self.starts[at] = point
        else:
            self.starts.insert(at, point)
            self.ends.insert(at, point)
        if self.starts[0] != self.origin + 1:
            return 0
        moved = self.ends[0] - self.origin
        self.origin = self.ends[0]
        del self.starts[0], self.ends[0]
        return moved

    def first(self, count: int) -> list[tuple[int, int]]:
        """The first ``count`` blocks as a SACK reports them: distances from the cumulative TSN."""
        return [(start - self.origin, end - self.origin) for start, end in zip(self.starts[:count], self.ends[:count], strict=True)]


def _may_deliver(chunk: DataChunk, next_sequence: int) -> bool:
    """Whether ``chunk``, queued after every chunk its stream holds, can let aiortc deliver a message.

    aiortc's ``pop_messages`` walks the stream's queue from its head and delivers each message
    whose fragments are all there, in order of ``stream_seq`` unless unordered. Appended last, a
    chunk changes that only as the last fragment of a message, and, on an ordered stream, of one
    not later than the next in sequence (aiortc stops at a later one's first fragment).
    Otherwise the walk, as long as the queue, would find nothing: it is skipped.
    """
    if not chunk.flags & SCTP_DATA_LAST_FRAG:
        return False
    return bool(chunk.flags & SCTP_DATA_UNORDERED) or not uint16_gt(chunk.stream_seq, next_sequence)


def guard_data_channel(
    transport: RTCSctpTransport, on_refused: Callable[[Refusal], None], **limits: Any
) -> SctpGuard:
    """Bounds what the peer of ``transport`` can make it hold and do; ``on_refused`` is called once.

    Call before the association starts (after ``setRemoteDescription``). Once refused, the
    transport keeps no DATA chunk: the caller is expected to end the call. ``limits``: the
    :class:`SctpGuard` keywords (tests).
    """
    check_aiortc("app/transports/webrtc/sctp_guard.py (the data channel's bounds)")
    missing = [name for name in (*_RECEIVER_STATE, *_STOOD_IN_FOR) if not hasattr(transport, name)]
    if missing or not isinstance(getattr(transport, "_advertised_rwnd", None), int):
        raise UnsupportedAiortc(
            f"expected aiortc 1.16's RTCSctpTransport (with {', '.join(missing) or 'an integer _advertised_rwnd'}), "
            f"got {transport!r}"
        )
    guard = SctpGuard(transport, on_refused, **limits)
    setattr(transport, _DATA_HANDLER, guard.receive_data_chunk)
    setattr(transport, _FORWARD_TSN_HANDLER, guard.receive_forward_tsn_chunk)
    setattr(transport, _SACK_SENDER, guard.send_sack)
    return guard
