"""Signaling: ``POST /v1/realtime/calls`` (an SDP offer in, an SDP answer out) and hang-up.

The offer is read with a size bound and checked before aiortc sees it, so every malformed
offer is a 400 or 413 with a message, never a 500. A call past ``--max-sessions`` is a 429
with ``Retry-After``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from aiortc import sdp as aiortc_sdp
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from app.calls.registry import Admission, CapacityError, ClientLimitError, ConnectingLimitError, OnClosed
from app.config import Settings
from app.http.auth import Authenticator, CallGrant
from app.http.bodies import read_bounded_body
from app.http.call_refusals import call_refused
from app.http.edge import OriginPolicy, TrustedProxies
from app.http.errors import ApiError, logged_error
from app.http.session_start import admission_of, read_session_config, runtime_of
from app.metrics import Metrics
from app.realtime.session_config import SessionConfig
from app.serving.call_factory import new_call, session_factory
from app.serving.media_workers import MediaWorkerPool, WorkerUnavailable
from app.transports.webrtc.peer_call import Call, OfferError, new_call_id

logger = logging.getLogger(__name__)

SDP_CONTENT_TYPE = "application/sdp"
MULTIPART_CONTENT_TYPE = "multipart/form-data"
# A multipart offer's boundaries and part headers (Content-Disposition, Content-Type): ~300 bytes
# for the two parts browsers and OpenAI's SDKs send; 4 KiB leaves room for longer boundaries.
MULTIPART_FRAMING_BYTES = 4_096
# Remote ICE candidates in one m= section. Browsers offer a host candidate per interface and
# family, a server-reflexive and a relay candidate: 2-12 (OpenAI's clients usually none). The
# server checks every one (a STUN request each, retried): an offer naming 500 addresses made it
# send 3,000 packets to them.
MAX_OFFER_CANDIDATES = 32


def signaling_router(
    settings: Settings, authenticator: Authenticator, metrics: Metrics, base_config: SessionConfig
) -> APIRouter:
    """The calls routes; the runtime (engine, VAD, calls) is read per request from the app."""
    router = APIRouter()
    origins = OriginPolicy(settings)
    proxies = TrustedProxies(settings.trusted_proxies)

    @router.post("/v1/realtime/calls", status_code=201)
    async def create_call(request: Request, grant: CallGrant = Depends(authenticator.authorize_call)) -> Response:
        runtime = runtime_of(request)
        _check_cross_site(request, grant, origins)
        offer, session = await _read_offer(request, settings)
        config = await read_session_config({**(grant.session or {}), **(session or {})}, base_config)
        admission = admission_of(request, grant, proxies, connects=True)
        if runtime.workers is not None:
            return await _place_on_worker(runtime.workers, offer, config, settings, metrics, admission)

        make_session = session_factory(
            settings, metrics, config, session_engine=runtime.session_engine, shared_engine=runtime.for_sessions,
            vad=runtime.vad, end_of_turn=runtime.end_of_turn, tracing=runtime.tracing, timelines=runtime.timelines,
            recordings=runtime.recordings, transport=Call.transport, client_shares=runtime.client_shares,
            client=admission.client_key if admission is not None else None,
        )

        def make_call(on_closed: OnClosed) -> Call:
            return new_call(settings, make_session, metrics, on_closed, on_connected=lambda c: runtime.calls.connected(c.id))

        try:
            call = runtime.calls.admit(make_call, admission=admission)
        except (CapacityError, ClientLimitError, ConnectingLimitError) as exc:
            raise call_refused(exc, settings, metrics) from None
        try:
            answer = await call.answer(offer)
        except OfferError as exc:
            await call.close("bad_offer")
            raise call_refused(exc, settings, metrics, call_id=call.id) from None
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

    @router.delete("/v1/realtime/calls/{call_id}", status_code=204)
    @router.post("/v1/realtime/calls/{call_id}/hangup", status_code=204)  # OpenAI's name for it
    async def hang_up(call_id: str, request: Request) -> Response:
        await authenticator.require_api_key(request)
        runtime = runtime_of(request)
        if runtime.workers is not None:
            try:
                found = await runtime.workers.hang_up(call_id)
            except WorkerUnavailable:
                found = False  # the worker died: the call is gone with it
        else:
            call = runtime.calls.get(call_id)
            # OpenAI's hang-up ends a WebRTC call; a WebSocket session ends with its socket.
            found = call is not None and call.transport == Call.transport
            if call is not None and found:
                await call.close("hangup")
        if not found:
            raise ApiError(404, f"No open call {call_id!r}.", code="call_not_found", param="call_id")
        return Response(status_code=204)

    return router


async def _place_on_worker(
    workers: MediaWorkerPool, offer: str, config: SessionConfig, settings: Settings, metrics: Metrics,
    admission: Admission | None,
) -> Response:
    """The call goes to the least loaded media worker, which answers; the pool registers it (--max-sessions)."""
    call_id = new_call_id()
    try:
        answer = await workers.place_call(call_id, offer, config, admission=admission)
    except (CapacityError, ClientLimitError, ConnectingLimitError, OfferError) as exc:
        raise call_refused(exc, settings, metrics, call_id=call_id) from None
    except WorkerUnavailable as exc:
        metrics.errors.labels(type="server_error", code="media_worker_unavailable").inc()
        raise logged_error(503, "No media worker could take the call; try again shortly.",
                           code="media_worker_unavailable", cause=f"call {call_id}: {exc}") from None
    logger.info("call %s: answered by media worker %s", call_id, workers.worker_of(call_id))
    return Response(
        answer, status_code=201, media_type=SDP_CONTENT_TYPE, headers={"Location": f"/v1/realtime/calls/{call_id}"}
    )


def _check_cross_site(request: Request, grant: CallGrant, origins: OriginPolicy) -> None:
    """Refuses offers another site's page could post to a keyless server.

    A browser posts ``application/sdp`` across origins only after a CORS preflight, which the
    server answers for ``--cors-origin`` alone. ``text/plain``, no content type and
    ``multipart/form-data`` are "simple" requests that any page may send without asking: the
    first two are refused (OpenAI takes ``application/sdp`` too), multipart only from an allowed
    ``Origin``. With a key the request carries a credential no other site has.
    """
    content_type = _content_type(request)
    if content_type not in (SDP_CONTENT_TYPE, MULTIPART_CONTENT_TYPE):
        shown = content_type or "no Content-Type"
        raise ApiError(
            415,
            f"Send the offer as {SDP_CONTENT_TYPE} (or multipart/form-data with 'sdp' and 'session'), not {shown}.",
            code="unsupported_media_type",
        )
    if content_type == MULTIPART_CONTENT_TYPE and grant.via == "open":
        if not origins.allows(request.headers.get("origin"), request.headers.get("host")):
            raise ApiError(
                403, "This origin may not place calls here; the server allows it with --cors-origin.",
                code="origin_not_allowed",
            )


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def _read_offer(request: Request, settings: Settings) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the optional session config, from a raw or a multipart body."""
    if _content_type(request) == MULTIPART_CONTENT_TYPE:
        return await _read_multipart_offer(request, settings)
    body = await read_bounded_body(request, max_bytes=settings.max_sdp_bytes, too_large=_sdp_too_large)
    return check_offer_sdp(body, max_bytes=settings.max_sdp_bytes), None


