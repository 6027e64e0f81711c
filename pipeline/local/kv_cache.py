"""Left-padded key/value caches that many turns decode in together (``DecodeBatch``)."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.utils.generic import is_flash_attention_requested

# Slots allocated beyond a cache's length when rows join or leave: 64 steps before it grows.
CACHE_HEADROOM = 64


class KVCache:
    """Keys and values of one decoder stack for a batch of rows, as the attention layers use them.

    The layers call ``update(keys, values, layer_idx)`` and attend over what it returns. Rows
    are left-padded: row ``r`` holds its entries in slots ``[pad[r], length)``, so every row's
    newest entry sits in the same slot and one forward serves all rows; ``mask`` hides the
    padding. Storage grows by doubling, so a decoding step writes one slot instead of copying
    the whole cache as ``DynamicCache``'s ``torch.cat`` does.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], pads: list[int], length: int) -> None:
        self._keys = keys  # per layer [rows, kv heads, capacity, head dim]
        self._values = values
        self.pads = pads
        self.length = length
        self._pad_tensor = torch.tensor(pads, device=keys[0].device) if any(pads) else None
        self._dtype = keys[0].dtype

    @classmethod
    def of(cls, cache: DynamicCache, pads: list[int] | None = None) -> KVCache:
        """Take over a prefill's ``DynamicCache``, its rows left-padded by ``pads``."""
        keys: list[torch.Tensor] = [layer.keys for layer in cache.layers]  # type: ignore[union-attr,misc]
        values: list[torch.Tensor] = [layer.values for layer in cache.layers]  # type: ignore[union-attr,misc]
        pads = pads or [0] * keys[0].shape[0]
        # A padding slot's entries are never attended to, but a fully masked query can leave
        # NaN there, and 0 x NaN is NaN in the attention's product: zero them.
        for row, pad in enumerate(pads):
            for tensor in (*keys, *values):
                tensor[row, :, :pad] = 0
        return cls(keys, values, pads, keys[0].shape[2])

    @classmethod
    def empty(cls, *, layers: int, rows: int, heads: int, head_dim: int, capacity: int, dtype, device) -> KVCache:
        shape = (rows, heads, capacity, head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        return cls(keys, values, [0] * rows, 0)

    @property
    def rows(self) -> int:
        return len(self.pads)

    def reset(self) -> None:
        """Forget every entry, keep the storage (the code predictor starts each frame afresh)."""
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        end = self.length + key_states.shape[2]
        if end > self._keys[layer_idx].shape[2]:
            self._grow(end)
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        keys[:, :, self.length : end] = key_states
        values[:, :, self.length : end] = value_states
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, steps: int) -> None:
        """The forward that wrote ``steps`` new slots in every layer is over."""
        self.length += steps

    def mask(self, steps: int = 1, attention: str | None = "sdpa") -> torch.Tensor | None:
        """The mask for ``steps`` new positions (a decoding step: one; the code predictor's
        prefill: two): each hides its row's padding and the new positions after it, in the form
        the layers' ``attention`` implementation takes; None where there is nothing to hide.

        - eager and sdpa: [rows, 1, steps, length + steps], 0 where a position attends and the
          dtype's minimum elsewhere (additive, as eager attention needs it; sdpa takes it too).
          Without padding sdpa gets None, which it treats as causal for several positions
          (``is_causal``, as transformers' own mask builder leaves it); eager treats None as
          attend-to-all, so it always gets the causal part;
        - flash attention: [rows, length + steps], 1 where a row attends and 0 over its padding,
          or None without padding (flash attention is causal by itself): transformers'
          ``_upad_input`` turns it into each row's ``cu_seqlens`` and keeps only the real slots
          (a 4-D mask there keeps exactly the padding slots).
        """
        slots = torch.arange(self.length + steps, device=self._keys[0].device)
        padding = None if self._pad_tensor is None else slots[None, :] < self._pad_tensor[:, None]
        if is_flash_attention_requested(requested_attention_implementation=attention):
            return None if padding is None else (~padding).to(torch.int32)
        if padding is None and (steps == 1 or attention == "sdpa"):
            return None
        # [steps, slots]: new position i sits in slot length + i and sees no later slot.
        later = slots[None, :] > (self.length + torch.arange(steps, device=slots.device))[:, None]
        hidden = later[None] if padding is None else later[None] | padding[:, None, :]
        hidden = hidden.expand(self.rows, -1, -1)
        mask = torch.zeros(hidden.shape, dtype=self._dtype, device=hidden.device)
        return mask.masked_fill(hidden, torch.finfo(self._dtype).min)[:, None]

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self._keys[0].shape[2])
        for store in (self._keys, self._values):
            for layer, old in enumerate(store):
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, : self.length] = old[:, :, : self.length]
                store[layer] = new

    def joined(self, other: KVCache) -> KVCache:
        """This cache's rows, then ``other``'s, right-aligned on a common length."""
        length = max(self.length, other.length)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        pads: list[int] = []
        for cache in (self, other):
            shift = length - cache.length
            pads += [pad + shift for pad in cache.pads]
        for layer in range(len(self._keys)):
            for store, source in ((keys, "_keys"), (values, "_values")):
                mine, theirs = getattr(self, source)[layer], getattr(other, source)[layer]
                new = mine.new_zeros((self.rows + other.rows, mine.shape[1], length + CACHE_HEADROOM, mine.shape[3]))
                new[: self.rows, :, length - self.length : length] = mine[:, :, : self.length]
                new[self.rows :, :, length - other.length : length] = theirs[:, :, : other.length]
                store.append(new)
        return KVCache(keys, values, pads, length)

    def kept(self, rows: list[int]) -> KVCache:
        """Only ``rows`` (in that order), without the padding they all share: memory is released."""
        pads = [self.pads[row] for row in rows]
        trim = min(pads)
        index = torch.tensor(rows, device=self._keys[0].device)
        length = self.length - trim

        def select(tensor: torch.Tensor) -> torch.Tensor:
            new = tensor.new_zeros((len(rows), tensor.shape[1], length + CACHE_HEADROOM, tensor.shape[3]))
            new[:, :, :length] = tensor.index_select(0, index)[:, :, trim : self.length]
            return new

        keys = [select(tensor) for tensor in self._keys]
        values = [select(tensor) for tensor in self._values]
        return KVCache(keys, values, [pad - trim for pad in pads], length)

    def nbytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in (*self._keys, *self._values))

