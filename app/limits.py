"""Limits on what one client may ask of the server, each answered with a clear error.

Signaling limits raise :class:`app.auth.ApiError` (an HTTP status and OpenAI's error body);
data-channel limits return a :class:`Rejection` that the session answers with an ``error``
event, and the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiortc import sdp as aiortc_sdp
from fastapi import Request

from app.auth import ApiError
from pipeline.turn import Engine, EngineError, TurnEvent, TurnRequest

# How long a client turned away for capacity should wait: about one short voice turn.
CAPACITY_RETRY_AFTER_S = 30


async def read_offer_body(request: Request, *, max_bytes: int) -> bytes:
    """The request body, or :class:`ApiError` 413 as soon as it is known to pass ``max_bytes``.

    Never holds more than ``max_bytes`` plus one chunk: a client cannot make the server read a
    gigabyte to learn that it is too big.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _sdp_too_large(f"{int(declared)} bytes", max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise _sdp_too_large(f"over {max_bytes} bytes", max_bytes)
    return bytes(body)


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
        raise ApiError(400, f"SDP offer could not be parsed: {exc or type(exc).__name__}", code="invalid_sdp") from None
    if not description.media:
        raise ApiError(400, "SDP offer has no media sections (m= lines).", code="invalid_sdp")
    for index, media in enumerate(description.media):
        section = f"m={media.kind} section #{index + 1}"
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


def capacity_error(max_sessions: int) -> ApiError:
    return ApiError(
        429,
        f"The server is serving its maximum of {max_sessions} sessions; try again shortly.",
        type="rate_limit_error",
        code="too_many_sessions",
        headers={"Retry-After": str(CAPACITY_RETRY_AFTER_S)},
    )


@dataclass(frozen=True)
class Rejection:
    """Why one client event was refused; the session answers with an ``error`` event."""

    code: str
    message: str


class EventGate:
    """Admits client events by size and by rate (a token bucket), before they are parsed."""

    def __init__(
        self,
        *,
        max_bytes: int,
        per_second: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_bytes = max_bytes
        self._per_second = per_second
        self._burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._refilled_at = clock()

    def admit(self, raw: str | bytes) -> Rejection | None:
        size = len(raw.encode() if isinstance(raw, str) else raw)
        if size > self._max_bytes:
            return Rejection(
                "event_too_large", f"Event is {size} bytes; the limit is {self._max_bytes}."
            )
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled_at) * self._per_second)
        self._refilled_at = now
        if self._tokens < 1:
            return Rejection(
                "rate_limit_exceeded",
                f"More than {self._per_second:g} events per second (bursts of {self._burst}); "
                "this event was dropped.",
            )
        self._tokens -= 1
        return None


class StallTimeoutEngine:
    """An engine whose turns fail instead of hanging.

    A turn that yields nothing for ``stall_timeout_s`` (queue wait included) is cancelled in
    the wrapped engine and raises :class:`EngineError` with code ``engine_timeout``; the
    session ends that response ``failed`` and serves the next turn. Everything else
    (``alive``, ``restarts``, ``queue_depth``...) is the wrapped engine's.
    """

    def __init__(self, engine: Engine, *, stall_timeout_s: float) -> None:
        self._engine = engine
        self._stall_timeout_s = stall_timeout_s
        self.name = engine.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def start(self) -> None:
        await self._engine.start()

    async def close(self) -> None:
        await self._engine.close()

    async def run_turn(self, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        turn = self._engine.run_turn(request)
        async with contextlib.aclosing(turn):  # type: ignore[type-var]
            while True:
                try:
                    async with asyncio.timeout(self._stall_timeout_s):
                        event = await anext(turn)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise EngineError(
                        f"The engine produced nothing for {self._stall_timeout_s:g} s; the response was cancelled.",
                        code="engine_timeout",
                    ) from None
                yield event
