"""Answer audio as events, for transports without a media track (the WebSocket).

:class:`EventAudioOutput` is the session's ``AudioOutput`` there: each written chunk leaves at
once as ``response.output_audio.delta`` (base64 in the session's output format: PCM16 at
24 kHz, or G.711 µ-law/A-law at 8 kHz), and what counts as *played* comes from the client:

- Until the client acknowledges playback, audio counts as played once it is written, so an
  answer enters the history whole when it has been generated (OpenAI's WebSocket behaviour;
  ``conversation.item.truncate`` cuts it to what was heard).
- From the first ``playback.ack`` on (vllm-omni's acknowledgement; ``acknowledge_playback``),
  audio counts as played only as far as the client says it played it. The session then keeps
  an answer out of the history, and half-duplex keeps not listening, until it has played out.

The output reads the session's server events on their way to the client (``observe``), as the
metrics do: ``session.created``/``updated`` give the output format, ``response.output_item.added``
the response and item the audio that follows belongs to, ``response.output_audio.done`` its end
(the resampler's tail goes out before it).
"""

from __future__ import annotations

import base64
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import soxr

from app.realtime.playback import AudioSegment, PlaybackReports
from app.realtime.protocol import (
    OutputAudioBufferClearedEvent,
    OutputAudioBufferStartedEvent,
    OutputAudioBufferStoppedEvent,
    ResponseOutputAudioDeltaEvent,
    ResponseOutputAudioDoneEvent,
    ResponseOutputItemAddedEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
    event_type,
)
from media import g711
from media.rates import VOICE_RATE

logger = logging.getLogger(__name__)

_SESSION_EVENTS = (event_type(SessionCreatedEvent), event_type(SessionUpdatedEvent))
_ITEM_ADDED = event_type(ResponseOutputItemAddedEvent)
_AUDIO_DONE = event_type(ResponseOutputAudioDoneEvent)
# OpenAI's WebSocket sends none of these: they tell when a server-side media track plays.
MEDIA_TRACK_EVENTS = frozenset(
    event_type(event) for event in (OutputAudioBufferStartedEvent, OutputAudioBufferStoppedEvent, OutputAudioBufferClearedEvent)
)
# Answers whose playback can still be acknowledged; older ones are forgotten (an ack naming one
# is answered with playback_item_not_found). A client acks the answer it is playing, or the last.
MAX_TRACKED_ITEMS = 16


