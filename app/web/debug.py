"""``GET /debug/resources``: what the server's processes hold, for soak tests and leak hunts.

The front (or only) process's figures at the top level; with media workers, ``workers`` lists
each worker's own figures (``app.web.resources``), fetched over the workers' IPC, since a
call's peer, session and tasks live in its worker.

Answers only clients on loopback: the figures (open files, task count) help whoever
probes for weaknesses, and a leak check runs on the server's own machine anyway.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.config import is_loopback_host
from app.web.errors import ApiError
from app.web.resources import process_resources


def debug_router() -> APIRouter:
    router = APIRouter()

    @router.get("/debug/resources")
    async def resources(request: Request) -> dict[str, Any]:
        client = request.client
        if client is None or not is_loopback_host(client.host):
            raise ApiError(403, "/debug/resources answers loopback clients only.", code="forbidden")
        figures = process_resources()
        runtime = getattr(request.app.state, "runtime", None)
        workers = runtime.workers if runtime is not None else None
        if workers is not None:
            figures["workers"] = await workers.resources()
        return figures

    return router
