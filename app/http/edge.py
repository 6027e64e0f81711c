"""Trust at the edge: which Host names this server answers, whose forwarded headers it believes,
and which client counts as local.

- **Host allow-list.** Every request, the WebSocket included, must name an allowed host, else
  ``421 host_not_allowed``. DNS rebinding points a name the attacker controls at 127.0.0.1, so a
  page of theirs becomes same-origin with a local server; its requests carry the attacker's name
  in ``Host`` (and ``Origin``), which is not on the list. Allowed by default: the localhost names,
  the bind address and, for a wildcard bind, this machine's own names and addresses
  (:func:`machine_names_and_addresses`); ``--allowed-host`` adds the names a proxy serves.
- **Forwarded headers** (``X-Forwarded-For``, ``X-Forwarded-Proto``) are believed only from
  ``--trusted-proxy`` peers (uvicorn's ``ProxyHeadersMiddleware``, configured here rather than by
  uvicorn, whose default believes 127.0.0.1: a proxy on the same host would make every client
  look local). A server *without* an API key (it can have no trusted proxy) refuses any request
  that carries forwarding headers (``403 proxy_not_trusted``): it was put behind a proxy without
  being told, and its loopback bind no longer means its clients are local.
- **Local**: :func:`is_local_client` — a loopback peer that is not a trusted proxy and sent no
  forwarding header. ``/debug/*`` answers it, or the API key.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable
from typing import Any, cast
from urllib.parse import urlsplit

import psutil
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.config import Settings, is_loopback_host
from app.http.errors import ApiError

logger = logging.getLogger(__name__)

LOCALHOST_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
# Headers a proxy adds to say whom it speaks for (RFC 7239 and the de-facto X- ones).
FORWARDING_HEADERS = frozenset(
    {"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "x-real-ip", "via"}
)


def machine_names_and_addresses() -> list[str]:
    """This machine's host name (also as ``NAME.local``, its mDNS name) and every interface address."""
    hostname = socket.gethostname()
    names = [hostname] if hostname else []
    if hostname and "." not in hostname:
        names.append(f"{hostname}.local")
    addresses = [
        address.address.split("%")[0]  # an IPv6 link-local address carries its zone: fe80::1%eth0
        for entries in psutil.net_if_addrs().values()
        for address in entries
        if address.family in (socket.AF_INET, socket.AF_INET6)
    ]
    return list(dict.fromkeys([*names, *addresses]))


def default_allowed_hosts(bind_host: str) -> list[str]:
    """The Host names a server bound to ``bind_host`` answers without ``--allowed-host``."""
    if bind_host.strip("[]") in WILDCARD_BINDS:
        return list(dict.fromkeys([*LOCALHOST_NAMES, *machine_names_and_addresses()]))
    return list(dict.fromkeys([*LOCALHOST_NAMES, bind_host.strip("[]")]))


def host_of(host_header: str) -> str:
    """The name in a ``Host`` value, lower-case, without port, brackets or a trailing dot."""
    value = host_header.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:  # name:port (a bare IPv6 address has more colons)
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HostAllowList:
    """Exact names and addresses, ``*.example.org`` suffixes, or ``*`` (any host: the check is off)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self._any = False
        self._exact: set[str] = set()
        self._suffixes: list[str] = []
        for pattern in patterns:
            pattern = pattern.strip().lower().rstrip(".")
            if pattern == "*":
                self._any = True
            elif pattern.startswith("*."):
                self._suffixes.append(pattern[1:])
            elif pattern:
                self._exact.add(canonical_host(host_of(pattern)))

    def allows(self, host_header: str | None) -> bool:
        if self._any:
            return True
        if not host_header:  # HTTP/1.0 without Host: nothing a browser sends
            return False
        host = canonical_host(host_of(host_header))
        return host in self._exact or any(host.endswith(suffix) for suffix in self._suffixes)


def canonical_host(host: str) -> str:
    """IP addresses in one spelling (``::0001`` is ``::1``); names as they are."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return host


def allowed_hosts(settings: Settings) -> HostAllowList:
    return HostAllowList([*default_allowed_hosts(settings.host), *settings.allowed_hosts])


class OriginPolicy:
    """Which browser origins may place calls and open sessions: ``--cors-origin`` ones, and this
    server's own — an origin naming an allowed host, the very one the request was sent to. Host
    alone proves nothing: a DNS-rebinding page sends its own name in both Host and Origin."""

    def __init__(self, settings: Settings) -> None:
        self._hosts = allowed_hosts(settings)
        self._cors = set(settings.cors_origins)

    def allows(self, origin: str | None, host_header: str | None) -> bool:
        if origin is None:  # not sent by a browser: no page of another site is behind it
            return True
        if origin in self._cors:
            return True
        netloc = urlsplit(origin).netloc.lower()
        return bool(netloc) and self._hosts.allows(netloc) and netloc == (host_header or "").strip().lower()


class TrustedProxies:
    """The ``--trusted-proxy`` addresses and networks."""

    def __init__(self, proxies: Iterable[str]) -> None:
        self.networks = [ipaddress.ip_network(proxy, strict=False) for proxy in proxies]

    def __contains__(self, host: object) -> bool:
        if not isinstance(host, str):
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


def has_forwarding_headers(headers: Headers) -> bool:
    return any(name in FORWARDING_HEADERS for name in headers.keys())


def is_local_client(connection: HTTPConnection, proxies: TrustedProxies) -> bool:
    """The peer is on this machine, is not a proxy, and speaks for nobody else."""
    client = connection.client
    return (
        client is not None
        and is_loopback_host(client.host)
        and client.host not in proxies
        and not has_forwarding_headers(connection.headers)
    )


class EdgeMiddleware:
    """Checks Host on every request, refuses undeclared proxies of a keyless server, then lets the
    trusted proxies' forwarded headers name the client (``scope["client"]``, ``scope["scheme"]``)."""

    def __init__(self, app: ASGIApp, *, settings: Settings) -> None:
        self._allowed_hosts = allowed_hosts(settings)
        self._keyless = settings.api_key is None and not settings.allow_unauthenticated_public
        # Without a trusted proxy no forwarded header is read: the app is called as it is.
        self._app = app
        if settings.trusted_proxies:  # uvicorn and Starlette spell the same ASGI callable differently
            self._app = cast(ASGIApp, ProxyHeadersMiddleware(cast(Any, app), trusted_hosts=settings.trusted_proxies))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(headers)
        if refusal is not None:
            logger.info("refused %s %s: %s", scope["type"], scope.get("path"), refusal.code)
            await refusal.to_response()(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _refusal(self, headers: Headers) -> ApiError | None:
        if not self._allowed_hosts.allows(headers.get("host")):
            return ApiError(
                421,
                "This server does not answer for the host this request names; its operator can allow the "
                "name with --allowed-host.",
                code="host_not_allowed",
            )
        if self._keyless and has_forwarding_headers(headers):
            return ApiError(
                403,
                "This server has no API key and was reached through a proxy it does not trust; its operator "
                "must set --api-key and --trusted-proxy.",
                code="proxy_not_trusted",
            )
        return None
