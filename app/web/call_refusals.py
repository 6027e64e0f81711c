"""What a client is told when the server will not take its call or session: too many sessions,
too many calls still connecting, an offer that cannot be answered."""

from __future__ import annotations

import math

from app.config import Settings
from app.web.errors import ApiError, logged_error, rate_limited
from app.webrtc.call import OfferError

# How long a client turned away for capacity should wait: about one short voice turn.
CAPACITY_RETRY_AFTER_S = 30


def offer_refused(exc: OfferError, call_id: str) -> ApiError:
    """400 with the refusal's own fixed words; aiortc's, if any, go to the log under the request id."""
    return logged_error(400, str(exc), code="invalid_sdp", type="invalid_request_error",
                        cause=f"call {call_id}: {exc} ({exc.__cause__ or 'no further cause'})")


def connecting_limit_error(settings: Settings) -> ApiError:
    return rate_limited(
        f"This client already has {settings.max_connecting_per_client} calls still connecting; "
        "connect or end one first.",
        code="too_many_connecting_calls",
        retry_after_s=math.ceil(settings.connect_timeout_s),
    )


def capacity_error(max_sessions: int) -> ApiError:
    return rate_limited(
        f"The server is serving its maximum of {max_sessions} sessions; try again shortly.",
        code="too_many_sessions",
        retry_after_s=CAPACITY_RETRY_AFTER_S,
    )
