"""The processed-image cache: by content and budget, bounded in bytes, least recently used out."""

from __future__ import annotations

import torch

from pipeline.conversation import UserImage
from pipeline.image_cache import ImagePatchCache

ENTRY_BYTES = 100 * 16 * 4 + 3 * 8  # the patches below (float32) and their grid (int64)


class CountingProcessor:
    def __init__(self) -> None:
        self.processed: list[bytes] = []

    def __call__(self, image: UserImage) -> tuple[torch.Tensor, torch.Tensor]:
        self.processed.append(image.data)
        return torch.full((100, 16), float(len(self.processed))), torch.tensor([[1, 10, 10]])


def _image(data: bytes, max_pixels: int = 100_352) -> UserImage:
    return UserImage(data, 320, 320, max_pixels)


def test_an_image_seen_again_is_not_processed_again():
    cache, process = ImagePatchCache(), CountingProcessor()
    first = cache.get(_image(b"frame"), process)
    again = cache.get(_image(b"frame"), process)
    assert process.processed == [b"frame"]
    assert again[0] is first[0] and again[1] is first[1]
    assert (cache.hits, cache.misses) == (1, 1)


def test_the_same_bytes_under_another_pixel_budget_are_another_image():
    cache, process = ImagePatchCache(), CountingProcessor()
    cache.get(_image(b"photo", max_pixels=100_352), process)
    cache.get(_image(b"photo", max_pixels=1_003_520), process)
    assert process.processed == [b"photo", b"photo"]


def test_past_its_bytes_the_least_recently_used_image_goes_first():
    cache, process = ImagePatchCache(max_bytes=2 * ENTRY_BYTES), CountingProcessor()
    for data in (b"a", b"b", b"a", b"c"):  # "a" used again after "b": "b" is the oldest when "c" comes
        cache.get(_image(data), process)
    cache.get(_image(b"a"), process)
    cache.get(_image(b"b"), process)
    assert process.processed == [b"a", b"b", b"c", b"b"]
    assert len(cache) == 2 and cache.held_bytes == 2 * ENTRY_BYTES


def test_an_image_larger_than_the_cache_is_processed_and_not_kept():
    cache, process = ImagePatchCache(max_bytes=ENTRY_BYTES - 1), CountingProcessor()
    cache.get(_image(b"big"), process)
    cache.get(_image(b"big"), process)
    assert process.processed == [b"big", b"big"]
    assert len(cache) == 0 and cache.held_bytes == 0
