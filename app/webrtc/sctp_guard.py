"""The one place omni-rtc reaches into aiortc's SCTP transport: a peer that ignores the receive
window it was given ends its call.

Why: aiortc reassembles a data-channel message in memory until its last fragment arrives, and
keeps every fragment a peer sends. It advertises a 1 MiB receive window (``a_rwnd``) but drops
nothing past it, and the answer's ``a=max-message-size`` (256 KiB) binds only a sender that reads
it. Browsers keep to both. A peer that keeps to neither, sending one message that never ends, grew
the server's undelivered data by 20 MB in 40 s without bound (aiortc 1.16 at both ends on
127.0.0.1; a faster sender fills memory faster), every call on that process at risk.

aiortc counts the bytes it holds undelivered in its advertised window: the window it started
with less what is still in its reassembly queues. This module wraps the transport's handler of
DATA chunks, reads that count after each chunk and, past ``MAX_UNDELIVERED_BYTES``, tells the
call once and keeps no further chunk while the call ends.

The private names were read in aiortc 1.16 (pyproject.toml pins the same range); a transport
without them is refused with a message that says so, rather than poked blindly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import RTCSctpTransport

# Twice the window aiortc advertises (1 MiB). A peer that keeps to the window never holds more
# than 1 MiB here; aiortc's own sender ignores the window but never has more in flight than its
# congestion window, which stays under 1 MiB for event traffic (messages of at most 256 KiB).
MAX_UNDELIVERED_BYTES = 2 * 1024 * 1024
_HANDLER = "_receive_data_chunk"
_WINDOW = "_advertised_rwnd"


def guard_receive_window(
    transport: RTCSctpTransport, on_overflow: Callable[[int], None], *, limit: int = MAX_UNDELIVERED_BYTES
) -> None:
    """Call ``on_overflow(undelivered_bytes)`` once when the peer's undelivered data passes ``limit``.

    Call before the association starts (after ``setRemoteDescription``). From then on the
    transport keeps no DATA chunk: the caller is expected to end the call.
    """
    handler: Callable[[Any], Awaitable[None]] | None = getattr(transport, _HANDLER, None)
    window = getattr(transport, _WINDOW, None)
    if handler is None or not isinstance(window, int):
        raise TypeError(
            f"expected aiortc 1.16's RTCSctpTransport (with {_HANDLER} and an integer {_WINDOW}), got {transport!r}"
        )
    tripped = False

    async def receive_data_chunk(chunk: Any) -> None:
        nonlocal tripped
        if tripped:
            return  # the call is ending: hold nothing more of this peer's
        await handler(chunk)
        undelivered = window - getattr(transport, _WINDOW)
        if undelivered > limit:
            tripped = True
            on_overflow(undelivered)

    setattr(transport, _HANDLER, receive_data_chunk)
