"""The answers' audio on its way to the listener, as one session sees it.

It holds the session's ``AudioOutput`` and the playback ledger (``app.realtime.ledger``: what of
each answer was written and played), sends ``output_audio_buffer.started`` (the output reported
the first frame), ``stopped`` (everything written has played) and ``cleared`` (unplayed audio
dropped), and settles each answer into the history as heard once its audio has played out or
was cut (``History.settle_all``: ``conversation.item.truncated`` for those cut short).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from app.realtime.entries import AssistantEntry
from app.realtime.history import History
from app.realtime.ledger import AudioOutput, PlaybackLedger
from app.realtime.protocol import (
    OutputAudioBufferClearedEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
)


class AnswerAudio:
    """``on_idle``: the audio is over (played out, or cleared); ``on_settled``: items left the
    ledger for the history (the session prunes it)."""

    def __init__(
        self,
        output: AudioOutput,
        history: History,
        emit: Callable[[Any], None],
        *,
        on_idle: Callable[[], None],
        on_settled: Callable[[], None],
    ) -> None:
        self.output = output
        self.ledger = PlaybackLedger()
        self._history = history
        self._emit = emit
        self._on_idle = on_idle
        self._on_settled = on_settled
        self._speaking_response_id: str | None = None  # output_audio_buffer.started sent
        self.last_response_id: str | None = None  # the latest response started (cleared names it)
        self._clearing = False  # inside output.clear(), whose stop callback is not a drain

    def __len__(self) -> int:
        """Answers whose audio is written and not yet played out."""
        return len(self.ledger)

    def idle_and_paced(self) -> bool:
        """Nothing is queued and the output is paced: it will report the next audio's first frame
        (``on_playback_started``)."""
        return len(self.ledger) == 0 and getattr(self.output, "paced", False)

    def write(self, response_id: str, entry: AssistantEntry, pcm: np.ndarray) -> None:
        """Queue response ``response_id``'s audio for ``entry``."""
        entry.add_audio(pcm.size)
        self.ledger.write(entry.id, response_id, pcm.size, self.output.played_samples)
        self.output.write(pcm)

    def started(self) -> str | None:
        """The output sent a first frame after being idle: the response whose audio it is, when this
        starts the assistant speaking (``output_audio_buffer.started``), else None."""
        if self._speaking_response_id is not None:
            return None
        playback = self.ledger.oldest()
        if playback is None:
            return None
        self._speaking_response_id = playback.response_id
        self._emit(OutputAudioBufferStartedEvent(response_id=playback.response_id))
        return playback.response_id

    def stopped(self) -> None:
        """The output ran dry: everything written has played."""
        if self._clearing:
            return  # a clear is accounted for by clear() itself
        self.ledger.drained(self.output.played_samples)
        self.settle()

    def settle(self) -> None:
        """Retire items whose audio has played out; announce when the assistant stopped speaking."""
        played = self.output.played_samples
        finished = self.ledger.pop_finished(played)
        for event in self._history.settle_all(finished, played):  # a cancelled answer's text ran ahead
            self._emit(event)
        if len(self.ledger) == 0:
            if self._speaking_response_id is not None:
                response_id = finished[-1].response_id if finished else self._speaking_response_id
                self._speaking_response_id = None
                self._emit(OutputAudioBufferStoppedEvent(response_id=response_id))
            self._on_idle()
        if finished:
            self._on_settled()

    def clear(self, *, always_announce: bool) -> None:
        """Drop unplayed audio; items keep what was heard (``conversation.item.truncated``)."""
        had_audio = len(self.ledger) > 0
        self._clearing = True
        try:
            self.output.clear()
        finally:
            self._clearing = False
        played = self.output.played_samples
        cut = self.ledger.cut(played)
        response_id = cut[0].response_id if cut else self.last_response_id
        if (had_audio or always_announce) and response_id is not None:
            self._emit(OutputAudioBufferClearedEvent(response_id=response_id))
        self._speaking_response_id = None
        for event in self._history.settle_all(cut, played):
            self._emit(event)
        if cut:
            self._on_settled()
        self._on_idle()
