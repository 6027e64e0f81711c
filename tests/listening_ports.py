"""Ports for the servers that the tests and benches start and that must be told their port first.

A port the kernel picks for a socket bound to port 0 and closed again lies in the ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default), where any outgoing connection of any
process may take it as its local port before the server binds it ("address already in use"). The
ports handed out here lie below that range, where the kernel never picks a port by itself, in a block
of 1,000 per pytest-xdist worker (the benches, run as scripts, take block 0), so two processes of one
test run never hand out the same port; each is checked free by binding it. A server that can bind port
0 itself and report its port (uvicorn in the test's own loop) needs none of this.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

BLOCK_PORTS = 1_000
BLOCKS = 12  # 12,000 ports below the ephemeral range: a block each for the bench and 11 xdist workers
DEFAULT_EPHEMERAL_LOW = 32_768


def ephemeral_low() -> int:
    """The lowest port the kernel hands out by itself."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1"... under pytest-xdist
    return (int(worker[2:]) + 1) % BLOCKS if worker.startswith("gw") and worker[2:].isdigit() else 0


def _candidates() -> itertools.cycle[int]:
    first = ephemeral_low() - BLOCKS * BLOCK_PORTS + _block() * BLOCK_PORTS
    start = os.getpid() % BLOCK_PORTS  # consecutive runs start apart, away from their predecessors' ports
    return itertools.cycle([first + (start + offset) % BLOCK_PORTS for offset in range(BLOCK_PORTS)])


_next_candidate = _candidates()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on and that no outgoing connection will take."""
    for _ in range(BLOCK_PORTS):
        port = next(_next_candidate)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in this process's block of {BLOCK_PORTS} below {ephemeral_low()}")
