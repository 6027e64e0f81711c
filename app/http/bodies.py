"""Request bodies read with a bound: a client cannot make the server hold more than it allows."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request

from app.http.errors import ApiError


async def read_bounded_body(request: Request, *, max_bytes: int, too_large: Callable[[str, int], ApiError]) -> bytes:
    """The request body, or ``too_large(size, max_bytes)`` raised as soon as it is known to pass
    ``max_bytes`` (from ``Content-Length``, or while reading). Never holds more than ``max_bytes``
    plus one chunk: a client cannot make the server read a gigabyte to learn that it is too big."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large(f"{int(declared)} bytes", max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise too_large(f"over {max_bytes} bytes", max_bytes)
    return bytes(body)
