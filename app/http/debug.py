"""``GET /debug/resources``: what the server's processes hold, for soak tests and leak hunts.

The front (or only) process's figures at the top level; with media workers, ``workers`` lists
each worker's own figures (``app.resources``), fetched over the workers' IPC, since a
call's peer, session and tasks live in its worker.

Answers a local client (``app.http.edge.is_local_client``: loopback, not a trusted proxy, no
forwarding header: a proxy on this host also connects from 127.0.0.1), or the API key: the
figures (open files, task count) help whoever probes for weaknesses, and a leak check runs on the
server's own machine anyway.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.config import Settings
from app.http.auth import Authenticator
from app.http.edge import TrustedProxies, is_local_client
from app.http.errors import ApiError
from app.resources import process_resources


def debug_router(settings: Settings, authenticator: Authenticator) -> APIRouter:
    router = APIRouter()
    proxies = TrustedProxies(settings.trusted_proxies)

    @router.get("/debug/resources")
    async def resources(request: Request) -> dict[str, Any]:
        if not is_local_client(request, proxies) and not authenticator.has_api_key(request):
            raise ApiError(
                403, "/debug/resources answers clients on this machine that come through no proxy, or the API key.",
                code="forbidden",
            )
        figures = process_resources()
        runtime = getattr(request.app.state, "runtime", None)
        workers = runtime.workers if runtime is not None else None
        if workers is not None:
            figures["workers"] = await workers.resources()
        return figures

    return router
