"""Reading the operator's routes once they settle: a session's timeline is closed a moment after
its call ends, a recording written whole a moment after its session."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

POLLS = 200  # every 50 ms: 10 s, a guard against hangs
POLL_S = 0.05


async def settled(url: str, path: str, key: str, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """``GET path`` of the server at ``url`` (asked from this machine): its list under ``key`` once
    it is not empty and ``done`` holds for each entry."""
    listed: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(POLLS):
            listed = (await client.get(path)).json()[key]
            if listed and all(done(entry) for entry in listed):
                return listed
            await asyncio.sleep(POLL_S)
    raise AssertionError(f"{path}: not settled: {listed}")


async def closed_sessions(url: str) -> list[dict[str, Any]]:
    """``GET /debug/turns``' sessions once all are closed."""
    return await settled(url, "/debug/turns", "sessions", lambda session: session["closed_ms"] is not None)


async def finished_recordings(url: str) -> list[dict[str, Any]]:
    """``GET /debug/recordings``' recordings once every one is written whole."""
    return await settled(url, "/debug/recordings", "recordings", lambda recording: recording["ended"] is not None)
