"""Input audio that reaches the session outside WebRTC's 16 kHz stream.

- :class:`ManualBuffer`: manual mode's (``turn_detection: null``) uncommitted input, bounded.
- :class:`AppendDecoder`: ``input_audio_buffer.append``'s base64 PCM16 at 24 kHz, resampled
  as one continuous stream to the 16 kHz the VAD and the model hear.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import soxr

from app.realtime.history import MIN_COMMIT_MS, decode_pcm16
from app.realtime.protocol import ProtocolError
from media.rates import SPEECH_RATE, VOICE_RATE

# Manual mode keeps at most this much uncommitted input audio (the oldest is dropped).
MAX_MANUAL_BUFFER_MS = 60_000


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
    """Base64 ``audio/pcm`` appends → 16 kHz float32, resampled without seams between appends."""

    def __init__(self) -> None:
        self._resampler: soxr.ResampleStream | None = None

    def decode(self, audio: str, *, input_audio_format: str) -> np.ndarray:
        if input_audio_format != "audio/pcm":
            raise ProtocolError(
                "invalid_value",
                "Base64 audio must be audio/pcm (PCM16, 24 kHz); set audio.input.format accordingly.",
                param="audio",
            )
        pcm24 = decode_pcm16(audio, "audio")
        if self._resampler is None:
            self._resampler = soxr.ResampleStream(VOICE_RATE, SPEECH_RATE, 1, dtype="float32")
        return self._resampler.resample_chunk(pcm24)
