"""The HTTP server: signaling (``/v1/realtime/calls``), health, metrics and the page.

``create_app(settings)`` builds a FastAPI app whose lifespan starts what every call shares
(the engine and the Silero VAD) and, on shutdown, closes every open call before the engine.
An engine passed in is the caller's: the app uses it but neither starts nor closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiortc import RTCConfiguration
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware

from app.auth import ApiError, Authenticator, CallGrant, install_auth
from app.config import Settings
from app.ice import rtc_configuration
from app.debug import debug_router
from app.limits import StallTimeoutEngine, capacity_error, check_offer_sdp, read_offer_body
from app.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.metrics import MeteredEngine, Metrics
from app.rtc import Call, CallRegistry, CapacityError, OfferError, SessionFactory
from app.protocol import ProtocolError
from app.session import AudioOutput, RealtimeSession
from app.session_config import SessionConfig
from media.vad import SileroVad
from pipeline.turn import Engine

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
SDP_CONTENT_TYPE = "application/sdp"


@dataclass
class Runtime:
    """What the lifespan built; present while the app serves."""

    engine: Engine
    for_sessions: Engine  # the engine as sessions get it
    model: str
    vad: SileroVad
    calls: CallRegistry


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    metrics = Metrics()
    authenticator = Authenticator(settings.api_key.get_secret_value() if settings.api_key else None)
    _rtc_configuration(settings)  # a bad ICE server URL fails here, at start-up, not per call

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if engine is None:
                serving, model = await _start_engine(settings)
                stack.push_async_callback(serving.close)
            else:
                serving, model = engine, getattr(engine, "name", type(engine).__name__)
            vad = await asyncio.to_thread(SileroVad.load)
            calls = CallRegistry(
                settings.max_sessions,
                on_count=metrics.sessions_open.set,
                on_closed=lambda call, reason: metrics.calls.labels(reason=reason).inc(),
            )
            # Registered last, so it runs first: calls (and their engine turns) end before the engine.
            stack.push_async_callback(calls.close_all)
            # Sessions get the engine with stalled turns failed (not hung) and timings recorded.
            for_sessions = MeteredEngine(StallTimeoutEngine(serving, stall_timeout_s=settings.turn_stall_timeout_s), metrics)
            app.state.runtime = Runtime(engine=serving, for_sessions=for_sessions, model=model, vad=vad, calls=calls)
            logger.info("serving %s on http://%s:%d", model, settings.host, settings.port)
            try:
                yield
            finally:
                del app.state.runtime

    app = FastAPI(title="omni-rtc", lifespan=lifespan)
    base_config = _base_session_config(settings)

    def resolve_session(partial: dict[str, Any] | None) -> dict[str, Any]:
        """The effective session a client secret's call will start with (``ValueError`` when wrong)."""
        try:
            config = SessionConfig.from_session(partial or {}, base=base_config)
        except ProtocolError as exc:
            raise ValueError(exc.message) from None
        runtime = getattr(app.state, "runtime", None)
        model = runtime.for_sessions.name if runtime is not None else "unknown"
        return config.to_session_object(session_id="", model=model, expires_at=0).model_dump(mode="json")

    install_auth(app, authenticator, resolve_session)
    app.include_router(debug_router())
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            # OpenAI clients send authorization, content-type and their own x-… headers;
            # "*" answers a preflight with exactly the headers it asked for.
            allow_headers=["*"],
            expose_headers=["Location"],
            max_age=600,
        )

    @app.post("/v1/realtime/calls", status_code=201)
    async def create_call(request: Request, grant: CallGrant = Depends(authenticator.authorize_call)) -> Response:
        runtime = _runtime(request)
        offer, session = await _read_offer(request, settings)
        config = _session_config({**(grant.session or {}), **(session or {})}, base_config)

        def make_session(output: AudioOutput, send: Callable[[dict[str, Any]], None]) -> RealtimeSession:
            return RealtimeSession(engine=runtime.for_sessions, vad=runtime.vad, output=output, send=send, config=config)

        try:
            call = runtime.calls.admit(lambda on_closed: _new_call(settings, make_session, metrics, on_closed))
        except CapacityError:
            metrics.errors.labels(type="rate_limit_error", code="too_many_sessions").inc()
            raise capacity_error(settings.max_sessions) from None
        try:
            answer = await call.answer(offer)
        except OfferError as exc:
            await call.close("bad_offer")
            metrics.errors.labels(type="invalid_request_error", code="invalid_sdp").inc()
            raise ApiError(400, str(exc), code="invalid_sdp") from None
        except BaseException:
            await call.close("signaling_failed")
            raise
        logger.info("call %s: answered (%d open)", call.id, len(runtime.calls))
        return Response(
            answer,
            status_code=201,
            media_type=SDP_CONTENT_TYPE,
            headers={"Location": f"/v1/realtime/calls/{call.id}"},
        )

    @app.delete("/v1/realtime/calls/{call_id}", status_code=204)
    @app.post("/v1/realtime/calls/{call_id}/hangup", status_code=204)  # OpenAI's name for it
    async def hang_up(call_id: str, request: Request) -> Response:
        await authenticator.require_api_key(request)
        call = _runtime(request).calls.get(call_id)
        if call is None:
            raise ApiError(404, f"No open call {call_id!r}.", code="call_not_found", param="call_id")
        await call.close("hangup")
        return Response(status_code=204)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        runtime = getattr(request.app.state, "runtime", None)
        if runtime is None:
            return JSONResponse({"status": "starting", "sessions": 0}, status_code=503)
        alive = bool(getattr(runtime.engine, "alive", True))
        return JSONResponse(
            {
                "status": "ok" if alive else "degraded",
                "model": runtime.model,
                "sessions": len(runtime.calls),
                "max_sessions": settings.max_sessions,
                "engine": {
                    "alive": alive,
                    "restarts": int(getattr(runtime.engine, "restarts", 0)),
                    "queue_depth": int(getattr(runtime.engine, "queue_depth", 0)),
                },
            },
            status_code=200 if alive else 503,
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    # The page and its files (index.html names app.js and style.css relatively), after every
    # route above so that none of them is shadowed.
    app.mount("/", StaticFiles(directory=STATIC_DIR, html=True, check_dir=False), name="static")
    return app


def _new_call(
    settings: Settings, make_session: SessionFactory, metrics: Metrics, on_closed: Callable[[Call, str], None]
) -> Call:
    return Call(
        make_session=make_session,
        configuration=_rtc_configuration(settings),
        ice_loopback=settings.ice_loopback,
        connect_timeout_s=settings.connect_timeout_s,
        disconnect_timeout_s=settings.disconnect_timeout_s,
        max_duration_s=settings.max_session_s,
        observer=metrics.observer(),
        on_closed=on_closed,
    )


def _rtc_configuration(settings: Settings) -> RTCConfiguration:
    credential = settings.turn_credential.get_secret_value() if settings.turn_credential else None
    return rtc_configuration(settings.ice_servers, username=settings.turn_username, credential=credential)


def _runtime(request: Request) -> Runtime:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise ApiError(503, "The server is starting or stopping.", type="server_error", code="unavailable")
    return runtime


async def _read_offer(request: Request, settings: Settings) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the optional session config, from a raw or a multipart body."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        form = await request.form()
        sdp_field = form.get("sdp")
        if sdp_field is None:
            raise ApiError(400, "The multipart offer has no 'sdp' field.", code="invalid_sdp", param="sdp")
        sdp_bytes = await sdp_field.read() if hasattr(sdp_field, "read") else str(sdp_field).encode()
        session_field = form.get("session")
        session = None
        if session_field is not None:
            raw = await session_field.read() if hasattr(session_field, "read") else str(session_field).encode()
            session = _parse_session_json(raw)
        return check_offer_sdp(sdp_bytes, max_bytes=settings.max_sdp_bytes), session
    if content_type not in ("", SDP_CONTENT_TYPE, "text/plain"):
        raise ApiError(
            415,
            f"Send the offer as {SDP_CONTENT_TYPE} (or multipart/form-data with 'sdp' and 'session'), not {content_type}.",
            code="unsupported_media_type",
        )
    body = await read_offer_body(request, max_bytes=settings.max_sdp_bytes)
    return check_offer_sdp(body, max_bytes=settings.max_sdp_bytes), None


def _parse_session_json(raw: bytes) -> dict[str, Any]:
    try:
        session = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"The 'session' field is not JSON: {exc}", param="session") from None
    if not isinstance(session, dict):
        raise ApiError(400, "The 'session' field must be a JSON object.", param="session")
    return session


