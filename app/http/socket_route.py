"""The Realtime protocol over a WebSocket: ``GET /v1/realtime``, as OpenAI's server-side SDKs speak it.

The same ``RealtimeSession`` as over WebRTC, on a different carrier:

- Events are JSON text frames both ways; ``session.created`` comes first. ``?model=`` is
  accepted (any name, as ``model`` in ``session.update``) and logged; the session reports the
  model this server serves.
- Audio comes in as ``input_audio_buffer.append`` (the session's input format) into the same
  VAD and turn detection, and leaves as ``response.output_audio.delta`` events
  (``app.transports.websocket.event_audio.EventAudioOutput``); no ``output_audio_buffer.*`` events.
- Auth as for calls: ``Authorization: Bearer`` with the API key or an ``ek_`` client secret, or,
  for browsers (which cannot set headers on a WebSocket), the ``openai-insecure-api-key.<key>``
  subprotocol. A browser's ``Origin`` must be this server's own or one of ``--cors-origin``.
  Refusals are HTTP answers with OpenAI's error body (401, 403, 429 + ``Retry-After``).
- Limits as over WebRTC: the event gate (size, rate), text length, ``--max-session-s`` (then
  ``session_expired`` and close), and ``--max-sessions`` shared with the WebRTC calls. A binary
  frame, or any bad event, is answered with an ``error`` event and the socket stays open. The
  server runs without permessage-deflate (:func:`websocket_server_options`), so a frame holds
  what the client sent; frames over uvicorn's ``ws_max_size`` (``max_frame_bytes``: 32 MiB with
  the default image limit) close it with 1009, as the server library does; frames up to it are
  read, so an image too large for ``--max-image-bytes`` gets an ``error`` (a 20 MB photo is 27 MB
  of base64), and every event pays rate tokens by its size.
- A client that goes (close frame, dropped TCP, missed pings: uvicorn pings every 20 s) ends
  the session and its engine work; so does one that stops reading while
  ``app.transports.websocket.socket_call.MAX_PENDING_BYTES`` of events wait for it. ``session.finished`` (the answer to
  ``session.finish``) ends it too, once it has left: the socket closes with 1000.
- Qwen's own realtime clients (DashScope's SDK, ``dashscope.audio.qwen_omni``) get the same session
  in DashScope's dialect (``app.transports.websocket.dashscope``: its fields in, its event names out) on
  ``GET /api-ws/v1/realtime`` (DashScope's own path: its SDK's ``url`` keeps it), and on
  ``GET /v1/realtime`` when the handshake comes from that SDK (:func:`dialect_of`: its
  ``user-agent`` starts ``dashscope/``, or it sends ``x-dashscope-sdk-client``). Every other
  client on ``/v1/realtime`` speaks OpenAI's protocol, unchanged.

The connection itself, once admitted, is ``app.transports.websocket.socket_call.SocketCall``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, WebSocket

from app.calls.registry import CapacityError, ClientLimitError
from app.config import Settings
from app.http.auth import Authenticator, CallGrant, bearer_token, missing_credentials
from app.http.call_refusals import call_refused
from app.http.edge import OriginPolicy, TrustedProxies
from app.http.errors import ApiError
from app.http.session_start import admission_of, read_session_config, runtime_of
from app.metrics import Metrics
from app.realtime.session_config import SessionConfig
from app.serving.call_factory import session_factory
from app.transports.websocket.dashscope import DashScopeDialect
from app.transports.websocket.socket_call import SocketCall

logger = logging.getLogger(__name__)

# The least frame the server reads before closing with 1009: a 20 MiB photo is 27 MiB of base64,
# and is answered with an error (uvicorn's own default is 16 MiB).
MIN_MAX_FRAME_BYTES = 32 * 1024 * 1024


def max_frame_bytes(settings: Settings) -> int:
    """uvicorn's ``ws_max_size``: at least twice the largest image event, so that an image over the
    limit is read and refused with an ``error``, not answered by a closed socket."""
    largest_event = settings.max_event_bytes + 4 * -(-settings.max_image_bytes // 3)
    return max(MIN_MAX_FRAME_BYTES, 2 * largest_event)


# Browsers cannot set headers on a WebSocket; OpenAI takes the key as this subprotocol.
API_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
REALTIME_SUBPROTOCOL = "realtime"  # what OpenAI's browser examples offer, and we choose
# DashScope's endpoint is wss://dashscope.aliyuncs.com/api-ws/v1/realtime; its SDK appends ?model=.
DASHSCOPE_PATH = "/api-ws/v1/realtime"
DASHSCOPE_USER_AGENT_PREFIX = "dashscope/"  # dashscope.common.utils.get_user_agent
DASHSCOPE_SDK_HEADER = "x-dashscope-sdk-client"  # dashscope.common.utils.get_sdk_headers

def websocket_server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's WebSocket options for ``GET /v1/realtime`` (``uvicorn.run(..., **options)``).

    permessage-deflate is off (*decided*, docs/HARDENING.md): with it, 40 frames of 16 KB
    inflated to 0.67 GB before any size check could see them (RSS 824 MB); without it every
    byte the server holds was sent, and is counted. It saved a third of the bytes of audio
    appends (base64 PCM) and nine tenths of small JSON events: ~0.2 Mbit/s per session, which no
    deployment here needs. ``ws_max_size`` bounds one frame as sent (:func:`max_frame_bytes`);
    uvicorn's reader holds one message at a time, pausing the socket until the app takes it.
    """
    return {"ws_per_message_deflate": False, "ws_max_size": max_frame_bytes(settings)}


