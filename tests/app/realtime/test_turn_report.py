"""SessionObservers: several observers heard as one, in order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from app.realtime.turn_report import PlaybackReport, SessionObservers, SessionStart, TurnReport


class Heard:
    """An observer that notes what it was told, into a list it shares with others."""

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self._name, self._log = name, log

    def session_started(self, start: SessionStart) -> None:
        self._log.append((self._name, "started"))

    def turn_done(self, report: TurnReport) -> None:
        self._log.append((self._name, "turn"))

    def playback_over(self, report: PlaybackReport) -> None:
        self._log.append((self._name, "playback"))

    def session_closed(self, at: float) -> None:
        self._log.append((self._name, "closed"))

    def client_event(self, raw: str | bytes, at: float) -> None:
        self._log.append((self._name, f"client {raw!s}"))

    def server_event(self, event: Mapping[str, Any], at: float) -> None:
        self._log.append((self._name, f"server {event['type']}"))

    def input_audio(self, pcm: np.ndarray) -> None:
        self._log.append((self._name, f"input {pcm.size}"))

    def output_audio(self, pcm: np.ndarray) -> None:
        self._log.append((self._name, f"output {pcm.size}"))


def test_none_are_left_out_and_one_observer_is_itself():
    log: list[tuple[str, str]] = []
    only = Heard("spans", log)
    assert SessionObservers.of(None, None) is None
    assert SessionObservers.of(only, None) is only


def test_each_observer_hears_every_call_in_order():
    log: list[tuple[str, str]] = []
    both = SessionObservers.of(Heard("spans", log), None, Heard("recorder", log))
    assert both is not None
    both.session_started(SessionStart("sess_1", "conv_1", "m", 0.0))
    both.client_event('{"type": "response.create"}', 1.0)
    both.server_event({"type": "response.created"}, 1.1)
    both.input_audio(np.zeros(320, dtype=np.float32))
    both.output_audio(np.zeros(480, dtype=np.float32))
    both.playback_over(PlaybackReport("resp_1", "item_1", 2.0, 480, 480, truncated=False, interrupted=False))
    both.session_closed(3.0)
    told = ["started", 'client {"type": "response.create"}', "server response.created", "input 320", "output 480",
            "playback", "closed"]
    assert log == [(name, what) for what in told for name in ("spans", "recorder")]
