"""Input audio that reaches the session outside WebRTC's 16 kHz stream.

- :class:`ManualBuffer`: manual mode's (``turn_detection: null``) uncommitted input, bounded.
- :class:`AppendDecoder`: ``input_audio_buffer.append``'s base64 audio in the session's input
  format (PCM16 at 24 kHz or the session's rate, or G.711 µ-law/A-law at 8 kHz), resampled as one continuous stream
  to the 16 kHz the VAD and the model hear, and held to real time (``MAX_APPEND_AHEAD_MS``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np
import soxr

from app.realtime.input_readers import MIN_COMMIT_MS, decode_input_audio
from app.realtime.protocol import ProtocolError
from media.rates import SPEECH_RATE, VOICE_RATE

# Manual mode keeps at most this much uncommitted input audio (the oldest is dropped).
MAX_MANUAL_BUFFER_MS = 60_000
# Appends are bounded by the audio they carry, not by their count (the event gate does not count
# them): a token bucket of audio milliseconds that holds MAX_APPEND_AHEAD_MS and refills at
# APPEND_RATE times real time; past it an append is refused (``input_audio_too_fast``) and
# dropped. A microphone streams at real time, in events of 10 to 100 ms; SDK examples append a
# recorded utterance at once, and 20 s holds any single utterance. Twice real time leaves a
# client that fell behind room to catch up, and keeps one from making the server run VAD over
# hours of audio in seconds (one append of 256 KiB, 5.5 s of PCM16, costs ~170 VAD windows
# inline). Each append costs at least MIN_APPEND_CHARGE_MS, so tiny appends cannot make a flood
# of events: at most 200 a second once the head start is spent, twice what 10 ms events in real
# time need (issue 35: 10 ms events in real time lost 151 of 500 to the event count's 50 a second).
MAX_APPEND_AHEAD_MS = 20_000
APPEND_RATE = 2.0
MIN_APPEND_CHARGE_MS = 10.0


class ManualBuffer:
    """16 kHz input waiting for ``input_audio_buffer.commit``; the oldest beyond a minute is dropped."""

    def __init__(self) -> None:
        self._chunks: deque[np.ndarray] = deque()
        self.samples = 0

    def append(self, pcm: np.ndarray) -> None:
        self._chunks.append(pcm)
        self.samples += pcm.size
        limit = MAX_MANUAL_BUFFER_MS * SPEECH_RATE // 1000
        while self.samples - self._chunks[0].size >= limit:
            self.samples -= self._chunks.popleft().size

    def clear(self) -> None:
        self._chunks.clear()
        self.samples = 0

    def take(self) -> np.ndarray:
        """Everything buffered, which is then cleared; ``ProtocolError`` below ``MIN_COMMIT_MS``."""
        if self.samples < MIN_COMMIT_MS * SPEECH_RATE // 1000:
            raise ProtocolError(
                "input_audio_buffer_commit_empty",
                f"Buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, "
                f"got {self.samples * 1000 // SPEECH_RATE} ms.",
            )
        pcm = np.concatenate(self._chunks)
        self.clear()
        return pcm


class AppendDecoder:
    """Base64 appends → 16 kHz float32, resampled without seams between appends, bounded by their
    duration: ``MAX_APPEND_AHEAD_MS`` at once, then ``APPEND_RATE`` times real time (a token
    bucket of audio milliseconds; each append costs at least ``MIN_APPEND_CHARGE_MS``)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, max_ahead_ms: int = MAX_APPEND_AHEAD_MS) -> None:
        self._clock = clock
        self._max_ahead_ms = max_ahead_ms
        self._budget_ms = float(max_ahead_ms)
        self._refilled_at = clock()
        self._format: tuple[str, int] | None = None
        self._resampler: soxr.ResampleStream | None = None

    def decode(self, audio: str, *, input_audio_format: str, pcm_rate: int = VOICE_RATE) -> np.ndarray:
        pcm, rate = decode_input_audio(audio, input_audio_format, "audio", pcm_rate=pcm_rate)
        self._admit(max(pcm.size * 1000 / rate, MIN_APPEND_CHARGE_MS))
        if self._resampler is None or self._format != (input_audio_format, rate):
            self._format = (input_audio_format, rate)  # a new format starts a new stream
            self._resampler = soxr.ResampleStream(rate, SPEECH_RATE, 1, dtype="float32")
        return self._resampler.resample_chunk(pcm)

    def _admit(self, audio_ms: float) -> None:
        now = self._clock()
        self._budget_ms = min(self._max_ahead_ms, self._budget_ms + (now - self._refilled_at) * 1000 * APPEND_RATE)
        self._refilled_at = now
        if audio_ms > self._budget_ms:
            raise ProtocolError(
                "input_audio_too_fast",
                f"Input audio is arriving too fast: {self._max_ahead_ms / 1000:g} s at once, then at most "
                f"{APPEND_RATE:g} times real time, is accepted (each append counts at least "
                f"{MIN_APPEND_CHARGE_MS:g} ms); this append ({audio_ms:.0f} ms) was dropped.",
                param="audio",
            )
        self._budget_ms -= audio_ms
