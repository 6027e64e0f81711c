"""API-key auth for signaling, and the short-lived client secrets (``ek_…``) minted with it.

With no API key configured every route is open (a loopback development server). With one,
``POST /v1/realtime/calls`` takes ``Authorization: Bearer <api key or client secret>`` and
``POST /v1/realtime/client_secrets`` takes the API key. A client secret is what a server hands
to a browser so the browser never sees the API key: it expires within ten minutes, opens one
call, and may carry a session config that the call starts with (OpenAI's GA shape).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.http.bodies import read_bounded_body
from app.http.errors import ApiError, api_error_handler, rate_limited, unexpected_error_handler

logger = logging.getLogger(__name__)

CLIENT_SECRET_PREFIX = "ek_"
# OpenAI allows 10 s .. 2 h; a page needs its secret only for the one offer it posts next.
MIN_CLIENT_SECRET_SECONDS = 10
MAX_CLIENT_SECRET_SECONDS = 600
# Outstanding (unexpired, unused) secrets kept at most; past it minting answers 429.
MAX_OUTSTANDING_CLIENT_SECRETS = 10_000


@dataclass(frozen=True)
class ClientSecret:
    value: str
    expires_at: int  # unix seconds
    session: dict[str, Any] | None  # config the call it opens starts with


class ClientSecretStore:
    """Minted, not yet used client secrets; each redeems once, before it expires."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        capacity: int = MAX_OUTSTANDING_CLIENT_SECRETS,
    ) -> None:
        self._clock = clock
        self._capacity = capacity
        # Keyed by the secret's SHA-256, so a dict lookup's timing says nothing about the secret.
        self._by_digest: dict[bytes, ClientSecret] = {}
        self._fetched_ice: set[bytes] = set()  # secrets whose one ICE servers fetch is spent

    def __len__(self) -> int:
        return len(self._by_digest)

    def mint(self, *, seconds: int, session: dict[str, Any] | None = None) -> ClientSecret:
        if not MIN_CLIENT_SECRET_SECONDS <= seconds <= MAX_CLIENT_SECRET_SECONDS:
            raise ValueError(
                f"seconds must be between {MIN_CLIENT_SECRET_SECONDS} and {MAX_CLIENT_SECRET_SECONDS}"
            )
        self._drop_expired()
        if len(self._by_digest) >= self._capacity:
            raise rate_limited(
                f"{self._capacity} client secrets are outstanding; use or let some expire first",
                code="too_many_client_secrets",
                retry_after_s=MAX_CLIENT_SECRET_SECONDS,
            )
        value = CLIENT_SECRET_PREFIX + secrets.token_urlsafe(32)
        secret = ClientSecret(value=value, expires_at=int(self._clock()) + seconds, session=session)
        self._by_digest[_digest(value)] = secret
        return secret

    def redeem(self, value: str) -> ClientSecret | None:
        """The secret, removed so it cannot be used again; None when unknown or expired."""
        digest = _digest(value)
        secret = self._by_digest.pop(digest, None)
        self._fetched_ice.discard(digest)
        if secret is None or secret.expires_at <= self._clock():
            return None
        return secret

    def fetch_ice(self, value: str) -> bool:
        """Whether the secret would redeem now and has not fetched its ICE servers yet (then it
        has): one fetch of TURN credentials per secret, as it opens one call. It stays unused."""
        digest = _digest(value)
        secret = self._by_digest.get(digest)
        if secret is None or secret.expires_at <= self._clock() or digest in self._fetched_ice:
            return False
        self._fetched_ice.add(digest)
        return True

    def _drop_expired(self) -> None:
        now = self._clock()
        for digest in [d for d, s in self._by_digest.items() if s.expires_at <= now]:
            del self._by_digest[digest]
            self._fetched_ice.discard(digest)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


@dataclass(frozen=True)
class CallGrant:
    """Who may open a call, and the session config bound to the credential (if any)."""

    via: Literal["open", "api_key", "client_secret"]
    session: dict[str, Any] | None = None


