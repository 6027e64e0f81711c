"""What a client is told when the server will not take its call or session, in one place for
both routes (``POST /v1/realtime/calls``, here or on a media worker, and ``GET /v1/realtime``):
too many sessions and too many calls still connecting are 429s with ``Retry-After``, an offer
that cannot be answered a 400. Each refusal is counted in ``omni_rtc_errors_total`` under its
answer's type and code."""

from __future__ import annotations

import math
from typing import TypeAlias

from app.calls.registry import CapacityError, ClientLimitError, ConnectingLimitError
from app.config import Settings
from app.http.errors import ApiError, logged_error, rate_limited
from app.metrics import Metrics
from app.transports.webrtc.peer_call import OfferError

# How long a client turned away for capacity should wait: about one short voice turn.
CAPACITY_RETRY_AFTER_S = 30

CallRefusal: TypeAlias = CapacityError | ClientLimitError | ConnectingLimitError | OfferError


def call_refused(error: CallRefusal, settings: Settings, metrics: Metrics, *, call_id: str | None = None) -> ApiError:
    """The answer to ``error``, counted. ``call_id``: the call whose offer was refused (its cause is logged under it)."""
    if isinstance(error, CapacityError):
        answer = capacity_error(settings.max_sessions)
    elif isinstance(error, ConnectingLimitError):
        answer = _connecting_limit_error(settings)
    elif isinstance(error, ClientLimitError):
        answer = _client_limit_error(settings)
    else:
        assert call_id is not None, "an offer is refused for a call that has an id"
        answer = _offer_refused(error, call_id)
    metrics.errors.labels(type=answer.type, code=answer.code).inc()
    return answer


def capacity_error(max_sessions: int) -> ApiError:
    return rate_limited(
        f"The server is serving its maximum of {max_sessions} sessions; try again shortly.",
        code="too_many_sessions",
        retry_after_s=CAPACITY_RETRY_AFTER_S,
    )


def _connecting_limit_error(settings: Settings) -> ApiError:
    return rate_limited(
        f"This client already has {settings.max_connecting_per_client} calls still connecting; "
        "connect or end one first.",
        code="too_many_connecting_calls",
        retry_after_s=math.ceil(settings.connect_timeout_s),
    )


def _client_limit_error(settings: Settings) -> ApiError:
    return rate_limited(
        f"This client already has {settings.max_sessions_per_client} sessions open; end one first.",
        code="too_many_sessions_for_client",
        retry_after_s=CAPACITY_RETRY_AFTER_S,
    )


def _offer_refused(exc: OfferError, call_id: str) -> ApiError:
    """400 with the refusal's own fixed words; aiortc's, if any, go to the log under the request id."""
    return logged_error(400, str(exc), code="invalid_sdp", type="invalid_request_error",
                        cause=f"call {call_id}: {exc} ({exc.__cause__ or 'no further cause'})")
