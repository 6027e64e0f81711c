"""The workers' IPC: length-prefixed pickles of app.serving.worker_messages, each bounded."""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

import pytest

from app.serving.ipc import MAX_MESSAGE_BYTES, MAX_UNREAD_BYTES, MessageTooLarge, post, receive
from app.serving.worker_messages import CallClosed, ResourcesReport, Status
from tests.fakes import RecordingWriter


def test_the_sender_refuses_a_message_over_the_limit_and_writes_nothing() -> None:
    writer = RecordingWriter()
    with pytest.raises(MessageTooLarge) as refused:
        post(writer, ResourcesReport(request=1, resources={"blob": b"x" * (MAX_MESSAGE_BYTES + 1)}))
    assert refused.value.message_type is ResourcesReport
    assert writer.written == b""
    post(writer, Status(sessions=0, pacing={}, metrics=[]))
    assert writer.written  # the connection goes on


async def test_a_message_arrives_as_the_dataclass_it_was_sent_as() -> None:
    writer = RecordingWriter()
    post(writer, CallClosed(call_id="rtc_1", reason="hangup"))
    reader = asyncio.StreamReader()
    reader.feed_data(writer.written)
    reader.feed_eof()
    assert await receive(reader) == CallClosed(call_id="rtc_1", reason="hangup")
    assert await receive(reader) is None  # the other end closed


async def test_what_no_end_sends_breaks_the_connection() -> None:
    data = pickle.dumps({"op": "status"})
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack("!I", len(data)) + data)
    with pytest.raises(ValueError, match="got dict"):
        await receive(reader)


async def test_a_connection_whose_other_end_stops_reading_is_aborted_not_grown_without_bound() -> None:
    left, right = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=left)
    stalled_reader, stalled_writer = await asyncio.open_connection(sock=right)  # never read
    chunk = ResourcesReport(request=1, resources={"blob": b"x" * (MAX_MESSAGE_BYTES // 2)})
    for _ in range(2 * MAX_UNREAD_BYTES // (MAX_MESSAGE_BYTES // 2)):
        if writer.is_closing():
            break
        post(writer, chunk)
    assert writer.is_closing()
    stalled_writer.close()
    writer.close()
