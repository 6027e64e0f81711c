"""The processed-input cache: by content and setting, bounded in bytes, least recently used out."""

from __future__ import annotations

import torch

from pipeline.local.processed_cache import ProcessedCache

ENTRY_BYTES = 100 * 16 * 4 + 3 * 8  # the patches below (float32) and their grid (int64)
BUDGET = 100_352


class CountingProcessor:
    def __init__(self) -> None:
        self.processed: list[bytes] = []

    def process(self, data: bytes):
        def run() -> tuple[torch.Tensor, torch.Tensor]:
            self.processed.append(data)
            return torch.full((100, 16), float(len(self.processed))), torch.tensor([[1, 10, 10]])

        return run


def test_an_input_seen_again_is_not_processed_again():
    cache, processor = ProcessedCache(max_bytes=10 * ENTRY_BYTES), CountingProcessor()
    first = cache.get(b"frame", BUDGET, processor.process(b"frame"))
    again = cache.get(b"frame", BUDGET, processor.process(b"frame"))
    assert processor.processed == [b"frame"]
    assert again[0] is first[0] and again[1] is first[1]
    assert (cache.hits, cache.misses) == (1, 1)


def test_the_same_bytes_under_another_setting_are_another_input():
    cache, processor = ProcessedCache(max_bytes=10 * ENTRY_BYTES), CountingProcessor()
    cache.get(b"photo", 100_352, processor.process(b"photo"))
    cache.get(b"photo", 1_003_520, processor.process(b"photo"))
    assert processor.processed == [b"photo", b"photo"]


def test_past_its_bytes_the_least_recently_used_input_goes_first():
    cache, processor = ProcessedCache(max_bytes=2 * ENTRY_BYTES), CountingProcessor()
    for data in (b"a", b"b", b"a", b"c"):  # "a" used again after "b": "b" is the oldest when "c" comes
        cache.get(data, BUDGET, processor.process(data))
    cache.get(b"a", BUDGET, processor.process(b"a"))
    cache.get(b"b", BUDGET, processor.process(b"b"))
    assert processor.processed == [b"a", b"b", b"c", b"b"]
    assert len(cache) == 2 and cache.held_bytes == 2 * ENTRY_BYTES


def test_an_input_larger_than_the_cache_is_processed_and_not_kept():
    cache, processor = ProcessedCache(max_bytes=ENTRY_BYTES - 1), CountingProcessor()
    cache.get(b"big", BUDGET, processor.process(b"big"))
    cache.get(b"big", BUDGET, processor.process(b"big"))
    assert processor.processed == [b"big", b"big"]
    assert len(cache) == 0 and cache.held_bytes == 0
