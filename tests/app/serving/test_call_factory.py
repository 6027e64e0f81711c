"""What the server checks of its settings at start, before any call is built."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.serving import call_factory
from media.aiortc_version import UnsupportedAiortc


def refuse_this_aiortc() -> None:
    raise UnsupportedAiortc("aiortc 1.99.0 is installed")


def test_the_jitter_buffer_on_an_unknown_aiortc_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setattr(call_factory, "check_receiver_tap", refuse_this_aiortc)
    with pytest.raises(ValueError, match="^jitter_buffer: aiortc 1.99.0"):
        call_factory.check_jitter_buffer(Settings(jitter_buffer=True))
    call_factory.check_jitter_buffer(Settings(jitter_buffer=False))  # aiortc's own receive path: no check