def multipart_offer_limit(settings: Settings) -> int:
    """The most a multipart offer's body may hold: its SDP, its session (as large as a client
    event may be) and the form's framing (boundaries and part headers: a few hundred bytes)."""
    return settings.max_sdp_bytes + settings.max_event_bytes + MULTIPART_FRAMING_BYTES


async def _read_multipart_offer(request: Request, settings: Settings) -> tuple[str, dict[str, Any] | None]:
    """A multipart offer's ``sdp`` and ``session``, read with the same bound as a raw SDP body: a
    body over :func:`multipart_offer_limit` is refused as the stream passes it (or from its
    Content-Length), never read whole (Starlette's ``request.form()`` would spool all of it)."""
    limit = multipart_offer_limit(settings)
    body = await read_bounded_body(request, max_bytes=limit, too_large=_offer_too_large)

    async def once() -> AsyncGenerator[bytes, None]:
        yield body

    parser = MultiPartParser(request.headers, once(), max_files=2, max_fields=2, max_part_size=limit)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        logger.info("a multipart offer could not be read: %s", exc.message)
        raise ApiError(400, "The multipart offer could not be read.", code="invalid_multipart") from None
    try:
        sdp_field = form.get("sdp")
        if sdp_field is None:
            raise ApiError(400, "The multipart offer has no 'sdp' field.", code="invalid_sdp", param="sdp")
        sdp_bytes = await sdp_field.read() if isinstance(sdp_field, UploadFile) else sdp_field.encode()
        session_field = form.get("session")
        session = None
        if session_field is not None:
            raw = await session_field.read() if isinstance(session_field, UploadFile) else session_field.encode()
            session = _parse_session_json(raw)
    finally:
        await form.close()
    return check_offer_sdp(sdp_bytes, max_bytes=settings.max_sdp_bytes), session


