"""A bad network in user space: a UDP relay on 127.0.0.1 that loses, delays, reorders and duplicates.

This kernel has no netem, so a call is routed through :class:`ImpairedRelay` instead: the client
offers no candidates of its own and gets the server's answer with its candidates replaced by the
relay's (``relay.route_answer`` as the client's ``answer_filter``). Every datagram of the call
then crosses the relay, the server learns the client as the relay's address (peer-reflexive),
and each direction has its own :class:`Impairment`.

Only RTP and RTCP are impaired (first byte 128-191, RFC 7983): the audio and its reports, the
subject of the measurements. STUN and DTLS (which carries the data channel's SCTP) pass at once:
SCTP would retransmit what is lost, and its timeouts would mask the audio path's figures.

Deterministic with a seed: whether a packet is lost, duplicated and how long it is held is drawn
from one ``random.Random`` per direction, in packet order, so the same stream of packets meets
the same fate in every run (timing then only decides which packets that stream holds).
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass, field

_CANDIDATE = re.compile(r"^a=candidate:\S+ 1 udp \d+ (\S+) (\d+) typ host.*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Impairment:
    """What one direction does to RTP/RTCP packets.

    ``loss``: the share of packets lost. With ``burst`` > 1 they go in runs of ``burst`` packets (a
    run starts with probability loss / burst, so the share stays ``loss``). ``delay_ms`` is added
    to every packet, and ``jitter_ms`` more, uniform in [0, jitter_ms]: packets overtake each other
    when the draws differ by more than their spacing. ``duplicate``: the share sent twice (the copy
    with its own delay).
    """

    loss: float = 0.0
    burst: int = 1
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    duplicate: float = 0.0

    def describe(self) -> str:
        bursts = f" in bursts of {self.burst}" if self.burst > 1 else ""
        return f"{self.loss:.0%} loss{bursts}, {self.delay_ms:g}+{self.jitter_ms:g} ms, {self.duplicate:.0%} duplicated"


@dataclass
class DirectionCounts:
    packets: int = 0  # RTP/RTCP packets that came in
    lost: int = 0
    duplicated: int = 0
    passed: int = 0  # other datagrams (STUN, DTLS), passed at once


@dataclass
class _Direction:
    impairment: Impairment
    rng: random.Random
    counts: DirectionCounts = field(default_factory=DirectionCounts)
    burst_left: int = 0

    def fates(self, datagram: bytes) -> list[float]:
        """Delays (s) at which to send ``datagram`` on: none when lost, two when duplicated."""
        if not datagram or not 128 <= datagram[0] <= 191:
            self.counts.passed += 1
            return [0.0]
        self.counts.packets += 1
        impairment, rng = self.impairment, self.rng
        # Every draw is made for every packet, so one packet's fate never shifts the others'.
        starts_burst = rng.random() < impairment.loss / max(impairment.burst, 1)
        delays = [rng.uniform(0.0, impairment.jitter_ms) for _ in range(2)]
        duplicated = rng.random() < impairment.duplicate
        if self.burst_left == 0 and starts_burst:
            self.burst_left = max(impairment.burst, 1)
        if self.burst_left > 0:
            self.burst_left -= 1
            self.counts.lost += 1
            return []
        base = impairment.delay_ms
        if duplicated:
            self.counts.duplicated += 1
            return [(base + delays[0]) / 1000, (base + delays[1]) / 1000]
        return [(base + delays[0]) / 1000]


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: object) -> None:
        self._on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._on_datagram(data, addr)  # type: ignore[operator]


class ImpairedRelay:
    """Relays one call between a client and the server, impairing each direction; ``async with`` it."""

    def __init__(self, *, up: Impairment, down: Impairment, seed: int = 0) -> None:
        """``up``: client → server; ``down``: server → client."""
        self.up = _Direction(up, random.Random(f"{seed}-up"))
        self.down = _Direction(down, random.Random(f"{seed}-down"))
        self._client_side: _Endpoint | None = None  # the client sends here (the answer's candidate)
        self._server_side: _Endpoint | None = None  # the server sees the client here
        self._client: tuple[str, int] | None = None
        self._server: tuple[str, int] | None = None
        self._pending: set[asyncio.TimerHandle] = set()

    async def __aenter__(self) -> ImpairedRelay:
        loop = asyncio.get_running_loop()
        _, self._client_side = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._from_client), local_addr=("127.0.0.1", 0)
        )
        _, self._server_side = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._from_server), local_addr=("127.0.0.1", 0)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Drops what is still held and closes both sockets; safe twice."""
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()
        for endpoint in (self._client_side, self._server_side):
            if endpoint is not None and endpoint.transport is not None:
                endpoint.transport.close()

    @property
    def address(self) -> tuple[str, int]:
        assert self._client_side is not None and self._client_side.transport is not None, "enter the relay first"
        host, port = self._client_side.transport.get_extra_info("sockname")[:2]
        return host, port

    def route_answer(self, answer: str) -> str:
        """The server's SDP answer with its candidates replaced by the relay's (a client's ``answer_filter``)."""
        found = _CANDIDATE.search(answer)
        if found is None:
            raise ValueError("the answer has no UDP host candidate to relay to")
        self._server = (found.group(1), int(found.group(2)))
        host, port = self.address
        candidate = f"a=candidate:relay 1 udp 2130706431 {host} {port} typ host"
        newline = "\r\n" if "\r\n" in answer else "\n"
        lines: list[str] = []
        for line in answer.splitlines():
            if line.startswith(("a=candidate:", "a=end-of-candidates")):
                continue
            lines.append(line)
            if line.startswith("a=ice-pwd:"):  # one candidate in each media section, after its credentials
                lines += [candidate, "a=end-of-candidates"]
        return newline.join(lines) + newline

    def _from_client(self, data: bytes, addr: tuple[str, int]) -> None:
        self._client = addr
        if self._server is not None and self._server_side is not None:
            self._forward(self.up, self._server_side, data, self._server)

    def _from_server(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._client is not None and self._client_side is not None:
            self._forward(self.down, self._client_side, data, self._client)

    def _forward(self, direction: _Direction, endpoint: _Endpoint, data: bytes, to: tuple[str, int]) -> None:
        transport = endpoint.transport
        if transport is None or transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        for delay in direction.fates(data):
            if delay <= 0:
                transport.sendto(data, to)
                continue
            handle: asyncio.TimerHandle

            def send(data: bytes = data) -> None:
                self._pending.discard(handle)
                if not transport.is_closing():
                    transport.sendto(data, to)

            handle = loop.call_later(delay, send)
            self._pending.add(handle)
