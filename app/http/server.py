"""The HTTP server: signaling (``app.http.signaling``), the WebSocket (``app.http.socket_route``), client secrets,
health, metrics and the page.

``create_app(settings)`` builds a FastAPI app whose lifespan starts what every call shares
(the engine, the Silero VAD and the end-of-turn model) and, on shutdown, closes every open call before the engine.
An engine passed in is the caller's: the app uses it but neither starts nor closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware

from app.calls.registry import CallRegistry
from app.config import Settings, VllmOmniServers, dev_replies_file, load_dev_replies
from app.http.auth import Authenticator, install_auth
from app.http.debug import debug_router
from app.http.edge import EdgeMiddleware
from app.http.errors import ApiError
from app.http.ice_servers import ice_servers_router
from app.http.session_start import serving_runtime
from app.http.signaling import signaling_router
from app.http.socket_route import websocket_router
from app.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.metrics import Metrics
from app.realtime.protocol import ProtocolError
from app.realtime.session_config import (
    SessionConfig,
    TurnDetection,
    check_session,
    check_tool_choice,
    fitted,
    session_param,
)
from app.realtime.shares import ClientShares
from app.recording import Recordings
from app.serving.call_factory import check_jitter_buffer, check_text_judge, ice_servers, load_end_of_turn_model
from app.serving.engines import MeteredEngine, StallTimeoutEngine
from app.serving.loop_watchdog import LoopWatchdog
from app.serving.media_workers import MediaWorkerPool
from app.serving.runtime import Runtime
from app.tracing import Tracing, TracingEnvironment
from media.vad import SileroVad
from pipeline.contract import Engine
from pipeline.conversation import HistoryLimits

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
SDP_CONTENT_TYPE = "application/sdp"


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    metrics = Metrics()
    authenticator = Authenticator(settings.api_key.get_secret_value() if settings.api_key else None)
    # A bad ICE server URL, or an aiortc the jitter buffer was not read against, fails here, at
    # start-up, not per call.
    ice_servers(settings, user="start")
    check_jitter_buffer(settings)
    if settings.ice_username is not None:
        logger.warning(
            "static TURN credentials go to every client that may place a call (GET /v1/realtime/ice_servers), "
            "and stay valid after it: anyone who had them can relay through the TURN server; --ice-auth-secret "
            "mints credentials per call instead (docs/DEPLOY.md)"
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if engine is None:
                serving, model = await _start_engine(settings)
                stack.push_async_callback(serving.close)
            else:
                check_text_judge(settings, engine.capabilities)
                serving, model = engine, engine.name
            vad = await asyncio.to_thread(SileroVad.load)
            end_of_turn = await asyncio.to_thread(load_end_of_turn_model, settings)
            dev_replies = await asyncio.to_thread(load_dev_replies, dev_replies_file(settings))
            # Read as the server starts: the media workers get these same variables.
            tracing_environment = TracingEnvironment.of(os.environ)
            tracing = Tracing.start(tracing_environment, process="front")
            if tracing is not None:  # registered before the calls: their sessions' spans end first
                stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
            recordings = Recordings.of(settings)
            if recordings is not None:  # registered before the calls: their sessions' recordings finish first
                stack.push_async_callback(asyncio.to_thread, recordings.close)
            calls = CallRegistry(
                settings.max_sessions,
                max_connecting_per_client=settings.max_connecting_per_client,
                max_sessions_per_client=settings.max_sessions_per_client,
                on_count=metrics.set_open_sessions,
                on_closed=lambda call, reason: metrics.calls.labels(transport=call.transport, reason=reason).inc(),
            )
            # Registered after the engine, so it runs before: calls (and their engine turns) end first.
            stack.push_async_callback(calls.close_all)
            # Sessions get the engine with stalled turns failed (not hung) and timings recorded.
            for_sessions = MeteredEngine(StallTimeoutEngine(serving, stall_timeout_s=settings.turn_stall_timeout_s), metrics)
            workers = None
            if settings.media_workers > 1:
                workers = MediaWorkerPool(settings, settings.media_workers, for_sessions, calls,
                                          tracing=tracing_environment)
                stack.push_async_callback(workers.close)  # their calls end, then the engine
                await workers.start()
                metrics.pacing_snapshots = dict  # none here: each worker's metrics carry its own pacing
            if settings.loop_watchdog_s > 0:
                watchdog = LoopWatchdog(settings.loop_watchdog_s)
                watchdog.start()
                stack.push_async_callback(watchdog.close)  # stopped first: a long shutdown is not a stuck loop
            app.state.runtime = Runtime(
                engine=serving, for_sessions=for_sessions, model=model, vad=vad, calls=calls,
                end_of_turn=end_of_turn, workers=workers, dev_replies=dev_replies, tracing=tracing,
                recordings=recordings, client_shares=ClientShares(settings.engine_share_size.for_client(),
                                                                             settings.event_rate.for_client()),
            )
            scheme = "https" if settings.tls or settings.ssl_certfile else "http"
            logger.info("serving %s on %s://%s:%d", model, scheme, settings.host, settings.port)
            try:
                yield
            finally:
                del app.state.runtime

    app = FastAPI(title="omni-rtc", lifespan=lifespan)
    base_config = _base_session_config(settings)

    async def resolve_session(partial: dict[str, Any] | None) -> dict[str, Any]:
        """The effective session a client secret's call will start with (``ValueError`` when wrong,
        or when it asks what the engine cannot do)."""
        runtime = serving_runtime(app.state)
        try:
            config = SessionConfig.from_session(partial or {}, base=base_config)
            await check_session(config, since=base_config, param=session_param(partial or {}))
            if runtime is not None:
                capabilities = runtime.for_sessions.capabilities
                check_tool_choice(config.tool_choice, capabilities, "session.tool_choice")
                config = fitted(config, capabilities)
        except ProtocolError as exc:
            raise ValueError(exc.message) from None
        model = runtime.for_sessions.name if runtime is not None else "unknown"
        return config.to_session_object(session_id="", model=model, expires_at=0).model_dump(mode="json")

    install_auth(app, authenticator, resolve_session, max_body_bytes=settings.max_event_bytes)
    app.include_router(signaling_router(settings, authenticator, metrics, base_config))
    app.include_router(websocket_router(settings, authenticator, metrics, base_config))
    app.include_router(ice_servers_router(settings, authenticator))
    app.include_router(debug_router(settings, authenticator))
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
    # Outermost: a request for a host this server does not answer is refused before anything else.
    app.add_middleware(EdgeMiddleware, settings=settings)

    def monitoring_details(request: Request) -> bool:
        """/metrics and /healthz's details: for the API key when one is set (or --metrics-public)."""
        return settings.metrics_public or not authenticator.enabled or authenticator.has_api_key(request)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        runtime = serving_runtime(request.app.state)
        if runtime is None:
            return JSONResponse({"status": "starting", "sessions": 0}, status_code=503)
        health = runtime.engine.health()
        alive = health.alive
        engine: dict[str, Any] = {"alive": alive, "restarts": health.restarts, "queue_depth": health.queue_depth}
        # An engine pool describes each engine process (device, pid, running turns...).
        if health.members:
            engine["engines"] = list(health.members)
        # "overloaded": the worker falls behind pacing its calls' audio (media/pacing.py); "ready":
        # it answers its heartbeat and takes new calls (app/serving/media_workers.py).
        workers = runtime.workers.status() if runtime.workers is not None else [_this_worker(runtime)]
        placing = any(worker["ready"] for worker in workers)
        # Some engine of a pool restarting, or some worker not answering: degraded, but still
        # serving (200) while one engine is alive and one worker takes calls.
        healthy = alive and health.every_member_alive and all(worker["ready"] for worker in workers)
        status_code = 200 if alive and placing else 503
        if not monitoring_details(request):  # a load balancer's check needs the status only
            return JSONResponse({"status": "ok" if healthy else "degraded"}, status_code=status_code)
        return JSONResponse(
            {
                "status": "ok" if healthy else "degraded",
                "model": runtime.model,
                "sessions": len(runtime.calls),
                "max_sessions": settings.max_sessions,
                "workers": workers,
                "engine": engine,
            },
            status_code=status_code,
        )

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        if not monitoring_details(request):
            raise ApiError(
                401, "/metrics needs the API key (or the server's --metrics-public).", type="authentication_error",
                code="missing_credentials", headers={"WWW-Authenticate": "Bearer"},
            )
        runtime = serving_runtime(request.app.state)
        workers = runtime.workers if runtime is not None else None
        return Response(
            metrics.render(workers.metric_samples() if workers is not None else None), media_type=METRICS_CONTENT_TYPE
        )

    def _this_worker(runtime: Runtime) -> dict[str, Any]:
        """This process as the one media worker."""
        pacing = metrics.pacing.snapshot()
        return {
            "worker": "0", "pid": os.getpid(), "alive": True, "ready": True, "sessions": len(runtime.calls),
            "restarts": 0,
            "overloaded": pacing["overloaded"], "late_frames": pacing["late_frames"],
            "skipped_frames": pacing["skipped_frames"],
        }

    # The page and its files (index.html names js/main.js and style.css relatively), after every
    # route above so that none of them is shadowed.
    app.mount("/", StaticFiles(directory=STATIC_DIR, html=True, check_dir=False), name="static")
    return app


