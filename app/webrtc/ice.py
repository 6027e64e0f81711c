"""ICE set-up shared by the server and the headless client: servers from URLs, loopback gathering.

aioice gathers host candidates on every interface *except* loopback (``get_host_addresses``
drops 127.0.0.1 and ::1, as RFC 8445 advises). Tests and same-host clients run in a
network namespace where loopback is the only interface, so without help they would gather
nothing. aioice has no option for it, so :func:`loopback_candidates` installs one narrow
hook: while the context is active (a ``ContextVar``, so only the peer connection gathering
inside it is affected), host addresses are exactly ``["127.0.0.1"]``. Everywhere else
aioice's own function answers unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

LOOPBACK_ADDRESS = "127.0.0.1"

_loopback_only: contextvars.ContextVar[bool] = contextvars.ContextVar("omni_rtc_ice_loopback", default=False)
_aioice_host_addresses = aioice.ice.get_host_addresses


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    if _loopback_only.get():
        return [LOOPBACK_ADDRESS] if use_ipv4 else []
    return _aioice_host_addresses(use_ipv4=use_ipv4, use_ipv6=use_ipv6)


@contextlib.contextmanager
def loopback_candidates(enabled: bool = True) -> Iterator[None]:
    """Gather host candidates on 127.0.0.1 only, for peer connections negotiated inside.

    Wrap the ``setLocalDescription`` call (that is when aiortc gathers). Tasks created
    inside the block copy the context, so aiortc's internal gathering tasks see it too.
    """
    if aioice.ice.get_host_addresses is not _host_addresses:
        aioice.ice.get_host_addresses = _host_addresses
    token = _loopback_only.set(enabled)
    try:
        yield
    finally:
        _loopback_only.reset(token)


def rtc_configuration(
    urls: Sequence[str], *, username: str | None = None, credential: str | None = None
) -> RTCConfiguration:
    """An RTCConfiguration with exactly these STUN/TURN servers.

    An empty list means *no* servers: aiortc would otherwise fall back to Google's public
    STUN server, which a loopback test or an offline box must never contact.
    ``turn:``/``turns:`` URLs get ``username``/``credential``; ``stun:`` URLs need none.
    """
    servers = []
    for url in urls:
        scheme = urlsplit(url).scheme
        if scheme not in ("stun", "stuns", "turn", "turns"):
            raise ValueError(f"ICE server URL must start with stun:, stuns:, turn: or turns:, got {url!r}")
        if scheme.startswith("turn"):
            servers.append(RTCIceServer(urls=url, username=username, credential=credential))
        else:
            servers.append(RTCIceServer(urls=url))
    return RTCConfiguration(iceServers=servers)