def _parse_session_json(raw: bytes) -> dict[str, Any]:
    try:
        session = json.loads(raw)
    except UnicodeDecodeError:
        raise ApiError(400, "The 'session' field is not UTF-8 text.", param="session") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"The 'session' field is not JSON (line {exc.lineno}, column {exc.colno}).",
                       param="session") from None
    if not isinstance(session, dict):
        raise ApiError(400, "The 'session' field must be a JSON object.", param="session")
    return session


def _offer_too_large(size: str, max_bytes: int) -> ApiError:
    return ApiError(
        413, f"The multipart offer is {size}; the limit is {max_bytes} (its SDP and session).", code="offer_too_large"
    )


def _sdp_too_large(size: str, max_bytes: int) -> ApiError:
    return ApiError(
        413, f"SDP offer is {size}; the limit is {max_bytes} (browser offers are 3-8 KB).", code="sdp_too_large"
    )


def check_offer_sdp(body: bytes, *, max_bytes: int) -> str:
    """The offer as text, or :class:`ApiError` 413 (too big) / 400 (not an SDP offer we can read)."""
    if len(body) > max_bytes:
        raise _sdp_too_large(f"{len(body)} bytes", max_bytes)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "SDP offer is not UTF-8 text.", code="invalid_sdp") from None
    if not text.lstrip().startswith("v=0"):
        raise ApiError(400, "SDP offer must start with 'v=0' (RFC 8866).", code="invalid_sdp")
    try:
        description = aiortc_sdp.SessionDescription.parse(text)
    # aiortc's parser signals malformed lines with whatever its unpacking hits (ValueError,
    # AssertionError, IndexError, KeyError, StopIteration for an a=fmtp without its a=rtpmap...);
    # on untrusted input every one of them means the same: the offer is malformed.
    except Exception as exc:
        raise logged_error(400, "SDP offer could not be parsed.", code="invalid_sdp", type="invalid_request_error",
                           cause=f"aiortc's parser: {type(exc).__name__}: {exc}") from None
    if not description.media:
        raise ApiError(400, "SDP offer has no media sections (m= lines).", code="invalid_sdp")
    for index, media in enumerate(description.media):
        section = f"m={media.kind} section #{index + 1}"
        if len(media.ice_candidates) > MAX_OFFER_CANDIDATES:
            raise ApiError(
                400, f"SDP offer's {section} has {len(media.ice_candidates)} ICE candidates; the limit is "
                f"{MAX_OFFER_CANDIDATES}.", code="too_many_candidates",
            )
        # aiortc dereferences these without checking; WebRTC offers always carry them (RFC 8829).
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            raise ApiError(400, f"SDP offer's {section} has no a=ice-ufrag / a=ice-pwd.", code="invalid_sdp")
        if media.dtls is None or not media.dtls.fingerprints:
            raise ApiError(
                400, f"SDP offer's {section} has no a=fingerprint and a=setup (DTLS).", code="invalid_sdp"
            )
        # RFC 8866 makes sendrecv the default, but aiortc's answer needs the attribute spelled out.
        if media.kind != "application" and media.direction is None:
            raise ApiError(
                400, f"SDP offer's {section} has no direction (a=sendrecv, a=recvonly...).", code="invalid_sdp"
            )
    # RFC 8843: a BUNDLE group names m= sections by their mid. aiortc trusts it and would bundle
    # the other sections onto the transport of a missing one (None), failing later with a 500.
    mids = {media.rtp.muxId for media in description.media}
    for group in description.group:
        missing = [str(mid) for mid in group.items if str(mid) not in mids]
        if missing:
            raise ApiError(
                400,
                f"SDP offer's a=group:{group.semantic} names mid {', '.join(missing)}, which no m= section has.",
                code="invalid_sdp",
            )
    return text
