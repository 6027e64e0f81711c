"""A long prompt's prefill, a chunk of positions at a time, so that the turns already decoding
take their steps between its chunks and a cancel is seen between them: the Thinker's
(``ChunkedPrefill``) and the Talker's (``ChunkedTalkerPrefill``).

The prompt's embeddings are made once (for the Thinker: text, audio and images merged as its
own forward merges them; the Talker's prompt is embeddings already); then each ``advance()``
runs the stage's text model over the next ``chunk`` positions on the growing cache, with the
positions (and for the Thinker the DeepStack image features and the hidden states the Talker
needs) sliced to the chunk. Causal attention over the cache makes the result the whole
prompt's prefill, up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from pipeline.local.thinker_prompt import ThinkerPrompt

# Positions per chunk. A dev-model decoding step costs about what 64-128 prompt positions do;
# a 512-position chunk keeps the decoding turns' gap between steps a few steps long, and the
# real model's prefill on a GPU is already efficient at 512 (vLLM's chunked prefill defaults to
# budgets of 512-2048 tokens a step).
PREFILL_CHUNK_POSITIONS = 512


@dataclass
class PrefillOutput:
    """What the Thinker's whole-prompt forward gives the batch: the last position's output,
    the hidden states the Talker listens to (None unless asked for), the cache."""

    last_hidden: torch.Tensor  # [1, 1, hidden]
    hidden_states: tuple[torch.Tensor, ...] | None  # per recorded layer [1, T, hidden]
    cache: DynamicCache


class _Chunks:
    """What both stages' chunked prefills share: a prompt of ``length`` positions, prefilled
    ``chunk`` at a time on one growing cache by the stage's ``_forward``; ``advance()`` until done."""

    def __init__(self, rows: int, length: int, chunk: int) -> None:
        if rows != 1:
            raise ValueError("a chunked prefill takes one prompt")
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {chunk}")
        self.length = length
        self._chunk = chunk
        self._done = 0
        self._cache = DynamicCache()
        self._last_hidden: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self._done >= self.length

    def advance(self) -> bool:
        """Prefill the next chunk; True once the whole prompt is in the cache."""
        start, end = self._done, min(self._done + self._chunk, self.length)
        with torch.inference_mode():
            last_hidden_state = self._forward(start, end)
        self._last_hidden = last_hidden_state[:, -1:]
        self._done = end
        return self.done

    def output(self) -> PrefillOutput:
        if not self.done or self._last_hidden is None:
            raise RuntimeError("the prefill is not over")
        return PrefillOutput(self._last_hidden, self._hidden_states(), self._cache)

    def _forward(self, start: int, end: int) -> torch.Tensor:
        """The stage's text model over positions ``start:end`` on the cache: its last hidden state."""
        raise NotImplementedError

    def _hidden_states(self) -> tuple[torch.Tensor, ...] | None:
        return None


class ChunkedPrefill(_Chunks):
    """One prompt's Thinker prefill in chunks of ``chunk`` positions; ``advance()`` until done."""

    def __init__(self, thinker, prompt: ThinkerPrompt, *, keep_hidden: bool, chunk: int = PREFILL_CHUNK_POSITIONS) -> None:
        super().__init__(prompt.input_ids.shape[0], int(prompt.input_ids.shape[1]), chunk)
        self.prompt = prompt
        self._thinker = thinker
        self._keep_hidden = keep_hidden
        self._hidden: list[tuple[torch.Tensor, ...]] = []
        with torch.inference_mode():
            self._embeds, self._visual_mask, self._deepstack = _merged_embeddings(thinker, prompt)

    def _forward(self, start: int, end: int) -> torch.Tensor:
        deepstack = visual_mask = None
        if self._visual_mask is not None and self._deepstack is not None:
            before = int(self._visual_mask[:, :start].sum())
            inside = int(self._visual_mask[:, start:end].sum())
            if inside:
                visual_mask = self._visual_mask[:, start:end]
                deepstack = [features[before : before + inside] for features in self._deepstack]
        output = self._thinker.model.language_model(
            inputs_embeds=self._embeds[:, start:end],
            attention_mask=self.prompt.attention_mask[:, :end],
            position_ids=self.prompt.position_ids[:, :, start:end],
            cache=self._cache,
            use_cache=True,
            output_hidden_states=self._keep_hidden,
            output_router_logits=False,
            visual_pos_masks=visual_mask,
            deepstack_visual_embeds=deepstack,
        )
        if self._keep_hidden:
            self._hidden.append(output.hidden_states)
        return output.last_hidden_state

    def _hidden_states(self) -> tuple[torch.Tensor, ...] | None:
        if not self._keep_hidden:
            return None
        return tuple(torch.cat(layer, dim=1) for layer in zip(*self._hidden))


class ChunkedTalkerPrefill(_Chunks):
    """One turn's Talker prompt (``embeds`` [1, T, hidden], ``positions`` [4, 1, T], built as
    generate() builds them) prefilled in chunks of ``chunk`` positions; ``advance()`` until done.
    ``output()``'s ``last_hidden`` is the last layer's output at the last position, what the codec
    head and the code predictor read."""

    def __init__(self, talker, embeds: torch.Tensor, positions: torch.Tensor, *, chunk: int = PREFILL_CHUNK_POSITIONS) -> None:
        super().__init__(embeds.shape[0], int(embeds.shape[1]), chunk)
        self._talker = talker
        self.embeds = embeds
        self.positions = positions
        self._attention_mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)

    def _forward(self, start: int, end: int) -> torch.Tensor:
        # The Talker's text model, not its forward: that one scores every position with the
        # codec head, and a one-position chunk would pass for a decoding step there.
        output = self._talker.model(
            inputs_embeds=self.embeds[:, start:end],
            attention_mask=self._attention_mask[:, :end],
            position_ids=self.positions[:, :, start:end],
            cache=self._cache,
            use_cache=True,
        )
        return output.last_hidden_state


def _merged_embeddings(thinker, prompt: ThinkerPrompt) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor] | None]:
    """The prompt's input embeddings with its audio and images merged in, as the Thinker's forward
    merges them; the image positions and their DeepStack features (None without images)."""
    model, config = thinker.model, thinker.config
    ids = prompt.input_ids
    embeds = model.get_input_embeddings()(ids)
    if prompt.input_features is not None and prompt.feature_attention_mask is not None:
        audio = model.get_audio_features(prompt.input_features.to(thinker.dtype), prompt.feature_attention_mask,
                                         return_dict=True).last_hidden_state
        audio_mask = (ids == config.audio_token_id)[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(audio_mask, audio.to(embeds.device, embeds.dtype))
    if prompt.pixel_values is None or prompt.image_grid_thw is None:
        return embeds, None, None
    images = model.get_image_features(prompt.pixel_values.to(thinker.dtype), prompt.image_grid_thw, return_dict=True)
    image_mask = ids == config.image_token_id
    image_embeds = torch.cat(images.pooler_output, dim=0).to(embeds.device, embeds.dtype)
    embeds = embeds.masked_scatter(image_mask[..., None].expand_as(embeds), image_embeds)
    return embeds, image_mask, [torch.cat(features, dim=0) for features in images.deepstack_features]
