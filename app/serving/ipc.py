"""Messages between the front process and its media workers: length-prefixed pickles on a unix socket.

Pickle, because both ends are this server's own processes (spawned by it, connecting to a
socket in a directory only its user can open) and the messages carry the engine's own types
(``GenerationRequest``, ``AudioChunk`` with numpy arrays) both ways. A message is one of
``app.serving.worker_messages``' dataclasses; writing is synchronous (the socket is local and the reader always drains it), so a
message is never half-written by a cancelled task.

A connection whose other end stops reading (a stopped or wedged process) is aborted once
``MAX_UNREAD_BYTES`` wait in its write buffer, rather than growing without bound: its reader
then sees the end, as when the process dies, and the watchdog's rules follow.

The *sender* checks each message's size (:class:`MessageTooLarge`, before anything is written),
so that what one call puts in a message fails that call's turn, not the connection: a message
over the limit at the receiver means the other end is broken, and ends the connection.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct

from app.serving.worker_messages import Message

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
# A turn event is at most one audio chunk (up to 100 codec frames: 8 s of 24 kHz float32, 768 KB;
# a vLLM-Omni chunk ~2 s, 192 KB); an offer or answer SDP a few KB; a
# turn request carries the session's history, which is bounded below this (HistoryLimits.max_bytes).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Four of the largest messages; a worker's calls send ~200 KB a second of audio each way, so a
# reader that keeps up never holds a tenth of it.
MAX_UNREAD_BYTES = 4 * MAX_MESSAGE_BYTES


class MessageTooLarge(ValueError):
    """A message over ``MAX_MESSAGE_BYTES``, refused by its sender; nothing was written."""

    def __init__(self, message_type: type, size: int) -> None:
        super().__init__(f"an IPC {message_type.__name__} message of {size} bytes (limit {MAX_MESSAGE_BYTES})")
        self.message_type = message_type
        self.size = size


def post(writer: asyncio.StreamWriter, message: Message) -> None:
    """Queues one message on ``writer``; a closed connection drops it (its reader learns of the end).

    Raises :class:`MessageTooLarge`, writing nothing, for a message the receiver would refuse.
    """
    if writer.is_closing():
        return
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageTooLarge(type(message), len(data))
    writer.write(_HEADER.pack(len(data)) + data)
    unread = writer.transport.get_write_buffer_size()
    if unread > MAX_UNREAD_BYTES:
        logger.error("aborting an IPC connection: %d bytes wait unread (limit %d); the other end stopped reading",
                     unread, MAX_UNREAD_BYTES)
        writer.transport.abort()


async def receive(reader: asyncio.StreamReader) -> Message | None:
    """The next message, or None when the other process closed the connection (or died).
    Raises ``ValueError`` for what no end sends (too large, or not a message): the other end is broken."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"an IPC message of {size} bytes (limit {MAX_MESSAGE_BYTES})")
        message = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    if not isinstance(message, Message):
        raise ValueError(f"an IPC message is one of app.serving.worker_messages', got {type(message).__name__}")
    return message