def websocket_router(
    settings: Settings, authenticator: Authenticator, metrics: Metrics, base_config: SessionConfig
) -> APIRouter:
    """``GET /v1/realtime``; the runtime (engine, VAD, registry) is read per connection from the app."""
    router = APIRouter()
    origins = OriginPolicy(settings)
    proxies = TrustedProxies(settings.trusted_proxies)

    @router.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket, model: str | None = None) -> None:
        await serve(websocket, model, dialect_of(websocket))

    @router.websocket(DASHSCOPE_PATH)
    async def dashscope_realtime(websocket: WebSocket, model: str | None = None) -> None:
        await serve(websocket, model, DashScopeDialect())

    async def serve(websocket: WebSocket, model: str | None, dialect: DashScopeDialect | None) -> None:
        offered = list(websocket.scope.get("subprotocols") or [])
        try:
            runtime = runtime_of(websocket)
            _check_origin(websocket, origins)
            grant = _authorize(websocket, authenticator, offered)
            base = base_config if dialect is None else dialect.initial_config(base_config)
            config = await read_session_config(grant.session or {}, base)

            admission = admission_of(websocket, grant, proxies, connects=False)
            make_session = session_factory(
                settings, metrics, config, session_engine=runtime.session_engine, shared_engine=runtime.for_sessions,
                vad=runtime.vad, end_of_turn=runtime.end_of_turn, tracing=runtime.tracing, timelines=runtime.timelines,
                recordings=runtime.recordings, client_shares=runtime.client_shares,
                client=admission.client_key if admission is not None else None,
                transport=SocketCall.transport, session_fields=None if dialect is None else dialect.session_fields,
            )

            try:
                call = runtime.calls.admit(
                    lambda on_closed: SocketCall(
                        websocket, make_session=make_session, max_duration_s=settings.max_session_s,
                        idle_timeout_s=settings.session_idle_timeout_s,
                        observer=metrics.observer(transport=SocketCall.transport), on_closed=on_closed,
                        dialect=dialect,
                    ),
                    admission=admission,
                )
            except (CapacityError, ClientLimitError) as exc:
                raise call_refused(exc, settings, metrics) from None
        except ApiError as error:
            await _deny(websocket, error)
            return
        logger.info("%s: opened (model %r asked for%s; %d sessions open)", call.id, model,
                    "" if dialect is None else f", {dialect.name} dialect", len(runtime.calls))
        await call.serve(_chosen_subprotocol(offered))

    return router


def dialect_of(websocket: WebSocket) -> DashScopeDialect | None:
    """The dialect of a ``/v1/realtime`` handshake: DashScope's for its SDK (by the headers it
    always sends), else none (OpenAI's protocol)."""
    headers = websocket.headers
    if headers.get("user-agent", "").startswith(DASHSCOPE_USER_AGENT_PREFIX) or DASHSCOPE_SDK_HEADER in headers:
        return DashScopeDialect()
    return None


def _check_origin(websocket: WebSocket, origins: OriginPolicy) -> None:
    """Browsers send ``Origin``; only this server's own and the ``--cors-origin`` ones may connect."""
    origin = websocket.headers.get("origin")
    if origins.allows(origin, websocket.headers.get("host")):
        return
    raise ApiError(
        403, f"Origin {origin!r} may not open sessions here; the server allows it with --cors-origin.",
        code="origin_not_allowed",
    )


def _authorize(websocket: WebSocket, authenticator: Authenticator, offered: list[str]) -> CallGrant:
    if not authenticator.enabled:
        return CallGrant(via="open")
    token = bearer_token(websocket.headers.get("authorization", ""))
    if token is None:
        token = next((p[len(API_KEY_SUBPROTOCOL_PREFIX):] for p in offered if p.startswith(API_KEY_SUBPROTOCOL_PREFIX)),
                     None)
    if not token:
        raise missing_credentials()
    return authenticator.authorize_token(token)


def _chosen_subprotocol(offered: list[str]) -> str | None:
    """``realtime`` when offered, else any other offered one but the key: a browser that offered
    subprotocols fails the handshake when none is chosen, and the key is never echoed."""
    if REALTIME_SUBPROTOCOL in offered:
        return REALTIME_SUBPROTOCOL
    return next((p for p in offered if not p.startswith(API_KEY_SUBPROTOCOL_PREFIX)), None)


async def _deny(websocket: WebSocket, error: ApiError) -> None:
    """Refuses the handshake with an HTTP answer (OpenAI's error body) where the server can send one."""
    logger.info("WebSocket refused: %d %s", error.status_code, error.message)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error.to_response())
    else:
        await websocket.close(code=1008, reason=error.message[:120])  # a close reason holds 123 bytes
