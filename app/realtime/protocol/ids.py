"""Ids and the events channel's name, as OpenAI's Realtime API has them."""

from __future__ import annotations

import secrets

# The data channel WebRTC clients open for events (OpenAI's name for it).
EVENTS_CHANNEL = "oai-events"


def new_id(prefix: str) -> str:
    """An id like OpenAI's: ``event_…``, ``item_…``, ``resp_…``, ``sess_…``, ``conv_…``."""
    return f"{prefix}_{secrets.token_hex(10)}"


def new_event_id() -> str:
    return new_id("event")
