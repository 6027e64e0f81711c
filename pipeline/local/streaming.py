"""What a turn streams out: Code2Wav chunks sized to how far the audio is ahead, and text deltas."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from media.rates import VOICE_RATE
from pipeline.local.code2wav import Code2WavState, StreamingCode2Wav
from pipeline.local.params import GenerationParams


class AudioChunker:
    """Collects a turn's codec frames, says when a chunk is due, and carries its Code2Wav state.

    Code2Wav decodes each chunk's new frames with the state the previous chunks left
    (``pipeline.local.code2wav``), so a chunk needs no left context and its samples are final. The
    first chunk is due at ``first_chunk_frames``. After it, with ``adaptive_chunks``, a chunk
    is due once it holds as many frames as can be computed in half the audio still buffered
    ahead of the listener (measured: audio emitted minus time since the first chunk, against
    this turn's frames per second so far), between ``first_chunk_frames`` and
    ``max_chunk_frames``: small chunks while the listener is close to running out, larger ones
    (fewer Code2Wav calls) once far ahead. Without it every later chunk holds ``chunk_frames``.
    """

    def __init__(self, code2wav: StreamingCode2Wav, params: GenerationParams, clock: Callable[[], float]) -> None:
        self.state: Code2WavState = code2wav.new_state()
        self._first_chunk = params.first_chunk_frames
        self._chunk_frames = params.chunk_frames
        self._max_chunk_frames = params.max_chunk_frames
        self._adaptive = params.adaptive_chunks
        self._clock = clock
        self._frames: list[torch.Tensor] = []
        self.decoded_frames = 0  # frames covered by decoded chunks
        self._emitted_samples = 0  # waveform samples yielded so far
        self._first_frame_at: float | None = None
        self._first_audio_at: float | None = None

    @property
    def pending_frames(self) -> int:
        return len(self._frames) - self.decoded_frames

    def push(self, frame: torch.Tensor) -> None:
        if self._first_frame_at is None:
            self._first_frame_at = self._clock()
        self._frames.append(frame)

    def chunk_due(self, last: bool = False) -> bool:
        """True when the pending frames make a chunk; ``last``: no more frames will come."""
        pending = self.pending_frames
        if pending == 0:
            return False
        if last:
            return True
        if self.decoded_frames == 0:
            return pending >= self._first_chunk
        return pending >= self._next_chunk_frames()

    def _next_chunk_frames(self) -> int:
        if not self._adaptive or self._first_audio_at is None or self._first_frame_at is None:
            return self._chunk_frames
        now = self._clock()
        ahead_s = self._emitted_samples / VOICE_RATE - (now - self._first_audio_at)
        seconds_per_frame = (now - self._first_frame_at) / len(self._frames)
        if seconds_per_frame <= 0:
            return self._chunk_frames
        affordable = int(ahead_s / (2 * seconds_per_frame))
        return max(self._first_chunk, min(self._max_chunk_frames, affordable))

    def pending_codes(self) -> torch.Tensor:
        """[1, groups, frames]: the frames not decoded yet."""
        return torch.stack(self._frames[self.decoded_frames :], dim=-1).unsqueeze(0)

    def emit(self, pcm: np.ndarray) -> int:
        """Code2Wav's new final samples for ``pending_codes`` -> the frames the chunk completes."""
        self._emitted_samples += pcm.shape[-1]
        frames = len(self._frames) - self.decoded_frames
        self.decoded_frames = len(self._frames)
        if self._first_audio_at is None:
            self._first_audio_at = self._clock()
        return frames


class TextStream:
    """Incremental detokenization that only ever emits whole characters.

    Qwen's byte-level BPE splits multi-byte characters across tokens; the tokens since the
    last emitted delta are decoded together and held back while they end in an incomplete
    UTF-8 sequence (decoded as U+FFFD) until the next token or ``flush``.
    """

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending: list[int] = []
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def push(self, token: int) -> str:
        self._pending.append(token)
        if self._decode_pending().endswith("\ufffd"):
            return ""
        return self.flush()

    def flush(self) -> str:
        decoded = self._decode_pending()
        self._pending.clear()
        self._parts.append(decoded)
        return decoded

    def _decode_pending(self) -> str:
        return self._tokenizer.decode(self._pending, skip_special_tokens=True, clean_up_tokenization_spaces=False)
