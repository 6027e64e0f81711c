"""``GET /debug/resources``: what the server's processes hold, for soak tests and leak hunts;
``GET /debug/turns``: the recent sessions' turn timelines (``app.turn_timelines``) of the server
process and its media workers (asked over IPC), which the operator page ``/debug/timeline.html``
(static/debug/) draws.

For resources, the front (or only) process's figures at the top level; with media workers, ``workers`` lists
each worker's own figures (``app.resources``), fetched over the workers' IPC, since a
call's peer, session and tasks live in its worker.

Both answer a local client (``app.http.edge.is_local_client``: loopback, not a trusted proxy, no
forwarding header: a proxy on this host also connects from 127.0.0.1), or the API key: the
figures (open files, task count) help whoever probes for weaknesses, the timelines tell who
spoke when, and a leak check runs on the server's own machine anyway.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.config import Settings
from app.http.auth import Authenticator
from app.http.edge import TrustedProxies, is_local_client
from app.http.errors import ApiError
from app.http.session_start import runtime_of
from app.resources import process_resources
from app.turn_timelines import RECENT_SESSIONS


def debug_router(settings: Settings, authenticator: Authenticator) -> APIRouter:
    router = APIRouter()
    proxies = TrustedProxies(settings.trusted_proxies)

    def check_access(request: Request) -> None:
        if not is_local_client(request, proxies) and not authenticator.has_api_key(request):
            raise ApiError(
                403, f"{request.url.path} answers clients on this machine that come through no proxy, or the API key.",
                code="forbidden",
            )

    @router.get("/debug/resources")
    async def resources(request: Request) -> dict[str, Any]:
        check_access(request)
        figures = process_resources()
        runtime = getattr(request.app.state, "runtime", None)
        workers = runtime.workers if runtime is not None else None
        if workers is not None:
            figures["workers"] = await workers.resources()
        return figures

    @router.get("/debug/turns")
    async def turns(request: Request) -> dict[str, Any]:
        check_access(request)
        runtime = runtime_of(request)
        sessions = [{**session, "worker": "front"} for session in runtime.timelines.to_json()]
        if runtime.workers is not None:
            sessions += await runtime.workers.turns()
        # Each process keeps its last RECENT_SESSIONS: of them all, the newest as many.
        sessions.sort(key=lambda session: session["started_at"])
        return {"sessions": sessions[-RECENT_SESSIONS:]}

    return router
