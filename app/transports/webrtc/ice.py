"""ICE set-up shared by the server and the headless client: ICE servers and their TURN credentials,
loopback gathering, and which candidate pair a connection chose.

aioice gathers host candidates on every interface *except* loopback (``get_host_addresses``
drops 127.0.0.1 and ::1, as RFC 8445 advises). Tests and same-host clients run in a
network namespace where loopback is the only interface, so without help they would gather
nothing. aioice has no option for it, so :func:`loopback_candidates` installs one narrow
hook: while the context is active (a ``ContextVar``, so only the peer connection gathering
inside it is affected), host addresses are exactly ``["127.0.0.1"]``. Everywhere else
aioice's own function answers unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import hashlib
import hmac
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

logger = logging.getLogger(__name__)

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


ICE_SCHEMES = ("stun", "stuns", "turn", "turns")


@dataclass(frozen=True)
class IceServer:
    """One STUN or TURN server, as WebRTC's ``RTCIceServer`` dictionary has it."""

    urls: str
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        if urlsplit(self.urls).scheme not in ICE_SCHEMES:
            raise ValueError(f"ICE server URL must start with stun:, stuns:, turn: or turns:, got {self.urls!r}")

    def to_json(self) -> dict[str, str]:
        """The ``RTCIceServer`` dictionary a browser's ``RTCPeerConnection`` takes."""
        entry = {"urls": self.urls}
        if self.username is not None and self.credential is not None:
            entry |= {"username": self.username, "credential": self.credential}
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> list[IceServer]:
        """The servers of one ``RTCIceServer`` dictionary (``urls`` may be a list); ``ValueError`` when malformed."""
        urls = entry.get("urls")
        url_list = [urls] if isinstance(urls, str) else urls
        if not isinstance(url_list, list) or not all(isinstance(url, str) for url in url_list):
            raise ValueError(f"an ICE server's urls must be a string or a list of strings, got {urls!r}")
        username, credential = entry.get("username"), entry.get("credential")
        return [
            cls(url, username if isinstance(username, str) else None, credential if isinstance(credential, str) else None)
            for url in url_list
        ]


def rest_api_credentials(secret: str, *, expires_at: int, user: str) -> tuple[str, str]:
    """coturn's time-limited TURN credentials ("TURN REST API", ``use-auth-secret``).

    The username is ``"<expiry, unix seconds>:<user>"`` and the password
    ``base64(HMAC-SHA1(secret, username))``: coturn's README.turnserver ("TURN REST API",
    ``--use-auth-secret``) and its code (``get_user_key`` in src/apps/relay/userdb.c, 4.6.1:
    the timestamp before ``:`` must not be in the past; the key is the HMAC of the whole username
    with each ``static-auth-secret``), after draft-uberti-behave-turn-rest-00.
    """
    username = f"{expires_at}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode("ascii")


def rtc_configuration(servers: Sequence[IceServer]) -> RTCConfiguration:
    """An RTCConfiguration with exactly these STUN/TURN servers.

    An empty list means *no* servers: aiortc would otherwise fall back to Google's public
    STUN server, which a loopback test or an offline box must never contact. (aiortc uses the
    first STUN and the first TURN server of the list.)
    """
    return RTCConfiguration(
        iceServers=[RTCIceServer(urls=server.urls, username=server.username, credential=server.credential)
                    for server in servers]
    )


_CANDIDATE_TYPE = re.compile(r"^a=candidate:.* typ (\w+)", re.MULTILINE)


def candidate_types(sdp: str) -> set[str]:
    """The types (host, srflx, prflx, relay) of the candidates an SDP description carries."""
    return set(_CANDIDATE_TYPE.findall(sdp))


def missing_relay(configuration: RTCConfiguration, local_sdp: str) -> list[str]:
    """The TURN URLs configured when gathering produced no relay candidate: the TURN server refused
    the credentials or could not be reached (aioice drops the error). Empty when all is well."""
    turn = [
        url for server in configuration.iceServers or []
        for url in ([server.urls] if isinstance(server.urls, str) else server.urls)
        if urlsplit(url).scheme in ("turn", "turns")
    ]
    return turn if turn and "relay" not in candidate_types(local_sdp) else []


@dataclass(frozen=True)
class CandidatePair:
    local: str  # the candidate types: host, srflx, prflx or relay
    remote: str


def selected_candidate_pair(pc: RTCPeerConnection) -> CandidatePair | None:
    """The candidate pair the connection's ICE transport chose; None before it has one.

    aiortc has no ``getSelectedCandidatePair()``; aioice keeps the nominated pair of each component
    in ``Connection._nominated``. This is the one place that reads it (never writes), checked
    against aioice 0.13 by tests/e2e/test_turn.py, which asserts a relay pair through it: a
    change in aioice fails that test, and here answers None rather than raising.
    """
    sctp = pc.sctp
    transports = [sctp.transport] if sctp is not None else []
    transports += [transceiver.receiver.transport for transceiver in pc.getTransceivers()]
    for dtls in transports:
        connection = getattr(dtls.transport, "_connection", None)
        nominated = getattr(connection, "_nominated", None)
        if isinstance(nominated, dict) and nominated:
            pair = nominated[min(nominated)]
            try:
                return CandidatePair(local=pair.local_candidate.type, remote=pair.remote_candidate.type)
            except AttributeError:
                logger.warning("aioice's nominated pair has changed shape; the selected pair is unknown")
                return None
    return None
