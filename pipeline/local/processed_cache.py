"""Processed prompt inputs by content: a conversation shows the engine the same images and clips every turn.

Past turns keep their images and audio clips (within ``HistoryLimits``), so each turn's prompt
holds again every frame and clip of the turns before it, and the engine renders prompts between
decoding steps, holding every visitor's decoding meanwhile:

- images: Qwen's image processor (decode, resize, normalise, cut into patches) costs ~4.4 ms per
  352x256 camera frame on one core of this box; camera turn 9 (25 frames in its prompt) rendered
  in 108 ms with every frame processed again, 51 ms with only its own 5 (tests/bench/vision.py,
  "render");
- audio: the Whisper log-mel features cost ~0.4 ms per second of speech; a spoken turn whose
  history holds the 120 s ``HistoryLimits`` allows rendered in 76 ms extracting them all again,
  21 ms extracting only its own 30 s clip (tests/bench/render.py).

What is processed depends only on the input's bytes and a setting (an image's pixel budget), so it
is kept here, least recently used out first, bounded in bytes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import torch

# float32 image patches are ~70 times the JPEG: ~2.2 MB a frame at the camera's default budget
# (88 tokens), ~24 MB a "high" megapixel image. 256 MiB holds ~120 camera frames: the past frames
# of every camera session a busy box carries. Audio features are 128 x 100 float32 a second,
# 51 kB: 64 MiB hold ~22 minutes of speech, the 120 s histories of ~10 talking sessions.
IMAGE_CACHE_BYTES = 256 * 1024 * 1024
AUDIO_CACHE_BYTES = 64 * 1024 * 1024

Processed = tuple[torch.Tensor, ...]  # the tensors an input becomes, as its processor returns them


class ProcessedCache:
    """The tensors per (content, setting). The tensors it returns are shared: callers copy before
    they change one (``torch.cat`` does)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[bytes, int], Processed] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, content: bytes, setting: int, process: Callable[[], Processed]) -> Processed:
        """What ``content`` became under ``setting``: kept, or ``process()``'s, then kept."""
        key = (hashlib.blake2b(content, digest_size=16).digest(), setting)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        processed = process()
        size = _nbytes(processed)
        if size <= self.max_bytes:
            self._entries[key] = processed
            self.held_bytes += size
            while self.held_bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.held_bytes -= _nbytes(evicted)
        return processed


def _nbytes(processed: Processed) -> int:
    return sum(tensor.element_size() * tensor.nelement() for tensor in processed)
