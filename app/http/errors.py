"""HTTP errors answered with OpenAI's JSON error body: ``{"error": {type, code, message, param}}``.

Messages are fixed (or name only what the client sent); a cause the client must not see
(exception text, a library's parser message, another process's state) goes to the log under a
request id that the answer carries in ``x-request-id``, as OpenAI's API answers carry theirs.
"""

from __future__ import annotations

import logging
import secrets

from fastapi import Request
from fastapi.responses import JSONResponse

logger = logging.getLogger(__name__)
REQUEST_ID_HEADER = "x-request-id"


class ApiError(Exception):
    """An HTTP error answered with OpenAI's JSON error body: ``{"error": {...}}``."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def to_response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}
        return JSONResponse(body, status_code=self.status_code, headers=self.headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.to_response()


def logged_error(
    status_code: int, message: str, *, code: str, cause: BaseException | str, type: str = "server_error"
) -> ApiError:
    """An :class:`ApiError` whose ``cause`` is logged under a new request id, which the answer carries."""
    request_id = "req_" + secrets.token_hex(12)
    logger.warning("request %s: %d %s: %s", request_id, status_code, code, cause)
    return ApiError(status_code, message, type=type, code=code, headers={REQUEST_ID_HEADER: request_id})


async def unexpected_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """A bug of ours (any exception no route turned into an answer): 500, the cause in the log."""
    request_id = "req_" + secrets.token_hex(12)
    logger.error("request %s: %s %s failed", request_id, request.method, request.url.path, exc_info=exc)
    error = ApiError(500, "The server failed on this request.", type="server_error", code="server_error",
                     headers={REQUEST_ID_HEADER: request_id})
    return error.to_response()


def rate_limited(message: str, *, code: str, retry_after_s: int) -> ApiError:
    """A 429 with ``Retry-After``: the one shape every "too many" answer takes."""
    return ApiError(
        429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(retry_after_s)}
    )
