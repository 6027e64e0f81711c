"""Network namespaces made by a test, for hosts that must not reach each other.

:class:`Sandbox` makes three namespaces, each held by a ``sleep`` started with ``unshare -n``:
``relay`` (the TURN server's host, with the public address ``RELAY_ADDRESS`` on its loopback),
``server`` and ``client``, each joined to ``relay`` by a veth pair and routed through it. The
relay namespace does not forward (a new namespace starts with ``ip_forward`` 0), so ``server``
and ``client`` reach the relay's addresses and nothing of each other. Commands run inside with
``nsenter -n`` on the holder's pid; ``ip netns`` is not used, since its named namespaces are bind
mounts under /run/netns, shared by every process of the machine's mount namespace (another
test run, another engineer). Everything is torn down with the holders: a namespace and its veth
ends go when their last process does. Needs root (CI runs as root).

``python -m tests.e2e.netns forward HOST:PORT TARGET:PORT`` is a TCP forwarder, run in ``relay``
so that the client reaches the server's HTTP port the way it would reach a public front end.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

RELAY_ADDRESS = "10.0.0.1"  # the TURN server's (and the HTTP forwarder's) public address
SERVER_ADDRESS = "10.0.1.2"
CLIENT_ADDRESS = "10.0.2.2"
# Each namespace's link to the relay: (its address, the relay's address on that link, the subnet's prefix).
LINKS = {"server": (SERVER_ADDRESS, "10.0.1.1", 24), "client": (CLIENT_ADDRESS, "10.0.2.1", 24)}


@dataclass
class Sandbox:
    holders: dict[str, subprocess.Popen[bytes]]

    def pid(self, namespace: str) -> int:
        return self.holders[namespace].pid

    def command(self, namespace: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside ``namespace``."""
        return ["nsenter", "-t", str(self.pid(namespace)), "-n", "--", *argv]

    def run(self, namespace: str, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(namespace, argv), check=True, capture_output=True, text=True, **kwargs)


@contextlib.contextmanager
def sandbox() -> Iterator[Sandbox]:
    holders: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("relay", *LINKS):
            holders[name] = subprocess.Popen(["unshare", "-n", "--", "sleep", "infinity"])
        box = Sandbox(holders)
        _wait_until_unshared(box)
        box.run("relay", ["ip", "link", "set", "lo", "up"])
        box.run("relay", ["ip", "addr", "add", f"{RELAY_ADDRESS}/32", "dev", "lo"])
        for name, (address, gateway, prefix) in LINKS.items():
            veth = f"veth-{name}"
            box.run("relay", ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(box.pid(name))])
            box.run("relay", ["ip", "addr", "add", f"{gateway}/{prefix}", "dev", veth])
            box.run("relay", ["ip", "link", "set", veth, "up"])
            for step in (
                ["ip", "link", "set", "lo", "up"],
                ["ip", "addr", "add", f"{address}/{prefix}", "dev", "eth0"],
                ["ip", "link", "set", "eth0", "up"],
                ["ip", "route", "add", "default", "via", gateway],
            ):
                box.run(name, step)
        forwarding = box.run("relay", ["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip()
        assert forwarding == "0", "the relay namespace forwards: server and client could reach each other"
        yield box
    finally:
        for holder in holders.values():
            holder.kill()
            holder.wait()


def _wait_until_unshared(box: Sandbox) -> None:
    """``unshare`` has made each holder's namespace once the holder runs ``sleep`` (bounded: 10 s)."""
    for name, holder in box.holders.items():
        for _ in range(200):
            with contextlib.suppress(FileNotFoundError):
                if open(f"/proc/{holder.pid}/comm").read().strip() == "sleep":
                    break
            if holder.poll() is not None:
                raise RuntimeError(f"unshare -n failed for the {name} namespace (exit {holder.returncode}): not root?")
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the {name} namespace's holder never started")


async def _forward(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, target_writer), pipe(target_reader, writer))

    server = await asyncio.start_server(accept, *listen)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    if sys.argv[1:2] != ["forward"] or len(sys.argv) != 4:
        sys.exit("usage: python -m tests.e2e.netns forward HOST:PORT TARGET:PORT")
    asyncio.run(_forward(_address(sys.argv[2]), _address(sys.argv[3])))
