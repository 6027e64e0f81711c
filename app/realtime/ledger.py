"""The playback ledger: how much of each assistant item's audio the listener has heard.

The output (``media.outbound.OutboundAudioTrack`` or any ``AudioOutput``) counts
``played_samples``: 24 kHz samples of queued audio actually sent, cumulatively. The session
writes each response's audio in order, one response at a time, so the audio of an item that
is queued now is one contiguous stretch of that clock, ``[segment_start, segment_start +
segment_written)``, and what has been heard of it is ``played_samples - segment_start``,
clamped. When the output runs dry (``drained``), everything written so far has been played,
whatever the clock says: the outbound track resamples 24 → 48 kHz and its count may differ
from what was written by a sample or two. A ``clear()`` drops unplayed audio (``cut``): each
item keeps what had been heard at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class AudioOutput(Protocol):
    """Where the assistant's 24 kHz float32 audio goes; ``media.outbound.OutboundAudioTrack`` is one."""

    def write(self, pcm: np.ndarray) -> None: ...

    def clear(self) -> None: ...

    @property
    def played_samples(self) -> int: ...

    def set_listener(self, listener: Any) -> None: ...


@dataclass
class Playback:
    """One assistant item's audio on the output's clock."""

    item_id: str
    response_id: str
    heard_before: int = 0  # samples played out before the output last ran dry
    segment_start: int | None = None  # clock position of the first sample queued since then
    segment_written: int = 0  # samples queued since the output last ran dry
    complete: bool = False  # the response has finished writing
    limit: int | None = None  # samples that count, after a cut or a client truncate
    unfinished: bool = False  # cleared before its response had written all its audio
    truncated: bool = False  # the client's conversation.item.truncate cut it (and was answered)

    @property
    def written(self) -> int:
        return self.heard_before + self.segment_written

    def heard(self, played_samples: int) -> int:
        segment = 0
        if self.segment_start is not None:
            segment = min(max(played_samples - self.segment_start, 0), self.segment_written)
        heard = self.heard_before + segment
        return heard if self.limit is None else min(heard, self.limit)

    def finished(self, played_samples: int) -> bool:
        """All written, and all of it played."""
        if not self.complete:
            return False
        return self.segment_start is None or played_samples >= self.segment_start + self.segment_written


class PlaybackLedger:
    """The items whose audio is queued or playing, oldest first; bounded by what is in flight."""

    def __init__(self) -> None:
        self._queue_end = 0  # output clock position right after the last queued sample
        self._open: dict[str, Playback] = {}

    def __len__(self) -> int:
        return len(self._open)

    def get(self, item_id: str) -> Playback | None:
        return self._open.get(item_id)

    def oldest(self) -> Playback | None:
        return next(iter(self._open.values()), None)

    def write(self, item_id: str, response_id: str, samples: int, played_samples: int) -> Playback:
        """Record ``samples`` more of ``item_id``'s audio, queued right after everything before it."""
        playback = self._open.get(item_id)
        if playback is None:
            playback = self._open[item_id] = Playback(item_id, response_id)
        if playback.segment_start is None:
            playback.segment_start = max(self._queue_end, played_samples)
            self._queue_end = playback.segment_start
        playback.segment_written += samples
        self._queue_end += samples
        return playback

    def complete(self, item_id: str) -> None:
        """The item's response has finished: no more audio will be written for it."""
        playback = self._open.get(item_id)
        if playback is not None:
            playback.complete = True

    def drained(self, played_samples: int) -> None:
        """The output ran dry: everything written so far has been played."""
        for playback in self._open.values():
            playback.heard_before += playback.segment_written
            playback.segment_written = 0
            playback.segment_start = None
        self._queue_end = played_samples

    def cut(self, played_samples: int) -> list[Playback]:
        """The output dropped everything unplayed: each open item keeps what was heard; all close."""
        cut = list(self._open.values())
        for playback in cut:
            playback.limit = playback.heard(played_samples)
            playback.unfinished = not playback.complete
            playback.complete = True
        self._open.clear()
        self._queue_end = played_samples
        return cut

    def pop_finished(self, played_samples: int) -> list[Playback]:
        """Items whose response has finished and whose audio has all been played, oldest first."""
        finished = [playback for playback in self._open.values() if playback.finished(played_samples)]
        for playback in finished:
            del self._open[playback.item_id]
        return finished