def _base_session_config(settings: Settings) -> SessionConfig:
    """What every session starts from: the server-side limits of the settings."""
    return SessionConfig(
        turn_detection=TurnDetection(interrupt_response=settings.default_interrupt_response,
                                     speculative_response=settings.speculative_responses),
        default_interrupt_response=settings.default_interrupt_response,
        speculative_responses=settings.speculative_responses,
        partial_transcripts=settings.partial_transcripts,
        noise_reduction=None if settings.noise_reduction == "off" else settings.noise_reduction,
        echo_cancellation=settings.echo_cancellation,
        history=HistoryLimits(max_prompt_tokens=settings.history_max_tokens),
        max_text_chars=settings.max_text_chars,
        max_instructions_tokens=settings.instructions_max_tokens,
        max_event_bytes=settings.max_event_bytes,
        max_events_per_second=settings.max_events_per_second,
        max_event_burst=settings.max_event_burst,
        max_image_bytes=settings.max_image_bytes,
        record_sessions=settings.record_dir is not None,
    )


async def _start_engine(settings: Settings) -> tuple[Engine, str]:
    """The settings' engine, started, and the model it serves."""
    engine, model = await _new_engine(settings)
    check_text_judge(settings, engine.capabilities)  # before a model loads for a server that could not run
    await engine.start()
    return engine, model or engine.name


