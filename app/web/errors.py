"""HTTP errors answered with OpenAI's JSON error body: ``{"error": {type, code, message, param}}``."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse


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


def rate_limited(message: str, *, code: str, retry_after_s: int) -> ApiError:
    """A 429 with ``Retry-After``: the one shape every "too many" answer takes."""
    return ApiError(
        429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(retry_after_s)}
    )
