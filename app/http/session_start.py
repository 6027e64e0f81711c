"""What both session routes read before a session starts (``POST /v1/realtime/calls``,
``GET /v1/realtime``): the serving runtime, and the session's config from what the client sent."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import State
from starlette.requests import HTTPConnection

from app.calls.registry import Admission
from app.http.auth import CallGrant
from app.http.edge import TrustedProxies, is_local_client
from app.http.errors import ApiError
from app.realtime.protocol import ProtocolError
from app.realtime.session_config import SessionConfig, check_session, session_param
from app.serving.runtime import Runtime


def serving_runtime(state: State) -> Runtime | None:
    """The runtime on an app's ``state`` while it serves (``app.http.server``'s lifespan puts it
    there); None while the server starts or stops. The one reader of it: Starlette's ``State``
    holds anything, so its type is checked here."""
    runtime = getattr(state, "runtime", None)
    return runtime if isinstance(runtime, Runtime) else None


def runtime_of(connection: HTTPConnection) -> Runtime:
    """The serving runtime (a request's or a WebSocket's), or 503 while the server starts or stops."""
    runtime = serving_runtime(connection.app.state)
    if runtime is None:
        raise ApiError(503, "The server is starting or stopping.", type="server_error", code="unavailable")
    return runtime


async def read_session_config(partial: dict[str, Any], base: SessionConfig) -> SessionConfig:
    """The session a call or WebSocket starts with; ``ApiError`` 400 for a bad or over-budget one."""
    try:
        config = SessionConfig.from_session(partial, base=base)
        await check_session(config, since=base, param=session_param(partial))
        return config
    except ProtocolError as exc:
        param = f"session.{exc.param}" if exc.param and not exc.param.startswith("session") else exc.param or "session"
        raise ApiError(400, f"Invalid session: {exc.message}", code=exc.code, param=param) from None


def admission_of(connection: HTTPConnection, grant: CallGrant, proxies: TrustedProxies, *, connects: bool) -> Admission | None:
    """Who asks for the session: the client's address as the trusted proxies name it, held to the
    per-client bound unless it is on this machine or holds the API key; None without an address."""
    if connection.client is None:
        return None
    bounded = grant.via != "api_key" and not is_local_client(connection, proxies)
    return Admission(connection.client.host, bounded=bounded, connects=connects)
