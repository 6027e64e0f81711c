"""``GET /debug/resources``: the soak test's view of the server process."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from app.config import Settings
from app.http.auth import Authenticator
from app.http.debug import debug_router
from app.http.errors import ApiError, api_error_handler


def build_app() -> FastAPI:
    app = FastAPI()
    app.add_exception_handler(ApiError, api_error_handler)
    app.include_router(debug_router(Settings(), Authenticator(None)))
    return app


async def get_resources(client_host: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=build_app(), client=(client_host, 50_000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/debug/resources")


async def test_loopback_client_gets_the_process_figures():
    response = await get_resources("127.0.0.1")
    assert response.status_code == 200
    figures = response.json()
    assert set(figures) == {
        "rss_bytes", "threads", "thread_kinds", "os_threads", "fds", "asyncio_tasks", "child_processes", "children_rss_bytes"
    }
    assert figures["rss_bytes"] > 0
    assert figures["fds"] > 0
    assert figures["asyncio_tasks"] >= 1  # the request's own task
    assert figures["thread_kinds"]["MainThread"] == 1
    assert sum(figures["thread_kinds"].values()) == figures["threads"]


async def test_other_clients_are_refused():
    response = await get_resources("192.0.2.7")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
