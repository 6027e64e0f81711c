"""Processed images by content: a camera conversation shows the engine the same frames every turn.

Past turns keep their images (up to ``HistoryLimits.max_image_tokens``), so each turn's prompt
holds again every frame of the turns before it, and Qwen's image processor (decode, resize,
normalise, cut into patches) costs ~4.4 ms per 352x256 camera frame on one core of this box.
The engine renders prompts between decoding steps, holding every visitor's decoding meanwhile:
camera turn 9 (25 frames in its prompt) rendered in 108 ms with every frame processed again,
51 ms with only its own 5 (tests/bench/vision.py, "render"). An image's patches depend only on
its bytes and its pixel budget, so they are kept here, least recently used out first, bounded
in bytes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import torch

from pipeline.conversation import UserImage

# float32 patches are ~70 times the JPEG: ~2.2 MB a frame at the camera's default budget (88
# tokens), ~24 MB a "high" megapixel image. 256 MiB holds ~120 camera frames: the past frames of
# every camera session a busy box carries.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024

Processed = tuple[torch.Tensor, torch.Tensor]  # (patches, (t, h, w) grid), as the processor returns them


class ImagePatchCache:
    """``(patches, grid)`` per (image bytes, pixel budget). The tensors it returns are shared:
    callers copy before they change one (``torch.cat`` does)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[bytes, int], Processed] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, image: UserImage, process: Callable[[UserImage], Processed]) -> Processed:
        """The image's patches and grid: kept ones, or ``process(image)``'s, then kept."""
        key = (hashlib.blake2b(image.data, digest_size=16).digest(), image.max_pixels)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        processed = process(image)
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
