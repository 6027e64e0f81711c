"""The decoder stacks as a decoding step calls them: layers with a ``KVCache``, and the Talker's
modules with the code predictor's 15 passes per codec frame."""

from __future__ import annotations

from typing import NamedTuple

import torch

from pipeline.local.kv_cache import KVCache
from pipeline.local.sampling import Sampler, choose_rows


class ResidualCodes(NamedTuple):
    """A frame's 15 residual codes ([rows, 15]) and their embeddings ([rows, 15, hidden])."""

    codes: torch.Tensor
    embeds: torch.Tensor


class DecoderStack:
    """One stage's decoder layers called directly for decoding steps, with a ``KVCache``.

    ``model.forward`` would rebuild the causal mask, the cache bookkeeping and output records
    every step; a step needs only rotary embeddings, the layers and the final norm.
    """

    def __init__(self, text_model) -> None:
        self.layers = list(text_model.layers)
        self.norm = text_model.norm
        self.rotary = text_model.rotary_emb
        self.attention = text_model.config._attn_implementation

    def __call__(
        self,
        hidden: torch.Tensor,
        cache: KVCache,
        *,
        positions: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[rows, n, hidden] inputs -> [rows, n, hidden] normed outputs; ``cache`` advances by n."""
        if position_embeddings is None:
            position_embeddings = self.rotary(hidden, positions)
        mask = cache.mask(hidden.shape[1], self.attention)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, cache=cache, position_embeddings=position_embeddings)
        cache.advance(hidden.shape[1])
        return self.norm(hidden)


class TalkerDecoder:
    """The Talker's modules as a decoding step calls them: its decoder stack and the code
    predictor that completes each frame."""

    def __init__(self, talker) -> None:
        """``talker``: the model's ``Qwen3OmniMoeTalkerForConditionalGeneration`` (``model.talker``)."""
        self.talker = talker
        self.stack = DecoderStack(talker.model)
        predictor = talker.code_predictor
        self._predictor_stack = DecoderStack(predictor.model)
        self._predictor_heads = list(predictor.lm_head)
        self._predictor_embeddings = list(predictor.model.codec_embedding)
        self.num_code_groups: int = talker.config.num_code_groups
        self._predictor_caches: dict[int, KVCache] = {}
        self._predictor_rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def residual_codes(
        self, samplers: list[Sampler], hidden: torch.Tensor, last_code_embed: torch.Tensor
    ) -> ResidualCodes:
        """The code predictor's 15 residual codes and their embeddings, for every row.

        What generate()'s ``code_predictor.generate(...)`` computes, as a plain loop over the
        decoder layers with one reused cache: a two-position prefill (last Talker hidden state,
        first-layer code), then one code per step, code ``k`` embedded by embedding table
        ``k - 1`` and scored by head ``k``. All rows have the same length: no padding.
        """
        cache, (cos, sin) = self._predictor_cache(len(samplers), hidden)
        groups = self.num_code_groups
        # One uniform per residual code and sampling row, drawn up front from each turn's
        # generator (a greedy row draws none, as alone).
        uniforms = None
        if any(sampler.do_sample for sampler in samplers):
            uniforms = torch.stack(
                [
                    sampler.uniforms(groups - 1, hidden.device) if sampler.do_sample else hidden.new_zeros(groups - 1)
                    for sampler in samplers
                ]
            )
        output = self._predictor_stack(
            torch.cat((hidden, last_code_embed), dim=1), cache, position_embeddings=(cos[:, :2], sin[:, :2])
        )
        codes, embeds = [], []
        for group in range(1, groups):
            logits = self._predictor_heads[group - 1](output[:, -1]).float()
            code = choose_rows(samplers, logits, None if uniforms is None else uniforms[:, group - 1])
            embed = self._predictor_embeddings[group - 1](code)
            codes.append(code)
            embeds.append(embed)
            if group < groups - 1:
                position = (cos[:, group + 1 : group + 2], sin[:, group + 1 : group + 2])
                output = self._predictor_stack(embed, cache, position_embeddings=position)
        return ResidualCodes(codes=torch.cat(codes, dim=-1), embeds=torch.cat(embeds, dim=1))

    def _predictor_cache(self, rows: int, like: torch.Tensor) -> tuple[KVCache, tuple[torch.Tensor, torch.Tensor]]:
        """One cache per batch size, reused every frame; the rotary table for its 16 positions, computed once."""
        if self._predictor_rope is None:
            positions = torch.arange(self.num_code_groups + 1, device=like.device)[None]
            self._predictor_rope = self._predictor_stack.rotary(like, positions)
        cache = self._predictor_caches.get(rows)
        if cache is None:
            attention = self._predictor_stack.layers[0].self_attn
            config = self.talker.code_predictor.config
            cache = KVCache.empty(
                layers=len(self._predictor_stack.layers),
                rows=rows,
                heads=config.num_key_value_heads,
                head_dim=attention.head_dim,
                capacity=self.num_code_groups + 1,
                dtype=like.dtype,
                device=like.device,
            )
            self._predictor_caches[rows] = cache
        cache.reset()
        return cache, self._predictor_rope
