"""``GET /debug/resources``: what the server's processes hold, for soak tests and leak hunts;
``GET /debug/turns``: the recent sessions' turn timelines (``app.turn_timelines``) of the server
process and its media workers (asked over IPC), which the operator page ``/debug/timeline.html``
(static/debug/) draws;
``GET /debug/recordings``: the recordings in ``--record-dir`` (``app.recording_playback``), newest
first (an empty list when nothing is recorded); ``GET /debug/recordings/{session_id}/{file}`` one
of a recording's files (``RECORDING_FILES``), and ``.../audio.wav`` both sides on the session's
clock as one stereo WAV, streamed a block at a time (a ``Range`` is honoured: players seek). The
record dir is the front's and its media workers' alike, so the front lists it itself.

For resources, the front (or only) process's figures at the top level; with media workers, ``workers`` lists
each worker's own figures (``app.resources``), fetched over the workers' IPC, since a
call's peer, session and tasks live in its worker.

All answer a local client (``app.http.edge.is_local_client``: loopback, not a trusted proxy, no
forwarding header: a proxy on this host also connects from 127.0.0.1), or the API key: the
figures (open files, task count) help whoever probes for weaknesses, the timelines tell who
spoke when, the recordings hold what was said, and a leak check runs on the server's own machine
anyway.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.config import Settings
from app.http.auth import Authenticator
from app.http.edge import TrustedProxies, is_local_client
from app.http.errors import ApiError
from app.http.session_start import runtime_of, serving_runtime
from app.recording_playback import RECORDING_FILES, find_recording, list_recordings, wav_bytes, wav_plan
from app.resources import process_resources
from app.turn_timelines import RECENT_SESSIONS

_BYTE_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


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
        runtime = serving_runtime(request.app.state)
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

    @router.get("/debug/recordings")
    async def recordings(request: Request) -> dict[str, Any]:
        check_access(request)
        if settings.record_dir is None:
            return {"recordings": [], "recording": False}
        listed = await run_in_threadpool(list_recordings, settings.record_dir)
        return {"recordings": [asdict(summary) for summary in listed], "recording": True}

    async def recording_folder(session_id: str) -> Path:
        folder = None
        if settings.record_dir is not None:
            folder = await run_in_threadpool(find_recording, settings.record_dir, session_id)
        if folder is None:
            raise ApiError(404, f"No recording of session {session_id!r} (GET /debug/recordings lists them).",
                           code="recording_not_found")
        return folder

    @router.get("/debug/recordings/{session_id}/audio.wav")
    async def recording_audio(request: Request, session_id: str) -> Response:
        check_access(request)
        folder = await recording_folder(session_id)
        plan = await run_in_threadpool(wav_plan, folder)
        if plan is None:
            raise ApiError(409, f"The recording of session {session_id!r} is not finished: it has no timeline.json yet.",
                           code="recording_unfinished")
        headers = {"Accept-Ranges": "bytes", "Cache-Control": "no-store"}
        first, last = 0, plan.size - 1
        asked = _BYTE_RANGE.match(request.headers.get("range", "").strip())
        if asked is not None and (asked.group(1) or asked.group(2)):
            if asked.group(1):
                first = int(asked.group(1))
                last = min(int(asked.group(2)), last) if asked.group(2) else last
            else:  # the last N bytes
                first = max(0, plan.size - int(asked.group(2)))
            if first > last:
                return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{plan.size}"})
            headers["Content-Range"] = f"bytes {first}-{last}/{plan.size}"
        headers["Content-Length"] = str(last - first + 1)
        # A sync iterator: Starlette runs each step in its thread pool (file reads, resampling).
        return StreamingResponse(wav_bytes(plan, first, last), status_code=206 if "Content-Range" in headers else 200,
                                 media_type="audio/wav", headers=headers)

    @router.get("/debug/recordings/{session_id}/{name}")
    async def recording_file(request: Request, session_id: str, name: str) -> Response:
        check_access(request)
        if name not in RECORDING_FILES:
            raise ApiError(404, f"A recording serves {', '.join([*RECORDING_FILES, 'audio.wav'])}; not {name!r}.",
                           code="recording_file_unknown", param="name")
        folder = await recording_folder(session_id)
        path = folder / name
        if not await run_in_threadpool(path.is_file):
            raise ApiError(404, f"The recording of session {session_id!r} has no {name} (yet).",
                           code="recording_file_missing")
        return FileResponse(path, media_type=RECORDING_FILES[name], headers={"Cache-Control": "no-store"})

    return router
