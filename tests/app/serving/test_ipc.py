"""The workers' IPC: length-prefixed pickles, each bounded."""

from __future__ import annotations

import pytest

from app.serving.ipc import MAX_MESSAGE_BYTES, MessageTooLarge, post
from tests.fakes import RecordingWriter


def test_the_sender_refuses_a_message_over_the_limit_and_writes_nothing() -> None:
    writer = RecordingWriter()
    with pytest.raises(MessageTooLarge) as refused:
        post(writer, {"op": "turn", "blob": b"x" * (MAX_MESSAGE_BYTES + 1)})
    assert refused.value.op == "turn"
    assert writer.written == b""
    post(writer, {"op": "status"})
    assert writer.written  # the connection goes on
