"""What a hostile data-channel peer costs the event loop and memory: aiortc's receive path alone
(before) against it behind app/transports/webrtc/sctp_guard.py (after).

Run: .venv/bin/python tests/bench/sctp_abuse.py [--count 16000] [--zero-length 200000] [--skip-before]
     [--out tests/bench/results/sctp_abuse.json]

Each pattern's chunks (tests/hostile_sctp.py) are bundled into packets as a peer sends them
(up to 1,189 bytes, ~58 one-byte chunks) and handed to a bare aiortc ``RTCSctpTransport`` through
its own ``_handle_data``, as DTLS hands it each decrypted packet; the SACKs it answers with are
built and dropped. Loop time: the wall seconds (and the process's CPU seconds) of all those
calls, which run on the event loop of the worker that holds the call; DTLS decryption and the
network are not in it. Held: DATA chunks the transport keeps at the end; for the zero-length
pattern also the Python memory still allocated then (tracemalloc, in a second run: it slows
every allocation).

Patterns, ``--count`` chunks each:
- in order: one-byte messages in order, each delivered (what a well-behaved peer's chunks cost),
  bundled, and one chunk per packet (each answered with a SACK);
- gapped: one-byte messages on every other TSN, the first missing (the issue's 16,000);
- fragments: one message in one-byte fragments, in order, never finished;
- blocked unordered: 1,000 fragments of an unfinished message, then unordered one-byte messages
  behind it on the same stream;
- sliding: one-byte messages with 127 TSNs always missing, the lowest filled as each new one is
  sent (the cumulative TSN moves, so nothing ends the call: a sustained load); also sent one
  chunk per packet, so that every chunk is answered with a SACK of 127 holes;
- zero length: ``--zero-length`` DATA chunks with no user data.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from aiortc.rtcsctptransport import DataChunk, RTCSctpTransport
from harness import machine, write_report  # this folder: a script's is first on sys.path

from app.transports.webrtc.sctp_guard import Refusal, guard_data_channel
from tests import hostile_sctp

FIRST_TSN = 1_000
PORT = 5000


class _NoDtls:
    state = "connected"

    def _register_data_receiver(self, receiver: Any) -> None:
        pass

    async def _send_data(self, data: bytes) -> None:
        pass


def _in_order(first_tsn: int, count: int) -> Iterator[DataChunk]:
    for n in range(count):
        yield hostile_sctp.data_chunk(first_tsn + n, stream_seq=n)


PATTERNS: dict[str, Callable[[int, int], Iterable[DataChunk]]] = {
    "in order": _in_order,
    "in order, a chunk a packet": _in_order,
    "gapped": hostile_sctp.gapped,
    "fragments": hostile_sctp.fragments,
    "blocked unordered": hostile_sctp.blocked_unordered,
    "sliding": hostile_sctp.sliding,
    "sliding, a chunk a packet": hostile_sctp.sliding,
    "zero length": hostile_sctp.zero_length,
}


async def run(pattern: str, count: int, guarded: bool, *, measure_memory: bool = False) -> dict[str, Any]:
    """One pattern through one transport; with ``measure_memory``, what it still holds (tracemalloc,
    which slows every allocation: its times are not the loop's)."""
    transport: Any = RTCSctpTransport(_NoDtls())  # type: ignore[arg-type]
    transport._last_received_tsn = FIRST_TSN - 1
    transport._remote_port = PORT
    refusals: list[Refusal] = []
    if guarded:
        guard_data_channel(transport, refusals.append)
    chunks = list(PATTERNS[pattern](FIRST_TSN, count))
    tag = transport._local_verification_tag
    if pattern.endswith("a chunk a packet"):
        packets = [packet for chunk in chunks for packet in hostile_sctp.packets([chunk], ports=(PORT, PORT), verification_tag=tag)]
    else:
        packets = list(hostile_sctp.packets(chunks, ports=(PORT, PORT), verification_tag=tag))
    del chunks
    if measure_memory:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    for packet in packets:
        await transport._handle_data(packet)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    result: dict[str, Any] = {
        "pattern": pattern, "chunks": count, "packets": len(packets), "guarded": guarded,
        "loop_s": round(wall, 4), "cpu_s": round(cpu, 4),
        "held_chunks": sum(len(stream.reassembly) for stream in transport._inbound_streams.values()),
        "out_of_order": len(transport._sack_misordered),
        "refused": refusals[0].reason if refusals else None,
    }
    if measure_memory:
        del packets
        result = {"held_mb": round((tracemalloc.get_traced_memory()[0] - before) / 1e6, 2)}
        tracemalloc.stop()
    return result


async def measured(pattern: str, count: int, guarded: bool) -> dict[str, Any]:
    result = await run(pattern, count, guarded)
    if pattern == "zero length":
        result |= await run(pattern, count, guarded, measure_memory=True)
    return result


def _row(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    def cell(result: dict[str, Any] | None) -> str:
        if result is None:
            return "—"
        held = f"{result['held_chunks']} held" + (f", {result['held_mb']} MB" if "held_mb" in result else "")
        return f"{result['loop_s']:.3f} s ({result['cpu_s']:.3f}), {held}"

    refused = after["refused"] or "goes on"
    return f"| {after['pattern']} | {after['chunks']:,} | {cell(before)} | {cell(after)} | {refused} |"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=16_000)
    parser.add_argument("--zero-length", type=int, default=200_000)
    parser.add_argument("--skip-before", action="store_true", help="only the guarded transport (aiortc alone takes minutes)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sctp_abuse.json")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    print("| pattern | chunks | aiortc alone: loop s (CPU s), held | guarded | guarded call |")
    print("|---|---|---|---|---|")
    for pattern in PATTERNS:
        count = args.zero_length if pattern == "zero length" else args.count
        before = None if args.skip_before else await measured(pattern, count, guarded=False)
        after = await measured(pattern, count, guarded=True)
        rows += [result for result in (before, after) if result is not None]
        print(_row(before, after), flush=True)
    write_report(args.out, {"machine": machine(), "results": rows})


if __name__ == "__main__":
    asyncio.run(main())
