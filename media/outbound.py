"""Outbound audio: a paced WebRTC track that plays 24 kHz float32 audio written to it.

Pacing is :class:`media.pacing.FramePacer`, so ``played_samples`` never runs ahead of what the
listener has heard; audio written to a track sending silence wakes the pacer. Resampling
24 → 48 kHz is one ``soxr.ResampleStream`` kept across writes, flushed when the queue cannot fill
the next frame. The rules and why: docs/NETWORK.md, "Outbound: pacing".
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import av
import numpy as np
import soxr
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from media.pacing import FRAME_SAMPLES, FramePacer, PacingStats
from media.rates import VOICE_RATE, WIRE_RATE

logger = logging.getLogger(__name__)

_UPSAMPLING = WIRE_RATE // VOICE_RATE
# Sent whenever nothing is queued (most frames of a call): one buffer, no per-frame conversion.
_SILENT_FRAME = np.zeros(FRAME_SAMPLES, dtype=np.int16)


class PlaybackListener(Protocol):
    def on_playback_started(self) -> None: ...
    def on_playback_stopped(self) -> None: ...


class FrameTap(Protocol):
    """Sees every 48 kHz int16 frame the track sends (``audio``: it held written audio, not silence)."""

    def __call__(self, frame: np.ndarray, *, audio: bool) -> None: ...


class OutboundAudioTrack(MediaStreamTrack):
    """Audio track fed by ``write()``; sends silence whenever nothing is queued.

    Use from the event loop only: ``write``, ``clear`` and listener callbacks (made
    synchronously from ``recv()``) all run there.
    """

    kind = "audio"
    # Sends in real time by itself and reports the first frame of audio after silence
    # (on_playback_started) as it hands it on: a session may wait for that to time its answers.
    paced = True
    playback_reports = None  # the track itself counts what it played: no client reports

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        pacing_stats: PacingStats | None = None,
    ) -> None:
        super().__init__()
        self._pacer = FramePacer(clock=clock, sleep=sleep, stats=pacing_stats)
        self._resampler = soxr.ResampleStream(VOICE_RATE, WIRE_RATE, 1, dtype="float32", quality="HQ")
        self._resampler_holds_audio = False
        self._queue: deque[np.ndarray] = deque()  # 48 kHz float32 chunks not yet sent
        self._queued = 0
        self._sent_audio = 0  # 48 kHz samples of written audio sent so far
        self._playing = False
        self._paused = False  # pause(): silence goes out, the queue waits
        self._listener: PlaybackListener | None = None
        self._frame_tap: FrameTap | None = None

    @property
    def played_samples(self) -> int:
        """24 kHz samples of written audio sent so far (cumulative; silence not counted)."""
        return self._sent_audio // _UPSAMPLING

    def set_listener(self, listener: PlaybackListener | None) -> None:
        self._listener = listener

    def set_frame_tap(self, tap: FrameTap | None) -> None:
        """``tap`` sees each frame as it is sent (an echo canceller's far end)."""
        self._frame_tap = tap

    def write(self, pcm: np.ndarray) -> None:
        """Queue 24 kHz mono float32 audio (samples in [-1, 1]) to play after what is queued."""
        if pcm.ndim != 1 or not np.issubdtype(pcm.dtype, np.floating):
            raise ValueError(f"expected 1-D float 24 kHz mono PCM, got {pcm.dtype} array of shape {pcm.shape}")
        if not np.all(np.isfinite(pcm)):
            raise ValueError("PCM contains NaN or infinite samples")
        if pcm.size == 0:
            return
        self._resampler_holds_audio = True
        self._enqueue(self._resampler.resample_chunk(pcm.astype(np.float32, copy=False)))
        if not self._playing:
            self._pacer.wake()  # a new answer (or audio after a stall): its first frame goes now

    def pause(self) -> None:
        """Send silence and keep the queue where it stands until ``resume`` (or ``clear``); the
        answer is still playing as far as the listener is told, and ``played_samples`` stops."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def clear(self) -> None:
        """Drop all unplayed audio (barge-in); fires on_playback_stopped if audio was playing."""
        self._paused = False
        self._queue.clear()
        self._queued = 0
        self._resampler.clear()
        self._resampler_holds_audio = False
        self._set_playing(False)

    def stop(self) -> None:
        super().stop()
        self.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._pacer.wait_until_due()
        samples = None if self._paused else self._take_frame()
        pcm = _SILENT_FRAME if samples is None else np.clip(np.rint(samples * 32767.0), -32768, 32767).astype(np.int16)
        if self._frame_tap is not None:
            self._frame_tap(pcm, audio=samples is not None)
        return self._pacer.frame(pcm)

    def _take_frame(self) -> np.ndarray | None:
        """The next 20 ms of queued audio, zero-padded; None when nothing is queued (silence)."""
        if self._queued < FRAME_SAMPLES and self._resampler_holds_audio:
            # Nothing more to resample right now: release soxr's withheld tail (as if
            # silence followed) so the end of an answer is never stuck in the filter.
            self._enqueue(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
            self._resampler.clear()
            self._resampler_holds_audio = False
        if not self._queue:
            self._set_playing(False)
            return None
        frame = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        filled = 0
        while filled < FRAME_SAMPLES and self._queue:
            head = self._queue[0]
            count = min(head.size, FRAME_SAMPLES - filled)
            frame[filled : filled + count] = head[:count]
            filled += count
            if count == head.size:
                self._queue.popleft()
            else:
                self._queue[0] = head[count:]
        self._queued -= filled
        self._sent_audio += filled
        # "Started" with the first frame carrying audio; "stopped" with the first frame
        # that has none, i.e. once the last audio frame has gone out and been played.
        self._set_playing(filled > 0)
        return frame

    def _enqueue(self, pcm48: np.ndarray) -> None:
        if pcm48.size:
            self._queue.append(pcm48)
            self._queued += pcm48.size

    def _set_playing(self, playing: bool) -> None:
        if playing == self._playing:
            return
        self._playing = playing
        if self._listener is not None:
            if playing:
                self._listener.on_playback_started()
            else:
                self._listener.on_playback_stopped()
