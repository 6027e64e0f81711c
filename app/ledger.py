"""The playback ledger: how much of each assistant item's audio the listener has heard.

The output (``media.outbound.OutboundAudioTrack`` or any ``AudioOutput``) counts
``played_samples``: 24 kHz samples of queued audio actually sent, cumulatively. The session
writes each response's audio in order, one response at a time, so every item's audio is one
contiguous stretch of that clock: ``[start, start + written)``. What has been heard of an item
is then ``played_samples - start``, clamped, and after a ``clear()`` (which drops unplayed
audio) whatever had been heard at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Playback:
    """One assistant item's audio on the output's clock."""

    item_id: str
    response_id: str
    start: int  # output clock position of the item's first sample
    written: int = 0  # samples queued so far
    complete: bool = False  # the response has finished writing
    limit: int | None = None  # samples that count after a cut or a client truncate

    @property
    def end(self) -> int:
        return self.start + self.written

    def heard(self, played_samples: int) -> int:
        heard = min(max(played_samples - self.start, 0), self.written)
        return heard if self.limit is None else min(heard, self.limit)


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
            # An idle output has played everything queued: both positions agree then.
            playback = Playback(item_id, response_id, start=max(self._queue_end, played_samples))
            self._open[item_id] = playback
            self._queue_end = playback.start
        playback.written += samples
        self._queue_end += samples
        return playback

    def complete(self, item_id: str) -> None:
        """The item's response has finished: no more audio will be written for it."""
        playback = self._open.get(item_id)
        if playback is not None:
            playback.complete = True

    def cut(self, played_samples: int) -> list[Playback]:
        """The output dropped everything unplayed: each open item keeps what was heard; all close."""
        cut = list(self._open.values())
        for playback in cut:
            playback.limit = playback.heard(played_samples)
            playback.complete = True
        self._open.clear()
        self._queue_end = played_samples
        return cut

    def pop_finished(self, played_samples: int) -> list[Playback]:
        """Items whose response has finished and whose audio has all been played, oldest first."""
        finished = [p for p in self._open.values() if p.complete and played_samples >= p.end]
        for playback in finished:
            del self._open[playback.item_id]
        return finished