class EventAudioOutput:
    """An ``AudioOutput`` that sends audio as delta events and counts playback from acks."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        self._send = send
        self._listener: Any = None
        self._format = "audio/pcm"
        self._current: AudioSegment | None = None  # the answer whose audio is being written
        self._announced: tuple[str, str] | None = None  # (response_id, item_id) of the last item added
        self._segments: OrderedDict[str, AudioSegment] = OrderedDict()
        self._resampler: soxr.ResampleStream | None = None  # 24 kHz → 8 kHz for G.711
        self._written = 0
        self._played = 0
        self.acknowledging = False  # the client has sent a playback.ack: it reports what it played

    # -- AudioOutput -----------------------------------------------------------------------

    paced = False  # audio counts as sent once written: no first frame or drain to report

    @property
    def playback_reports(self) -> PlaybackReports:
        return self

    @property
    def played_samples(self) -> int:
        return self._played

    def set_listener(self, listener: Any) -> None:
        self._listener = listener

    def write(self, pcm: np.ndarray) -> None:
        if pcm.size == 0:
            return
        segment = self._current
        if segment is None:
            if self._announced is None:
                logger.warning("audio written before any response item was announced; dropped")
                return
            segment = self._current = AudioSegment(*self._announced, start=self._written)
            self._track(segment)
            self._resampler = None
            if self._listener is not None:
                self._listener.on_playback_started()
        segment.written += pcm.size
        self._written += pcm.size
        if not self.acknowledging:
            self._played = self._written
        self._send_delta(segment, self._encode(pcm, last=False))

    def pause(self) -> None:
        """Nothing to do: the client holds and plays what was sent (it stops at ``speech_started``,
        which comes only once speech over the answer is confirmed as an interruption)."""

    def resume(self) -> None:
        """Nothing was paused (``pause``)."""

    def clear(self) -> None:
        """Drops what has not been played: the next answer starts where playback stands."""
        self._written = self._played
        for segment in self._segments.values():
            segment.written = max(0, min(segment.written, self._played - segment.start))
        self._current = None

    # -- the event stream ------------------------------------------------------------------

    def observe(self, event: dict[str, Any]) -> bool:
        """Reads one server event on its way to the client; False: not sent on this transport
        (``output_audio_buffer.*`` describe a server-side media track, which there is none of)."""
        kind = event.get("type")
        if kind in MEDIA_TRACK_EVENTS:
            return False
        if kind in _SESSION_EVENTS:
            audio_output = ((event.get("session") or {}).get("audio") or {}).get("output") or {}
            self._format = str((audio_output.get("format") or {}).get("type", "audio/pcm"))
        elif kind == _ITEM_ADDED:
            item = event.get("item") or {}
            if item.get("role") == "assistant":
                self._announced = (str(event.get("response_id")), str(item.get("id")))
                self._current = None
        elif kind == _AUDIO_DONE:
            segment = self._current
            if segment is not None and self._resampler is not None:
                tail = self._encode(np.zeros(0, dtype=np.float32), last=True)
                if tail:
                    self._send_delta(segment, tail)
            self._current = None
        return True

    # -- playback acknowledgements ---------------------------------------------------------

    def find(self, *, item_id: str | None, response_id: str | None) -> AudioSegment | None:
        """The answer an ack names; naming neither: the oldest not yet played out, else the last."""
        for segment in self._segments.values():
            if (item_id is None or segment.item_id == item_id) and (
                response_id is None or segment.response_id == response_id
            ):
                if item_id is not None or response_id is not None or segment.end > self._played:
                    return segment
        if item_id is None and response_id is None and self._segments:
            return next(reversed(self._segments.values()))
        return None

    def acknowledge(self, segment: AudioSegment, played_samples: int) -> None:
        """The client has played ``played_samples`` of ``segment`` (and everything before it)."""
        self.acknowledging = True
        position = segment.start + min(played_samples, segment.written)
        if position > self._played:
            self._played = position
            if self._played >= self._written and self._listener is not None:
                self._listener.on_playback_stopped()  # played out: the session settles its items

    def played_out(self, item_id: str) -> None:
        """The client stopped playing this answer (it truncated it): its playback is over."""
        segment = self._segments.get(item_id)
        if segment is not None and self.acknowledging:
            self.acknowledge(segment, segment.written)

    # -- helpers ---------------------------------------------------------------------------

    def _track(self, segment: AudioSegment) -> None:
        self._segments[segment.item_id] = segment
        while len(self._segments) > MAX_TRACKED_ITEMS:
            self._segments.popitem(last=False)

    def _encode(self, pcm: np.ndarray, *, last: bool) -> bytes:
        if self._format not in g711.G711_FORMATS:
            return (np.clip(np.round(pcm * 32_768.0), -32_768, 32_767).astype("<i2")).tobytes()
        if self._resampler is None:
            self._resampler = soxr.ResampleStream(VOICE_RATE, g711.G711_RATE, 1, dtype="float32")
        return g711.encode(self._resampler.resample_chunk(pcm.astype(np.float32), last=last), self._format)

    def _send_delta(self, segment: AudioSegment, data: bytes) -> None:
        if not data:
            return
        delta = ResponseOutputAudioDeltaEvent(
            response_id=segment.response_id, item_id=segment.item_id, output_index=0, content_index=0,
            delta=base64.b64encode(data).decode("ascii"),
        )
        self._send(delta.to_json())
