"""Slow clients at the edge: a connection that does not send a request's headers in time is closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from app.http.header_deadline import header_deadline_protocol

DEADLINE_S = 0.5
# Generous: the deadline plus a loaded machine's scheduling; hitting it means never closed.
CLOSED_WITHIN_S = 10.0


def hello_app() -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> PlainTextResponse:
        return PlainTextResponse("hi")

    return app


@contextlib.asynccontextmanager
async def serving(**config) -> AsyncIterator[int]:
    server = uvicorn.Server(uvicorn.Config(hello_app(), host="127.0.0.1", port=0, log_level="warning",
                                           http=header_deadline_protocol(DEADLINE_S), **config))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closes the connection (EOF) before ``CLOSED_WITHIN_S``."""
    try:
        async with asyncio.timeout(CLOSED_WITHIN_S):
            return await reader.read() == b""
    except TimeoutError:
        return False


async def test_connections_that_never_finish_their_headers_are_closed():
    async with serving() as port:
        streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        for _, writer in streams:
            writer.write(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never ends
            await writer.drain()
        closed = await asyncio.gather(*(closed_by_server(reader) for reader, _ in streams))
        assert all(closed)
        for _, writer in streams:
            writer.close()


async def test_a_keep_alive_connection_gets_the_deadline_again_for_its_next_request():
    async with serving(timeout_keep_alive=60) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        response = await reader.readuntil(b"hi")
        assert response.startswith(b"HTTP/1.1 200")
        writer.write(b"GET /hello HTTP/1.1\r\nHost: 1")  # the next request's headers, half of them
        await writer.drain()
        assert await closed_by_server(reader)
        writer.close()


@pytest.mark.parametrize("pieces", [1, 3])
async def test_headers_sent_within_the_deadline_are_served(pieces):
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        size = -(-len(request) // pieces)
        for start in range(0, len(request), size):
            writer.write(request[start : start + size])
            await writer.drain()
            await asyncio.sleep(DEADLINE_S / (2 * pieces))
        response = await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)
        assert response.startswith(b"HTTP/1.1 200") and response.endswith(b"hi")
        writer.close()


async def test_open_connections_past_the_limit_are_answered_503():
    async with serving(limit_concurrency=4) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), CLOSED_WITHIN_S)
        assert response.startswith(b"HTTP/1.1 503")
        for _, held_writer in held:
            held_writer.close()
        writer.close()