async def _new_engine(settings: Settings) -> tuple[Engine, str | None]:
    """The settings' engine, not started, and the model it serves (None: the engine's name once
    started, a vLLM-Omni server's served model)."""
    engine = settings.engine
    if isinstance(engine, VllmOmniServers):
        from pipeline.vllm_omni.vllm_omni_engine import VllmOmniEnginePool

        remote = VllmOmniEnginePool(
            list(engine.urls),
            api_key=engine.api_key.get_secret_value() if engine.api_key else None,
            model=settings.model,
            seed=settings.seed,
            max_prompt_tokens=settings.max_prompt_tokens,
        )
        return remote, None
    # Imported here: the engine pulls in torch and transformers, which the CLI's other
    # commands and the client never need.
    from pipeline.local.devmodel import ensure_dev_model
    from pipeline.local.transformers_engine import TransformersEnginePool

    if settings.model is None:
        model_dir = await asyncio.to_thread(ensure_dev_model, settings.cache_dir)
        model = str(model_dir)
        logger.info("no model given: using the dev model at %s", model_dir)
    else:
        model = settings.model
    local = TransformersEnginePool(
        model,
        devices=list(engine.devices),
        max_batch=engine.max_batch,
        dtype=engine.dtype,
        seed=settings.seed,
        generation=engine.generation,
        threads=engine.threads,
        attn_implementation=engine.attn_implementation,
        max_prompt_tokens=settings.max_prompt_tokens,
    )
    return local, model
