"""KVCache masks in the form each attention implementation takes, checked against transformers' own unpadding."""

from __future__ import annotations

import torch
from transformers.modeling_flash_attention_utils import _get_unpad_data, _unpad_input, _upad_input

from pipeline.local.kv_cache import KVCache

HEADS, HEAD_DIM = 2, 4


def padded_batch(pads: list[int], length: int) -> KVCache:
    """Two rows left-padded by ``pads``, every real slot's keys and values numbered, padding zero."""
    rows = len(pads)
    keys = torch.arange(rows * HEADS * length * HEAD_DIM, dtype=torch.float32).reshape(rows, HEADS, length, HEAD_DIM) + 1
    cache = KVCache([keys.clone()], [keys.clone()], pads, length)
    for row, pad in enumerate(pads):
        cache._keys[0][row, :, :pad] = 0
        cache._values[0][row, :, :pad] = 0
    return cache


def test_the_flash_mask_of_a_padded_two_row_batch_keeps_exactly_each_rows_real_tokens():
    # The batch: pads [3, 0], eight cached slots, one decoding step (the new slot 8).
    cache = padded_batch([3, 0], length=8)
    mask = cache.mask(1, "flash_attention_2")
    assert mask is not None and mask.shape == (2, 9)
    indices, cu_seqlens, max_seqlen = _get_unpad_data(mask)
    # Row 0 holds slots 3..8 (6 tokens), row 1 slots 0..8 (9 tokens), flattened row by row.
    assert indices.tolist() == [3, 4, 5, 6, 7, 8] + [9 + slot for slot in range(9)]
    assert cu_seqlens.tolist() == [0, 6, 15]
    assert max_seqlen == 9


def test_flash_unpadding_of_a_decoding_step_gives_each_row_its_own_keys():
    cache = padded_batch([3, 0], length=8)
    new_keys = torch.full((2, HEADS, 1, HEAD_DIM), -1.0)
    keys, values = cache.update(new_keys, new_keys, 0)
    mask = cache.mask(1, "flash_attention_2")
    query = torch.randn(2, 1, HEADS, HEAD_DIM)
    # transformers' flash path takes [batch, seq, heads, dim].
    _, unpadded_keys, _, indices_q, (cu_q, cu_k), (max_q, max_k) = _upad_input(
        query, keys.transpose(1, 2), values.transpose(1, 2), mask, 1, _unpad_input
    )
    assert cu_q.tolist() == [0, 1, 2] and indices_q.tolist() == [0, 1] and max_q == 1
    assert cu_k.tolist() == [0, 6, 15] and max_k == 9
    expected = torch.cat([keys[0, :, 3:9].transpose(0, 1), keys[1, :, 0:9].transpose(0, 1)])
    assert torch.equal(unpadded_keys, expected)
    assert (unpadded_keys != 0).all()  # no padding slot among them


def test_eager_and_sdpa_get_an_additive_mask_over_the_padding():
    cache = padded_batch([3, 0], length=8)
    for attention in ("eager", "sdpa"):
        mask = cache.mask(1, attention)
        assert mask is not None and mask.shape == (2, 1, 1, 9)
        hidden = mask[:, 0, 0] == torch.finfo(torch.float32).min
        assert hidden[0].tolist() == [True] * 3 + [False] * 6 and not hidden[1].any()
        assert (mask[~(mask == torch.finfo(torch.float32).min)] == 0).all()


def test_rows_without_padding_need_no_mask():
    cache = padded_batch([0, 0], length=8)
    assert cache.mask(1, "flash_attention_2") is None and cache.mask(1, "sdpa") is None


def test_several_new_positions_each_see_none_after_them_under_eager():
    # The code predictor's prefill: two positions into an empty cache. Eager attention reads no
    # mask as attend-to-all, so it gets the causal part; sdpa and flash attention are causal
    # given none.
    cache = KVCache.empty(layers=1, rows=2, heads=HEADS, head_dim=HEAD_DIM, capacity=4, dtype=torch.float32, device="cpu")
    mask = cache.mask(2, "eager")
    assert mask is not None and mask.shape == (2, 1, 2, 2)
    hidden = mask[:, 0] == torch.finfo(torch.float32).min
    assert hidden.tolist() == [[[False, True], [False, False]]] * 2
    assert cache.mask(2, "sdpa") is None and cache.mask(2, "flash_attention_2") is None


def test_several_new_positions_of_padded_rows_hide_the_padding_and_what_follows():
    cache = padded_batch([3, 0], length=8)
    for attention in ("eager", "sdpa"):
        mask = cache.mask(2, attention)
        assert mask is not None and mask.shape == (2, 1, 2, 10)
        hidden = mask[:, 0] == torch.finfo(torch.float32).min
        assert hidden[0, 0].tolist() == [True] * 3 + [False] * 6 + [True]
        assert hidden[0, 1].tolist() == [True] * 3 + [False] * 7
        assert hidden[1, 0].tolist() == [False] * 9 + [True] and not hidden[1, 1].any()