class Authenticator:
    """FastAPI dependencies for the signaling routes.

    ``Depends(authenticator.authorize_call)`` on ``POST /v1/realtime/calls`` yields a
    :class:`CallGrant`; ``Depends(authenticator.require_api_key)`` guards minting.
    """

    def __init__(self, api_key: str | None, secrets: ClientSecretStore | None = None) -> None:
        self._api_key = api_key.encode() if api_key else None
        self.secrets = secrets if secrets is not None else ClientSecretStore()

    @property
    def enabled(self) -> bool:
        return self._api_key is not None

    async def require_api_key(self, request: Request) -> None:
        if self._api_key is None:
            return
        token = _bearer_token(request)
        if not hmac.compare_digest(token.encode(), self._api_key):
            raise _unauthorized("Incorrect API key provided.", code="invalid_api_key")

    def has_api_key(self, request: Request) -> bool:
        """Whether the request carries the API key (False when none is configured)."""
        token = bearer_token(request.headers.get("authorization", ""))
        return self._api_key is not None and token is not None and hmac.compare_digest(token.encode(), self._api_key)

    async def authorize_ice_servers(self, request: Request) -> str:
        """As for a call, but an ``ek_`` client secret is not used up (the page fetches its ICE
        servers with the secret it posts its offer with next); it fetches them once. Returns whose
        TURN credentials they are (coturn's user, bounded by its ``user-quota``): the secret's
        (a digest of it: coturn logs its users), or one of their own for the API key and an open
        server, trusted callers that may fetch as often as they place calls."""
        if self._api_key is None:
            return "open-" + secrets.token_hex(6)
        token = _bearer_token(request)
        if hmac.compare_digest(token.encode(), self._api_key):
            return "key-" + secrets.token_hex(6)
        if token.startswith(CLIENT_SECRET_PREFIX) and self.secrets.fetch_ice(token):
            return "ek-" + _digest(token).hex()[:16]
        raise _unauthorized(
            "Incorrect API key or client secret provided, or the client secret has fetched its ICE servers already "
            "(once per secret: mint one per call).",
            code="invalid_api_key",
        )

    async def authorize_call(self, request: Request) -> CallGrant:
        if self._api_key is None:
            return CallGrant(via="open")
        return self.authorize_token(_bearer_token(request))

    def authorize_token(self, token: str) -> CallGrant:
        """The grant of a bearer token (the API key or an ``ek_`` client secret, which is used up);
        :class:`ApiError` 401 when it is neither."""
        if self._api_key is None:
            return CallGrant(via="open")
        if hmac.compare_digest(token.encode(), self._api_key):
            return CallGrant(via="api_key")
        if token.startswith(CLIENT_SECRET_PREFIX):
            secret = self.secrets.redeem(token)
            if secret is None:
                raise _unauthorized(
                    "The client secret is unknown, expired or already used; mint a new one.",
                    code="invalid_client_secret",
                )
            return CallGrant(via="client_secret", session=secret.session)
        raise _unauthorized("Incorrect API key provided.", code="invalid_api_key")


def _bearer_token(request: Request) -> str:
    token = bearer_token(request.headers.get("authorization", ""))
    if token is None:
        raise missing_credentials()
    return token


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value; None when it is not one."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def missing_credentials() -> ApiError:
    return _unauthorized(
        "Missing credentials: send 'Authorization: Bearer <API key or ek_ client secret>' (browsers opening a "
        "WebSocket: the subprotocol 'openai-insecure-api-key.<key>').",
        code="missing_credentials",
    )


def _unauthorized(message: str, *, code: str) -> ApiError:
    return ApiError(
        401, message, type="authentication_error", code=code, headers={"WWW-Authenticate": "Bearer"}
    )


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(MAX_CLIENT_SECRET_SECONDS, ge=MIN_CLIENT_SECRET_SECONDS, le=MAX_CLIENT_SECRET_SECONDS)


class ClientSecretRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # tolerant reader, like the session events

    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)
    session: dict[str, Any] | None = None


SessionResolver = Callable[[dict[str, Any] | None], Awaitable[dict[str, Any]]]
"""Validates a partial session config and returns the effective session object.

Raises ``ValueError`` (pydantic's ``ValidationError`` is one) for a config that is really wrong.
"""


def client_secrets_router(authenticator: Authenticator, resolve_session: SessionResolver, *,
                          max_body_bytes: int) -> APIRouter:
    """``POST /v1/realtime/client_secrets``; the call it enables starts with the bound session.
    Its body is a session's worth of JSON: at most ``max_body_bytes`` (a ``session.update``'s bound)."""
    router = APIRouter()

    @router.post("/v1/realtime/client_secrets")
    async def create_client_secret(request: Request) -> JSONResponse:
        await authenticator.require_api_key(request)
        if not authenticator.enabled:
            raise ApiError(
                400,
                "Client secrets need an API key on the server (OMNI_RTC_API_KEY or --api-key); "
                "without one, calls need no credentials.",
                code="auth_disabled",
            )
        try:
            raw = await read_bounded_body(request, max_bytes=max_body_bytes, too_large=_request_too_large)
            body = ClientSecretRequest.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            raise ApiError(400, _first_error(exc), param=_first_param(exc)) from None
        session = body.session
        try:
            effective = await resolve_session(session)
        except ValueError as exc:
            raise ApiError(400, f"Invalid session: {exc}", param="session") from None
        secret = authenticator.secrets.mint(seconds=body.expires_after.seconds, session=session)
        logger.info("minted a client secret expiring in %d s", body.expires_after.seconds)
        return JSONResponse(
            {"value": secret.value, "expires_at": secret.expires_at, "session": effective},
            status_code=200,
        )

    return router


def install_auth(app: FastAPI, authenticator: Authenticator, resolve_session: SessionResolver, *,
                 max_body_bytes: int) -> None:
    """Adds the client-secrets route and the JSON error handler for :class:`ApiError`."""
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)
    app.include_router(client_secrets_router(authenticator, resolve_session, max_body_bytes=max_body_bytes))


def _request_too_large(size: str, max_bytes: int) -> ApiError:
    return ApiError(413, f"The client secret request is {size}; the limit is {max_bytes}.",
                    code="request_too_large")


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


def _first_param(exc: ValidationError) -> str | None:
    loc = exc.errors()[0]["loc"]
    return ".".join(str(part) for part in loc) or None