def _base_session_config(settings: Settings) -> SessionConfig:
    """What every session starts from: the server-side limits of the settings."""
    return SessionConfig(
        max_text_chars=settings.max_text_chars,
        max_event_bytes=settings.max_event_bytes,
        max_events_per_second=settings.max_events_per_second,
        max_event_burst=settings.max_event_burst,
    )


def _session_config(partial: dict[str, Any], base: SessionConfig) -> SessionConfig:
    try:
        return SessionConfig.from_session(partial, base=base)
    except ProtocolError as exc:
        param = f"session.{exc.param}" if exc.param and not exc.param.startswith("session") else exc.param or "session"
        raise ApiError(400, f"Invalid session: {exc.message}", code=exc.code, param=param) from None


async def _start_engine(settings: Settings) -> tuple[Engine, str]:
    # Imported here: the engine pulls in torch and transformers, which the CLI's other
    # commands and the client never need.
    from pipeline.devmodel import ensure_dev_model
    from pipeline.engine import TransformersEngine

    if settings.model is None:
        model_dir = await asyncio.to_thread(ensure_dev_model, settings.cache_dir)
        model = str(model_dir)
        logger.info("no model given: using the dev model at %s", model_dir)
    else:
        model = settings.model
    engine = TransformersEngine(
        model,
        device=settings.device,
        dtype=settings.dtype,
        seed=settings.seed,
        generation=settings.generation,
        threads=settings.engine_threads,
    )
    await engine.start()
    return engine, model
