"""One Qwen3-Omni turn as a stream: text as the Thinker writes it, audio long before it has finished.

``Qwen3OmniMoeForConditionalGeneration.generate()`` runs its three stages one after the other:
the Thinker writes the whole answer, then the Talker turns it into codec frames, then Code2Wav
decodes every frame at once. The first sound therefore comes after the whole turn's compute.
``stream_turn`` interleaves the same computations:

1. Thinker prefill (prompt and audio features), which samples the first answer token.
2. Talker prefill, as soon as that token exists. The Talker's prompt is what ``generate()``
   builds: the user segments (text embeddings, and Thinker hidden states at
   ``accept_hidden_layer`` for audio), then the assistant preamble with the speaker and the
   first answer token.
3. Lockstep decoding: each Thinker step samples answer token ``k + 1``; the Talker's step ``j``
   adds the projected embedding of answer token ``j + 1`` (its "trailing text") to the codec
   frame it feeds back, so step ``j`` runs as soon as token ``j + 1`` exists and never ahead of
   it. Like ``generate()``, the answer's last token (``<|im_end|>``, or the token at which
   ``max_output_tokens`` cut it) is replaced by ``<tts_eos>``, and once the text is used up the
   Talker continues on ``<tts_pad>`` until it samples codec EOS (or reaches ``max_audio_frames``).
4. After ``first_chunk_frames`` frames, then whenever a chunk is due (its size adapts to how
   far the audio is ahead of the listener, see ``_AudioChunker``), Code2Wav decodes the new
   frames with ``left_context_frames`` frames of left context and the audio is yielded at once.

Positions, caches, processors and the code predictor mirror ``generate()``, so with greedy
decoding in both stages the stream produces the same tokens and codec frames as
``generate()``: streaming changes when things happen, not what is computed. Sampled turns draw
from the same distributions with each turn's own generator (other random numbers than
``generate()``'s). Decoding steps call the decoder layers directly (``_DecoderStack``) with
left-padded caches (``_KVCache``) so that any number of turns decode together
(``DecodeBatch``); a turn alone is a batch of one.

Code2Wav's upsampling blocks each look one step ahead (a transposed convolution whose last
output needs the next input), so decoding frames ``[a, b)`` yields correct audio only up to a
fixed number of samples before ``b * 1920``. Each chunk therefore emits exactly the samples
that are final, starting where the previous chunk stopped; the chunks concatenate gap-free to
the length of one decode of all frames. With left context at least Code2Wav's attention
window (72 frames in the real model) the chunks equal that decode; with the default 25 frames
(vllm-omni's choice) they differ slightly (tests/pipeline/test_generation.py states how much).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from media.rates import VOICE_RATE
from pipeline.prompt import ThinkerInputs
from pipeline.turn import VOICES, AudioChunk, FinishReason, TextDelta, TurnDone, TurnEvent, Usage

# max_output_tokens=None ("inf" in the protocol) still needs a bound; 4096 is the protocol's
# largest numeric value.
UNBOUNDED_OUTPUT_TOKENS = 4096
# generate()'s talker_max_new_tokens: 4096 frames are 5.5 minutes of speech.
DEFAULT_MAX_AUDIO_FRAMES = 4096
# Qwen's recommended Thinker sampling (the Qwen3-Omni README's vLLM example: temperature 0.6,
# top_p 0.95, top_k 20, no repetition penalty), used for what the checkpoint's generation config
# does not name. docs/MODEL.md says why these and not vllm-omni's.
QWEN_THINKER_TEMPERATURE = 0.6
QWEN_THINKER_TOP_P = 0.95
QWEN_THINKER_TOP_K = 20
QWEN_THINKER_REPETITION_PENALTY = 1.0
# Qwen3's <think> and </think> (tests/pipeline/test_tokenizer.py checks the ids): an Instruct
# Thinker must never open a reasoning block that the Talker would then read aloud.
THINK_TOKEN_IDS = (151667, 151668)
# temperature <= 0 promises a reproducible turn; the Talker still samples (greedy codec frames
# degenerate), so an unseeded greedy turn seeds its sampling with this.
GREEDY_TURN_SEED = 0

# generate()'s talker sampling, used where the checkpoint's generation config names none.
_TALKER_SAMPLING_DEFAULTS = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}
# generate() suppresses the top 1024 talker ids (special codec tokens) except codec EOS.
_TALKER_SUPPRESSED_SPAN = 1024
# generate()'s code predictor sampling (the talker's prepare_inputs_for_generation).
_CODE_PREDICTOR_TOP_K = 50
_CODE_PREDICTOR_TOP_P = 0.8


@dataclass(frozen=True)
class GenerationParams:
    voice: str = "ethan"
    # None: the checkpoint's generation config, else Qwen's (thinker_sampling); <= 0: greedy.
    temperature: float | None = None
    max_output_tokens: int | None = None
    output_audio: bool = True
    seed: int | None = None
    first_chunk_frames: int = 4
    chunk_frames: int = 25
    left_context_frames: int = 25
    force_output_tokens: int | None = None  # benchmarks only: suppress EOS until N tokens
    # Extensions beyond the agreed fields (defaults keep the agreed behaviour):
    # a safety cap on codec frames per turn (the Talker normally ends with codec EOS first).
    max_audio_frames: int = DEFAULT_MAX_AUDIO_FRAMES
    # False: greedy codec frames and code predictor, as generate(talker_do_sample=False).
    talker_do_sample: bool = True
    # Chunks after the first sized by how far the audio is ahead of the listener (see
    # _AudioChunker); False: every later chunk holds chunk_frames.
    adaptive_chunks: bool = True

    def __post_init__(self) -> None:
        if self.voice.lower() not in VOICES:
            raise ValueError(f"unknown voice {self.voice!r}; expected one of {', '.join(VOICES)}")
        for name in ("max_output_tokens", "force_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 or None, got {value}")
        for name in ("first_chunk_frames", "chunk_frames", "max_audio_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        # A chunk's last samples need the next frame; the next chunk recomputes them from its
        # left context, so at least one frame of it is required.
        if self.left_context_frames < 1:
            raise ValueError(f"left_context_frames must be at least 1, got {self.left_context_frames}")


def stream_turn(
    model,
    tokenizer,
    inputs: ThinkerInputs,
    params: GenerationParams,
    should_stop: Callable[[], bool],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[TurnEvent]:
    """Run one turn, yielding TextDelta and AudioChunk as they are produced, then one TurnDone.

    ``should_stop`` is polled before every Thinker step, Talker step and Code2Wav chunk; when
    it returns true the turn ends at once with ``finish_reason="cancelled"``.

    Usage counts the answer's text tokens without the closing ``<|im_end|>`` and the codec
    frames produced. ``finish_reason`` describes the text: "stop" when the Thinker ended it,
    "length" when ``max_output_tokens`` did. ``clock`` times the adaptive chunk schedule.

    The turn runs as a ``DecodeBatch`` of one: alone or batched, a turn takes the same path.
    """
    batch: DecodeBatch[str] = DecodeBatch(model, tokenizer, clock=clock)
    if should_stop():
        yield batch.cancelled_before_start(inputs)
        return
    yield from _events(batch.prefill_thinker(_ALONE, inputs, params))
    if batch.wants_talker(_ALONE):
        if should_stop():
            yield batch.cancel(_ALONE)
            return
        batch.prefill_talker(_ALONE)
    while not batch.decoded(_ALONE):
        if batch.thinker_rows:
            if should_stop():
                yield batch.cancel(_ALONE)
                return
            yield from _events(batch.step_thinker())
        if batch.talker_rows:
            if should_stop():
                yield batch.cancel(_ALONE)
                return
            batch.step_talker()
        if batch.chunks_due():
            if should_stop():
                yield batch.cancel(_ALONE)
                return
            yield from _events(batch.decode_chunks())
    yield batch.finish(_ALONE)


_ALONE = "turn"


def _events(keyed: list[tuple[str, TurnEvent]]) -> Iterator[TurnEvent]:
    return (event for _, event in keyed)


@dataclass(frozen=True)
class ThinkerSampling:
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float


def thinker_sampling(generation_config, temperature: float | None) -> ThinkerSampling:
    """The Thinker's sampling for a turn whose request asks for ``temperature``.

    The request's temperature wins (the session's ``temperature``; <= 0 means greedy). Every
    other value comes from the checkpoint's generation config where it names one, else from
    Qwen's recommendation; a request without a temperature takes the checkpoint's (greedy
    when its config says ``do_sample: false``), else Qwen's.
    """

    def configured(name: str, recommended):
        value = getattr(generation_config, name, None)
        return recommended if value is None else value

    if temperature is None:
        temperature = configured("temperature", QWEN_THINKER_TEMPERATURE)
        if generation_config.do_sample is False:
            temperature = 0.0
    return ThinkerSampling(
        do_sample=temperature > 0,
        temperature=temperature,
        top_k=configured("top_k", QWEN_THINKER_TOP_K),
        top_p=configured("top_p", QWEN_THINKER_TOP_P),
        repetition_penalty=configured("repetition_penalty", QWEN_THINKER_REPETITION_PENALTY),
    )


def _sampling_processors(
    *,
    do_sample: bool,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    repetition_penalty: float | None,
    suppress_tokens: list[int] | None = None,
    device: torch.device,
) -> LogitsProcessorList:
    """The processors generate() builds for these settings, in generate()'s order."""
    processors = LogitsProcessorList()
    if repetition_penalty is not None and repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=repetition_penalty))
    if suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(suppress_tokens, device=str(device)))
    if do_sample:
        if temperature is not None and temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_k is not None and top_k != 0:
            processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
        if top_p is not None and top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return processors


class _SuppressTokens:
    """``SuppressTokensLogitsProcessor`` with its mask built once per vocabulary size (the
    original rebuilds it with ``torch.isin`` over the whole vocabulary every step)."""

    def __init__(self, suppress_tokens: torch.Tensor) -> None:
        self._tokens = suppress_tokens
        self._mask: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        if self._mask is None or self._mask.shape[-1] != scores.shape[-1]:
            vocab = torch.arange(scores.shape[-1], device=scores.device)
            self._mask = torch.isin(vocab, self._tokens.to(scores.device))
        return scores.masked_fill(self._mask, -float("inf"))


class _Sampler:
    """One turn's choice of a token from scores: its processors, then argmax or a draw.

    When the processors end in generate()'s warpers with a top-k (temperature, top-k, top-p,
    in that order), the draw is made among the top-k candidates only: the same distribution
    as generate()'s softmax and draw over the whole vocabulary, where everything outside the
    top k is -inf (ties at the k-th score aside), without sorting and drawing over 152k
    entries each step. The draw inverts the candidates' cumulative distribution at a uniform
    number from the turn's own generator, so turns in one batch draw together and each turn
    draws what it would alone. Other processors run as given, in order, before it.
    """

    def __init__(self, processors: LogitsProcessorList, *, do_sample: bool, generator: torch.Generator | None) -> None:
        self.do_sample = do_sample
        self._generator = generator
        self.temperature: float | None = None
        self.top_k: int | None = None
        self.top_p: float | None = None
        processors = LogitsProcessorList(
            _SuppressTokens(processor.suppress_tokens)
            if isinstance(processor, SuppressTokensLogitsProcessor)
            else processor
            for processor in processors
        )
        self._processors = processors
        tail = list(processors)
        top_p = tail.pop() if tail and isinstance(tail[-1], TopPLogitsWarper) else None
        top_k = tail.pop() if tail and isinstance(tail[-1], TopKLogitsWarper) else None
        temperature = tail.pop() if tail and isinstance(tail[-1], TemperatureLogitsWarper) else None
        if do_sample and top_k is not None:
            self._processors = LogitsProcessorList(tail)
            self.top_k = top_k.top_k
            self.top_p = None if top_p is None else top_p.top_p
            self.temperature = None if temperature is None else temperature.temperature

    @property
    def needs_context(self) -> bool:
        """Whether any processor reads the ids so far (a repetition penalty does)."""
        return len(self._processors) > 0

    @property
    def draws_top_k(self) -> bool:
        return self.do_sample and self.top_k is not None

    def process(self, context: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """[1, vocab] float32 scores through the processors that come before the draw."""
        return self._processors(context, scores) if len(self._processors) else scores  # type: ignore[arg-type]

    def uniforms(self, count: int, device: torch.device) -> torch.Tensor:
        """[count] uniform numbers in [0, 1) from this turn's generator."""
        return torch.rand(count, generator=self._generator, device=device)

    def draw_full(self, scores: torch.Tensor) -> torch.Tensor:
        """A draw over the whole vocabulary (processors without a top-k): [1, vocab] -> [1, 1]."""
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1, generator=self._generator)


def _choose_rows(samplers: list[_Sampler], scores: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, vocab] processed scores -> [rows, 1] ids, each row by its own sampler.

    Greedy rows take the argmax; rows that draw among a top-k with the same k and top-p are
    warped and drawn together, each at its own uniform number (``uniforms`` [rows], or one
    fresh from each row's generator).
    """
    if not any(sampler.do_sample for sampler in samplers):
        return torch.argmax(scores, dim=-1, keepdim=True)
    groups: dict[tuple[int, float | None] | None, list[int]] = {}
    for row, sampler in enumerate(samplers):
        key = (sampler.top_k, sampler.top_p) if sampler.top_k is not None and sampler.do_sample else None
        groups.setdefault(key, []).append(row)
    if len(groups) == 1:  # the common case: every row alike, no regrouping
        return _choose_group(samplers, list(range(len(samplers))), next(iter(groups)), scores, uniforms)
    chosen = torch.empty((len(samplers), 1), dtype=torch.long, device=scores.device)
    for key, rows in groups.items():
        index = torch.tensor(rows, device=scores.device)
        group_uniforms = None if uniforms is None else uniforms.index_select(0, index)
        picks = _choose_group(samplers, rows, key, scores.index_select(0, index), group_uniforms)
        chosen.index_copy_(0, index, picks)
    return chosen


def _choose_group(
    samplers: list[_Sampler],
    rows: list[int],
    key: tuple[int, float | None] | None,
    group: torch.Tensor,
    uniforms: torch.Tensor | None,
) -> torch.Tensor:
    """``_choose_rows`` for ``rows`` (of ``samplers``) that share ``key``; ``group`` holds their scores."""
    if key is None:
        return torch.cat(
            [
                samplers[row].draw_full(group[i : i + 1])
                if samplers[row].do_sample
                else group[i : i + 1].argmax(-1, keepdim=True)
                for i, row in enumerate(rows)
            ]
        )
    top_k, top_p = key
    temperatures = [samplers[row].temperature or 1.0 for row in rows]
    if any(temperature != 1.0 for temperature in temperatures):
        # Multiplied by the reciprocal, per row: the same bits for a row alone or batched
        # (a division by a scalar and by a tensor can round differently).
        inverse = torch.tensor([1.0 / t for t in temperatures], device=group.device, dtype=group.dtype)
        group = group * inverse[:, None]
    values, indices = torch.topk(group, min(top_k, group.shape[-1]), dim=-1)
    probs = torch.softmax(values, dim=-1)
    if top_p is not None:
        # TopPLogitsWarper drops a candidate when the candidates ranked below it hold at
        # most 1 - top_p of the probability, i.e. when those ranked above it hold top_p.
        drop = torch.cumsum(probs, dim=-1) - probs >= top_p
        drop[:, 0] = False
        probs = torch.softmax(values.masked_fill(drop, -float("inf")), dim=-1)
    if uniforms is None:
        draws = torch.cat([samplers[row].uniforms(1, group.device) for row in rows])
    else:
        draws = uniforms
    cumulative = torch.cumsum(probs, dim=-1)
    # Candidate j is drawn when cumulative[j - 1] <= u * total < cumulative[j]: never
    # one of probability 0 (dropped by top-p, sorted last), whatever rounding does.
    picks = (cumulative <= draws[:, None] * cumulative[:, -1:]).sum(dim=-1, keepdim=True)
    picks = torch.minimum(picks, (probs > 0).sum(dim=-1, keepdim=True) - 1)
    return indices.gather(-1, picks)


class _KVCache:
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
    def of(cls, cache: DynamicCache) -> _KVCache:
        """Take over a one-row ``DynamicCache`` (a prefill's)."""
        keys: list[torch.Tensor] = [layer.keys for layer in cache.layers]  # type: ignore[union-attr,misc]
        values: list[torch.Tensor] = [layer.values for layer in cache.layers]  # type: ignore[union-attr,misc]
        return cls(keys, values, [0] * keys[0].shape[0], keys[0].shape[2])

    @classmethod
    def empty(cls, *, layers: int, rows: int, heads: int, head_dim: int, capacity: int, dtype, device) -> _KVCache:
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

    def mask(self, steps: int = 1) -> torch.Tensor | None:
        """[rows, 1, 1, length + steps]: 0 where a row attends (one new position), the dtype's
        minimum over its padding; None without padding."""
        if self._pad_tensor is None:
            return None
        slots = torch.arange(self.length + steps, device=self._pad_tensor.device)
        padding = (slots[None, :] < self._pad_tensor[:, None])[:, None, None, :]
        # Additive, as eager attention needs it (sdpa takes it too); flash attention would need
        # a 2-D padding mask instead.
        mask = torch.zeros(padding.shape, dtype=self._dtype, device=padding.device)
        return mask.masked_fill(padding, torch.finfo(self._dtype).min)

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self._keys[0].shape[2])
        for store in (self._keys, self._values):
            for layer, old in enumerate(store):
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, : self.length] = old[:, :, : self.length]
                store[layer] = new

    def joined(self, other: _KVCache) -> _KVCache:
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
                new = mine.new_zeros((self.rows + other.rows, mine.shape[1], length + _CACHE_HEADROOM, mine.shape[3]))
                new[: self.rows, :, length - self.length : length] = mine[:, :, : self.length]
                new[self.rows :, :, length - other.length : length] = theirs[:, :, : other.length]
                store.append(new)
        return _KVCache(keys, values, pads, length)

    def kept(self, rows: list[int]) -> _KVCache:
        """Only ``rows`` (in that order), without the padding they all share: memory is released."""
        pads = [self.pads[row] for row in rows]
        trim = min(pads)
        index = torch.tensor(rows, device=self._keys[0].device)
        length = self.length - trim

        def select(tensor: torch.Tensor) -> torch.Tensor:
            new = tensor.new_zeros((len(rows), tensor.shape[1], length + _CACHE_HEADROOM, tensor.shape[3]))
            new[:, :, :length] = tensor.index_select(0, index)[:, :, trim : self.length]
            return new

        keys = [select(tensor) for tensor in self._keys]
        values = [select(tensor) for tensor in self._values]
        return _KVCache(keys, values, [pad - trim for pad in pads], length)

    def nbytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in (*self._keys, *self._values))


# Slots allocated beyond a cache's length when rows join or leave: 64 steps before it grows.
_CACHE_HEADROOM = 64


class _DecoderStack:
    """One stage's decoder layers called directly for decoding steps, with a ``_KVCache``.

    ``model.forward`` would rebuild the causal mask, the cache bookkeeping and output records
    every step; a step needs only rotary embeddings, the layers and the final norm.
    """

    def __init__(self, text_model) -> None:
        self.layers = list(text_model.layers)
        self.norm = text_model.norm
        self.rotary = text_model.rotary_emb

    def __call__(
        self,
        hidden: torch.Tensor,
        cache: _KVCache,
        *,
        positions: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[rows, n, hidden] inputs -> [rows, n, hidden] normed outputs; ``cache`` advances by n."""
        if position_embeddings is None:
            position_embeddings = self.rotary(hidden, positions)
        mask = cache.mask(hidden.shape[1]) if hidden.shape[1] == 1 else None
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, cache=cache, position_embeddings=position_embeddings)
        cache.advance(hidden.shape[1])
        return self.norm(hidden)


class _ThinkerTurn:
    """One turn's Thinker bookkeeping: its tokens, sampling, and when its text ends."""

    def __init__(self, model, params: GenerationParams, generator: torch.Generator | None) -> None:
        generation_config = model.generation_config
        device = model.thinker.device
        stop_ids = {model.config.im_end_token_id}
        configured = generation_config.eos_token_id
        if configured is not None:
            stop_ids.update([configured] if isinstance(configured, int) else configured)
        self.stop_ids = frozenset(stop_ids)
        self._stop_tensor = torch.tensor(sorted(self.stop_ids), device=device)
        self._max_tokens = params.max_output_tokens or UNBOUNDED_OUTPUT_TOKENS
        self._force_tokens = params.force_output_tokens or 0
        sampling = thinker_sampling(generation_config, params.temperature)
        do_sample = sampling.do_sample
        processors = _sampling_processors(
            do_sample=do_sample,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            repetition_penalty=sampling.repetition_penalty,
            suppress_tokens=list(THINK_TOKEN_IDS),
            device=device,
        )
        self.sampler = _Sampler(processors, do_sample=do_sample, generator=generator)
        self.tokens: list[int] = []
        self.finish_reason: FinishReason = "stop"
        self.finished = False
        # Prompt and answer ids, for the repetition penalty (the prompt is set by the prefill).
        self.sequence = torch.empty((1, 0), dtype=torch.long, device=device)

    @property
    def answer_tokens(self) -> int:
        """Answer tokens generated so far, not counting a closing stop token."""
        if self.tokens and self.tokens[-1] in self.stop_ids:
            return len(self.tokens) - 1
        return len(self.tokens)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[1, vocab] logits of the last position -> scores ready for the draw."""
        scores = logits.to(dtype=torch.float32, copy=True)
        if len(self.tokens) < self._force_tokens:
            scores[:, self._stop_tensor] = -float("inf")
        return self.sampler.process(self.sequence, scores)

    def accept(self, token: torch.Tensor) -> None:
        """The [1, 1] token drawn from ``scores`` joins the context the processors read."""
        if self.sampler.needs_context:
            self.sequence = torch.cat([self.sequence, token], dim=-1)

    def record(self, token_id: int) -> None:
        self.tokens.append(token_id)
        if token_id in self.stop_ids:
            self.finished, self.finish_reason = True, "stop"
        elif len(self.tokens) >= self._max_tokens:
            self.finished, self.finish_reason = True, "length"


class _TalkerTurn:
    """One turn's Talker bookkeeping: the text it is fed, its codes, sampling, and when it ends.

    Talker step ``j`` completes frame ``j`` (the code predictor adds the 15 residual codes to
    the last sampled first-layer code) and samples the next first-layer code from the frame
    plus trailing text entry ``j``: answer token ``j + 1``, or ``<tts_eos>`` for the answer's
    last token, then ``<tts_pad>`` once the text is used up.
    """

    def __init__(self, model, params: GenerationParams, generator: torch.Generator | None) -> None:
        talker_config = model.config.talker_config
        device = model.talker.device
        self._codec_eos = talker_config.codec_eos_token_id
        self._max_frames = params.max_audio_frames
        do_sample = params.talker_do_sample
        generation_config = model.generation_config
        sampling: dict[str, Any] = {}
        for name, default in _TALKER_SAMPLING_DEFAULTS.items():
            configured = getattr(generation_config, f"talker_{name}", None)
            sampling[name] = default if configured is None else configured
        vocab_size = talker_config.text_config.vocab_size
        processors = _sampling_processors(
            do_sample=do_sample,
            suppress_tokens=[
                i for i in range(vocab_size - _TALKER_SUPPRESSED_SPAN, vocab_size) if i != self._codec_eos
            ],
            device=device,
            **sampling,
        )
        self.sampler = _Sampler(processors, do_sample=do_sample, generator=generator)
        # generate() samples the code predictor with top-k 50 / top-p 0.8 whenever the talker samples.
        self.predictor_sampler = _Sampler(
            _sampling_processors(
                do_sample=do_sample,
                temperature=None,
                top_k=_CODE_PREDICTOR_TOP_K,
                top_p=_CODE_PREDICTOR_TOP_P,
                repetition_penalty=None,
                device=device,
            ),
            do_sample=do_sample,
            generator=generator,
        )
        # Benchmarks force long answers from random weights; keep the Talker from stopping
        # before it has spoken them (until it has consumed the <tts_eos> entry).
        self._hold_eos = params.force_output_tokens is not None
        self.trailing: list[torch.Tensor] = []
        self.text_done = False
        self.generated = torch.empty((1, 0), dtype=torch.long, device=device)
        self.frames = 0
        self.finished = False

    def scores(self, logits: torch.Tensor, *, consumed_through: int) -> torch.Tensor:
        """[1, vocab] logits after trailing entry ``consumed_through`` -> scores ready for the draw."""
        scores = logits.to(dtype=torch.float32, copy=True)
        text_pending = not self.text_done or consumed_through < len(self.trailing) - 1
        if self._hold_eos and text_pending:
            scores[:, self._codec_eos] = -float("inf")
        return self.sampler.process(self.generated, scores)

    def accept(self, code: torch.Tensor) -> None:
        """The [1, 1] first-layer code drawn from ``scores``."""
        self.generated = torch.cat([self.generated, code], dim=-1)

    def frame_done(self) -> bool:
        """Count a completed frame; true when it is the last one allowed."""
        self.frames += 1
        if self.frames >= self._max_frames:
            self.finished = True
        return self.finished

    def absorb_code(self, code_id: int) -> None:
        if code_id == self._codec_eos:
            self.finished = True


# What a DecodeBatch knows its turns by (the engine process: turn ids).
TurnKey = TypeVar("TurnKey", bound=Hashable)


@dataclass
class _Speech:
    talker: _TalkerTurn
    audio: _AudioChunker


@dataclass
class _Rows(Generic[TurnKey]):
    """One stage's batched decoding state: row ``r`` is ``turns[r]``."""

    turns: list[_Turn[TurnKey]]
    cache: _KVCache
    positions: torch.Tensor  # [3, rows, 1] multimodal RoPE positions of the last fed entry
    last: torch.Tensor  # [rows, 1] last sampled id (answer token or first-layer code)
    hidden: torch.Tensor  # [rows, 1, hidden] last layer's output at the last position

    def joined(self, other: _Rows[TurnKey]) -> _Rows[TurnKey]:
        return _Rows(
            self.turns + other.turns,
            self.cache.joined(other.cache),
            torch.cat([self.positions, other.positions], dim=1),
            torch.cat([self.last, other.last], dim=0),
            torch.cat([self.hidden, other.hidden], dim=0),
        )

    def kept(self, keep: list[int]) -> _Rows[TurnKey] | None:
        """Only rows ``keep`` (None when none is left)."""
        if not keep:
            return None
        if len(keep) == len(self.turns):
            return self
        index = torch.tensor(keep, device=self.last.device)
        return _Rows(
            [self.turns[row] for row in keep],
            self.cache.kept(keep),
            self.positions.index_select(1, index),
            self.last.index_select(0, index),
            self.hidden.index_select(0, index),
        )


class _SpeechModel:
    """The Talker's modules as a decoding step calls them."""

    def __init__(self, model) -> None:
        self.talker = model.talker
        self.stack = _DecoderStack(self.talker.model)
        predictor = self.talker.code_predictor
        self.predictor_stack = _DecoderStack(predictor.model)
        self.predictor_heads = list(predictor.lm_head)
        self.predictor_embeddings = list(predictor.model.codec_embedding)
        self.num_code_groups: int = model.config.talker_config.num_code_groups
        self.predictor_caches: dict[int, _KVCache] = {}
        self.predictor_rope: tuple[torch.Tensor, torch.Tensor] | None = None


class _Turn(Generic[TurnKey]):
    """Everything a ``DecodeBatch`` keeps for one turn."""

    def __init__(self, key: TurnKey, model, tokenizer, inputs: ThinkerInputs, params: GenerationParams, clock) -> None:
        self.key = key
        self.inputs = inputs
        self.params = params
        seed = params.seed
        if seed is None and not thinker_sampling(model.generation_config, params.temperature).do_sample:
            seed = GREEDY_TURN_SEED
        device = model.thinker.device
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self.thinker = _ThinkerTurn(model, params, self.generator)
        self.text = _TextStream(tokenizer)
        # Set by the Talker's prefill: the turn speaks.
        self.speech: _Speech | None = None
        # Set by the Thinker's prefill for the Talker's: the prompt's input embeddings (audio
        # merged in) and the hidden states at the layer the Talker listens to.
        self.prompt_embeds: torch.Tensor | None = None
        self.prompt_hidden: torch.Tensor | None = None
        self.clock = clock

    @property
    def frames(self) -> int:
        return 0 if self.speech is None else self.speech.talker.frames

    def speaking(self) -> _Speech:
        """The Talker and chunker of a turn in the Talker's rows (which always has them)."""
        if self.speech is None:
            raise RuntimeError(f"turn {self.key!r} does not speak")
        return self.speech

    def done(self, finish_reason: FinishReason) -> TurnDone:
        usage = Usage(
            input_text_tokens=self.inputs.text_tokens,
            input_audio_tokens=self.inputs.audio_tokens,
            output_text_tokens=self.thinker.answer_tokens,
            output_audio_tokens=self.frames,
        )
        return TurnDone(text=self.text.text, usage=usage, finish_reason=finish_reason)

    def text_delta(self, token: int) -> str:
        """The text a new Thinker token releases; a stop token is never text, only the end of it."""
        delta = "" if token in self.thinker.stop_ids else self.text.push(token)
        if self.thinker.finished:
            delta += self.text.flush()
        return delta

    def voiced_tokens(self, frames: int) -> int:
        """Answer tokens spoken by the first ``frames`` frames (see ``AudioChunk.text_tokens_voiced``)."""
        spoken = len(self.thinker.tokens) - 1 if self.thinker.finished else len(self.thinker.tokens)
        return min(frames, spoken)


class DecodeBatch(Generic[TurnKey]):
    """Turns decoded together: one Thinker forward, one Talker forward and one code-predictor
    loop per step for every turn that needs it, and Code2Wav for the chunks that are due.

    A turn joins with ``prefill_thinker`` (and ``prefill_talker`` when it speaks), between
    steps; it leaves the Thinker's rows when its text ends and the Talker's when its audio
    does, and ``finish`` or ``cancel`` forget it. Each stage keeps one left-padded
    ``_KVCache`` for its rows, with each row's own (multimodal RoPE) positions: joining
    right-aligns the new turn's cache with the others, leaving drops its row and the padding
    no row needs any more. Sampling is per turn (its own settings, processors and seeded
    generator), so a turn's tokens do not depend on who else is in the batch; with greedy
    decoding a turn in a batch computes what it computes alone, up to float rounding of the
    batched matrix products.

    Keys are any hashable turn ids. Events come back as ``(key, event)`` pairs.
    """

    def __init__(self, model, tokenizer, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._clock = clock
        self._turns: dict[TurnKey, _Turn[TurnKey]] = {}
        thinker_text = model.thinker.model.language_model
        self._thinker_stack = _DecoderStack(thinker_text)
        self._thinker_embed = thinker_text.embed_tokens
        self._thinker_head = model.thinker.lm_head
        self._thinking: _Rows[TurnKey] | None = None
        self._speaking: _Rows[TurnKey] | None = None
        # None: a checkpoint loaded without audio output (text-only turns).
        self._speech_model = _SpeechModel(model) if getattr(model, "talker", None) is not None else None
        self._tts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def thinker_rows(self) -> list[_Turn[TurnKey]]:
        """Turns whose text goes on, in row order."""
        return [] if self._thinking is None else self._thinking.turns

    @property
    def talker_rows(self) -> list[_Turn[TurnKey]]:
        """Turns whose audio goes on, in row order."""
        return [] if self._speaking is None else self._speaking.turns

    def _speech(self) -> _SpeechModel:
        if self._speech_model is None:
            raise ValueError("this model was loaded without its Talker: ask for text only")
        return self._speech_model

    # -- joining --------------------------------------------------------------------------

    def cancelled_before_start(self, inputs: ThinkerInputs) -> TurnDone:
        usage = Usage(
            input_text_tokens=inputs.text_tokens, input_audio_tokens=inputs.audio_tokens, output_text_tokens=0
        )
        return TurnDone(text="", usage=usage, finish_reason="cancelled")

    def prefill_thinker(
        self, key: TurnKey, inputs: ThinkerInputs, params: GenerationParams
    ) -> list[tuple[TurnKey, TurnEvent]]:
        """Run the Thinker's prefill for a new turn, which samples its first answer token."""
        if key in self._turns:
            raise ValueError(f"turn {key!r} is already in the batch")
        turn = _Turn(key, self._model, self._tokenizer, inputs, params, self._clock)
        thinker = self._model.thinker
        device = thinker.device
        input_ids = inputs.input_ids.to(device)
        attention_mask = inputs.attention_mask.to(device)
        model_kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        forward_kwargs = {}
        if inputs.input_features is not None and inputs.feature_attention_mask is not None:
            feature_attention_mask = inputs.feature_attention_mask.to(device)
            model_kwargs["feature_attention_mask"] = feature_attention_mask
            forward_kwargs["input_features"] = inputs.input_features.to(device, thinker.dtype)
            forward_kwargs["feature_attention_mask"] = feature_attention_mask
        keep_hidden = params.output_audio
        with torch.inference_mode():
            # [4, 1, T]: text positions, then the three multimodal-RoPE rows (sets rope_deltas).
            position_ids = thinker._prepare_position_ids_for_generation(input_ids, model_kwargs)
            # The Thinker's model, then its head on the last position only: thinker(...) would
            # score every prompt position against the 152k vocabulary (150 of the 160 ms a
            # dev-model prefill took).
            output = thinker.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=keep_hidden,
                output_router_logits=False,
                use_audio_in_video=False,
                **forward_kwargs,
            )
            last_hidden = output.last_hidden_state[:, -1:]
            logits = thinker.lm_head(last_hidden)
            if keep_hidden:
                turn.prompt_embeds = output.hidden_states[0]
                turn.prompt_hidden = output.hidden_states[self._model.config.talker_config.accept_hidden_layer]
            turn.thinker.sequence = input_ids
            token = _choose_rows([turn.thinker.sampler], turn.thinker.scores(logits[:, -1, :]))
            turn.thinker.accept(token)
        token_id = int(token.item())
        turn.thinker.record(token_id)
        self._turns[key] = turn
        if not turn.thinker.finished:
            joining = _Rows([turn], _KVCache.of(output.cache), position_ids[-3:, :, -1:], token, last_hidden)
            self._thinking = joining if self._thinking is None else self._thinking.joined(joining)
        events: list[tuple[TurnKey, TurnEvent]] = []
        if delta := turn.text_delta(token_id):
            events.append((key, TextDelta(delta)))
        return events

    def wants_talker(self, key: TurnKey) -> bool:
        """An answer of one token is only its end marker (or one token cut short): nothing to
        speak, and generate() cannot build a Talker prompt for it either."""
        turn = self._turns[key]
        return turn.params.output_audio and not turn.thinker.finished

    def prefill_talker(self, key: TurnKey) -> None:
        """Build the turn's Talker prompt as generate() does and prefill it; the turn joins the Talker's rows."""
        turn = self._turns[key]
        model, talker = self._model, self._speech().talker
        config = model.config
        talker_config = config.talker_config
        speaker_id = talker_config.speaker_id.get(turn.params.voice.lower())
        if speaker_id is None:
            raise ValueError(f"the checkpoint has no speaker {turn.params.voice!r}")
        speech = turn.speech = _Speech(
            _TalkerTurn(model, turn.params, turn.generator), _AudioChunker(model.code2wav, turn.params, turn.clock)
        )
        tts_bos, tts_eos, tts_pad = self._tts_embeds()
        prompt_embeds, prompt_ids = self._talker_prompt(turn, speaker_id, tts_pad, tts_bos, tts_eos)
        device = talker.device
        attention_mask = torch.ones(prompt_ids.shape, dtype=torch.long, device=device)
        model_kwargs = {"attention_mask": attention_mask, "talker_input_ids": prompt_ids}
        if turn.inputs.feature_attention_mask is not None:
            model_kwargs["audio_feature_lengths"] = turn.inputs.feature_attention_mask.to(device).sum(dim=1)
        with torch.inference_mode():
            position_ids = talker._prepare_position_ids_for_generation(prompt_embeds, model_kwargs)
            output = talker(
                inputs_embeds=prompt_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=True,
            )
            # generate() feeds the code predictor the last layer's output at the last position.
            hidden = output.hidden_states[0][-1][:, -1:]
            code = _choose_rows(
                [speech.talker.sampler], speech.talker.scores(output.logits[:, -1, :], consumed_through=-1)
            )
            speech.talker.accept(code)
        speech.talker.absorb_code(int(code.item()))
        # Drop what only the prefill needed.
        turn.prompt_embeds = turn.prompt_hidden = None
        joining = _Rows([turn], _KVCache.of(output.cache), position_ids[-3:, :, -1:], code, hidden)
        self._speaking = joining if self._speaking is None else self._speaking.joined(joining)

    def _tts_embeds(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """<tts_bos>, <tts_eos>, <tts_pad> in the Talker's input space ([1, 1, hidden] each), computed once."""
        if self._tts is None:
            config = self._model.config
            with torch.inference_mode():
                tts_tokens = torch.tensor(
                    [[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]],
                    device=self._model.thinker.device,
                )
                talker = self._speech().talker
                embeds = talker.text_projection(self._thinker_embed(tts_tokens)).to(talker.device)
            self._tts = tuple(embeds.chunk(3, dim=1))
        return self._tts

    def _talker_prompt(self, turn: _Turn[TurnKey], speaker_id, tts_pad, tts_bos, tts_eos):
        """The Talker's prompt exactly as generate() builds it (batch of one, no padding)."""
        model = self._model
        config = model.config
        device = self._speech().talker.device
        input_ids = turn.inputs.input_ids.to(device)
        length = input_ids.shape[1]
        thinker_config = config.thinker_config
        multimodal_mask = (
            (input_ids == thinker_config.audio_token_id)
            | (input_ids == thinker_config.image_token_id)
            | (input_ids == thinker_config.video_token_id)
        )
        if turn.prompt_embeds is None or turn.prompt_hidden is None:
            raise ValueError(f"turn {turn.key!r} was prefilled without audio output: it has no Talker prompt")
        prompt_embeds = turn.prompt_embeds.to(device)
        prompt_hidden = turn.prompt_hidden.to(device)
        with torch.inference_mode():
            # Every position whose segment (from the last <|im_start|>) is a user turn.
            positions = torch.arange(length, device=device).unsqueeze(0)
            im_starts = torch.where(input_ids == config.im_start_token_id, positions, positions.new_full((), -1))
            segment_start = torch.cummax(im_starts, dim=-1).values.clamp_min(0)
            roles = input_ids.gather(1, (segment_start + 1).clamp_max(length - 1))
            user_positions = torch.nonzero(roles[0] == config.user_token_id).flatten()
            user_embeds = model._get_talker_user_parts(0, length, multimodal_mask, prompt_hidden, prompt_embeds)
            user_embeds = user_embeds[:, user_positions]
            user_ids = input_ids[:, user_positions]

            assistant_starts = (input_ids[0, :-1] == config.im_start_token_id) & (
                input_ids[0, 1:] == config.assistant_token_id
            )
            starts = torch.nonzero(assistant_starts).flatten()
            if starts.numel() == 0:
                raise ValueError("the prompt has no '<|im_start|>assistant' for the Talker to speak from")
            assistant_start = int(starts[-1].item())
            # The assistant preamble ends with the first answer token's embedding.
            first = self._thinker_embed(torch.tensor([[turn.thinker.tokens[0]]], device=self._model.thinker.device))
            embeds = torch.cat([prompt_embeds, first.to(device)], dim=1)
            assistant_embeds, assistant_ids, _ = model._get_talker_assistant_parts(
                assistant_start, length + 1, speaker_id, embeds, tts_pad, tts_bos, tts_eos
            )
        return torch.cat([user_embeds, assistant_embeds], dim=1), torch.cat([user_ids, assistant_ids], dim=1)

    # -- leaving --------------------------------------------------------------------------

    def _drop(self, turn: _Turn[TurnKey]) -> None:
        if self._thinking is not None:
            self._thinking = self._thinking.kept(
                [row for row, other in enumerate(self._thinking.turns) if other is not turn]
            )
        if self._speaking is not None:
            self._speaking = self._speaking.kept(
                [row for row, other in enumerate(self._speaking.turns) if other is not turn]
            )
        del self._turns[turn.key]

    def cancel(self, key: TurnKey) -> TurnDone:
        """The turn leaves now, whatever it was doing; its ``TurnDone`` says "cancelled"."""
        turn = self._turns[key]
        self._drop(turn)
        return turn.done("cancelled")

    def finish(self, key: TurnKey) -> TurnDone:
        """The last event of a turn that is ``decoded``; the turn leaves the batch."""
        turn = self._turns[key]
        if not self._decoded(turn):
            raise ValueError(f"turn {key!r} is still decoding")
        self._drop(turn)
        return turn.done(turn.thinker.finish_reason)

    def decoded(self, key: TurnKey) -> bool:
        return self._decoded(self._turns[key])

    @staticmethod
    def _decoded(turn: _Turn) -> bool:
        """Text over, audio over (or never started) and every frame decoded into audio."""
        if not turn.thinker.finished:
            return False
        if turn.speech is None:
            return True
        return turn.speech.talker.finished and turn.speech.audio.pending_frames == 0

    def finished_keys(self) -> list[TurnKey]:
        return [key for key, turn in self._turns.items() if self._decoded(turn)]

    @property
    def keys(self) -> list[TurnKey]:
        return list(self._turns)

    def cache_bytes(self) -> int:
        """Key/value memory the batch holds for its rows (Thinker and Talker)."""
        return sum(rows.cache.nbytes() for rows in (self._thinking, self._speaking) if rows is not None)

    # -- decoding steps -------------------------------------------------------------------

    def step_thinker(self) -> list[tuple[TurnKey, TurnEvent]]:
        """One answer token for every turn whose text goes on; a turn whose text ends leaves these rows."""
        state = self._thinking
        if state is None:
            return []
        rows = state.turns
        with torch.inference_mode():
            state.positions = state.positions + 1
            hidden = self._thinker_stack(self._thinker_embed(state.last), state.cache, positions=state.positions)
            state.hidden = hidden[:, -1:]
            logits = self._thinker_head(hidden[:, -1])
            scores = torch.cat([turn.thinker.scores(logits[row : row + 1]) for row, turn in enumerate(rows)])
            state.last = _choose_rows([turn.thinker.sampler for turn in rows], scores)
            for row, turn in enumerate(rows):
                turn.thinker.accept(state.last[row : row + 1])
            token_ids = state.last[:, 0].tolist()
            for row, turn in enumerate(rows):
                turn.thinker.record(token_ids[row])
            # The Talker's trailing text: each new token projected, in one call for all rows.
            fed = [row for row, turn in enumerate(rows) if turn.speech is not None and not turn.thinker.finished]
            if fed:
                talker = self._speech().talker
                ids = state.last if len(fed) == len(rows) else state.last[fed]
                projected = talker.text_projection(self._thinker_embed(ids)).to(talker.device)
        events: list[tuple[TurnKey, TurnEvent]] = []
        keep = []
        for row, turn in enumerate(rows):
            if turn.speech is not None:
                if turn.thinker.finished:
                    turn.speech.talker.trailing.append(self._tts_embeds()[1])
                    turn.speech.talker.text_done = True
                else:
                    turn.speech.talker.trailing.append(projected[fed.index(row)].unsqueeze(0))
            if delta := turn.text_delta(token_ids[row]):
                events.append((turn.key, TextDelta(delta)))
            if not turn.thinker.finished:
                keep.append(row)
        self._thinking = state.kept(keep)
        return events

    def step_talker(self) -> None:
        """One codec frame for every speaking turn: the code predictor completes it, and the
        Talker samples the next first-layer code unless the frame was the turn's last."""
        state = self._speaking
        if state is None:
            return
        speech_model = self._speech()
        talker = speech_model.talker
        speeches = [turn.speaking() for turn in state.turns]
        with torch.inference_mode():
            last_code_embed = talker.get_input_embeddings()(state.last)
            residual_codes, residual_embeds = self._predict_residual_codes(
                speech_model, speeches, state.hidden, last_code_embed
            )
            frames = torch.cat((state.last, residual_codes), dim=-1)
        keep = []
        for row, speech in enumerate(speeches):
            speech.audio.push(frames[row])
            if not speech.talker.frame_done():
                keep.append(row)
        with torch.inference_mode():
            inputs_embeds = torch.cat([last_code_embed, residual_embeds], dim=1).sum(1, keepdim=True)
            tts_pad = self._tts_embeds()[2]
            text = [
                speech.talker.trailing[speech.talker.frames - 1]
                if speech.talker.frames - 1 < len(speech.talker.trailing)
                else tts_pad
                for speech in speeches
            ]
            inputs_embeds = inputs_embeds + torch.cat(text, dim=0)
            if len(keep) < len(speeches):
                inputs_embeds = inputs_embeds[keep]
            kept = state.kept(keep)
            if kept is None:
                self._speaking = None
                return
            state = kept
            speeches = [turn.speaking() for turn in state.turns]
            state.positions = state.positions + 1
            hidden = speech_model.stack(inputs_embeds, state.cache, positions=state.positions)
            state.hidden = hidden[:, -1:]
            logits = talker.codec_head(hidden[:, -1])
            scores = torch.cat(
                [
                    speech.talker.scores(logits[row : row + 1], consumed_through=speech.talker.frames - 1)
                    for row, speech in enumerate(speeches)
                ]
            )
            state.last = _choose_rows([speech.talker.sampler for speech in speeches], scores)
            for row, speech in enumerate(speeches):
                speech.talker.accept(state.last[row : row + 1])
            code_ids = state.last[:, 0].tolist()
        keep = []
        for row, speech in enumerate(speeches):
            speech.talker.absorb_code(code_ids[row])
            if not speech.talker.finished:
                keep.append(row)
        self._speaking = state.kept(keep)

    def _predict_residual_codes(
        self, speech_model: _SpeechModel, speeches: list[_Speech], hidden: torch.Tensor, last_code_embed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The code predictor's 15 residual codes ([rows, 15]) and their embeddings ([rows, 15, hidden]).

        What generate()'s ``code_predictor.generate(...)`` computes, as a plain loop over the
        decoder layers with one reused cache: a two-position prefill (last Talker hidden state,
        first-layer code), then one code per step, code ``k`` embedded by embedding table
        ``k - 1`` and scored by head ``k``. All rows have the same length: no padding.
        """
        cache, (cos, sin) = self._predictor_cache(speech_model, len(speeches), hidden)
        samplers = [speech.talker.predictor_sampler for speech in speeches]
        groups = speech_model.num_code_groups
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
        output = speech_model.predictor_stack(
            torch.cat((hidden, last_code_embed), dim=1), cache, position_embeddings=(cos[:, :2], sin[:, :2])
        )
        codes, embeds = [], []
        for group in range(1, groups):
            logits = speech_model.predictor_heads[group - 1](output[:, -1]).float()
            code = _choose_rows(samplers, logits, None if uniforms is None else uniforms[:, group - 1])
            embed = speech_model.predictor_embeddings[group - 1](code)
            codes.append(code)
            embeds.append(embed)
            if group < groups - 1:
                position = (cos[:, group + 1 : group + 2], sin[:, group + 1 : group + 2])
                output = speech_model.predictor_stack(embed, cache, position_embeddings=position)
        return torch.cat(codes, dim=-1), torch.cat(embeds, dim=1)

    def _predictor_cache(
        self, speech_model: _SpeechModel, rows: int, like: torch.Tensor
    ) -> tuple[_KVCache, tuple[torch.Tensor, torch.Tensor]]:
        """One cache per batch size, reused every frame; the rotary table for its 16 positions, computed once."""
        if speech_model.predictor_rope is None:
            positions = torch.arange(speech_model.num_code_groups + 1, device=like.device)[None]
            speech_model.predictor_rope = speech_model.predictor_stack.rotary(like, positions)
        cache = speech_model.predictor_caches.get(rows)
        if cache is None:
            attention = speech_model.predictor_stack.layers[0].self_attn
            config = speech_model.talker.code_predictor.config
            cache = _KVCache.empty(
                layers=len(speech_model.predictor_stack.layers),
                rows=rows,
                heads=config.num_key_value_heads,
                head_dim=attention.head_dim,
                capacity=speech_model.num_code_groups + 1,
                dtype=like.dtype,
                device=like.device,
            )
            speech_model.predictor_caches[rows] = cache
        cache.reset()
        return cache, speech_model.predictor_rope

    def _due(self) -> list[tuple[_Turn[TurnKey], _Speech]]:
        return [
            (turn, turn.speech)
            for turn in self._turns.values()
            if turn.speech is not None and turn.speech.audio.chunk_due(turn.speech.talker.finished)
        ]

    def chunks_due(self) -> bool:
        return bool(self._due())

    def decode_chunks(self) -> list[tuple[TurnKey, TurnEvent]]:
        """Decode every due chunk (a turn's last frames once its audio ended); chunks of the same
        shape go through Code2Wav together."""
        due = self._due()
        groups: dict[tuple[int, ...], list[tuple[TurnKey, torch.Tensor]]] = {}
        for turn, speech in due:
            codes = speech.audio.pending_codes()
            groups.setdefault(tuple(codes.shape), []).append((turn.key, codes))
        events: list[tuple[TurnKey, TurnEvent]] = []
        decoded: dict[TurnKey, np.ndarray] = {}
        with torch.inference_mode():
            for members in groups.values():
                waves = self._model.code2wav(torch.cat([codes for _, codes in members], dim=0))[:, 0]
                for (key, _), wave in zip(members, waves.float().cpu().numpy()):
                    decoded[key] = wave
        for turn, speech in due:
            frames, pcm = speech.audio.emit(decoded[turn.key])
            voiced = turn.voiced_tokens(speech.audio.decoded_frames)
            events.append((turn.key, AudioChunk(pcm, frames=frames, text_tokens_voiced=voiced)))
        return events


class _AudioChunker:
    """Collects a turn's codec frames; turns due chunks into final 24 kHz samples.

    Each chunk is decoded with up to ``left_context_frames`` already decoded frames before
    it and yields the samples from the last emitted one on. The first chunk is due at
    ``first_chunk_frames``. After it, with ``adaptive_chunks``, a chunk is due once it holds
    as many frames as can be computed in half the audio still buffered ahead of the listener
    (measured: audio emitted minus time since the first chunk, against this turn's frames
    per second so far), between ``first_chunk_frames`` and ``chunk_frames``: small chunks
    while the listener is close to running out, larger ones (less Code2Wav work per frame)
    once far ahead. Without it every later chunk holds ``chunk_frames``.
    """

    def __init__(self, code2wav, params: GenerationParams, clock: Callable[[], float]) -> None:
        self._samples_per_frame = int(code2wav.total_upsample)
        self._left_context = params.left_context_frames
        self._first_chunk = params.first_chunk_frames
        self._chunk_frames = params.chunk_frames
        self._adaptive = params.adaptive_chunks
        self._clock = clock
        self._frames: list[torch.Tensor] = []
        self.decoded_frames = 0  # frames covered by decoded chunks
        self._emitted_samples = 0  # waveform samples yielded so far
        self._pending_start = 0  # first frame of the chunk being decoded (with its context)
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
        return max(self._first_chunk, min(self._chunk_frames, affordable))

    def pending_codes(self) -> torch.Tensor:
        """[1, groups, frames]: the pending frames with their left context."""
        self._pending_start = max(0, self.decoded_frames - self._left_context)
        return torch.stack(self._frames[self._pending_start :], dim=-1).unsqueeze(0)

    def emit(self, wav: np.ndarray) -> tuple[int, np.ndarray]:
        """Code2Wav's output for ``pending_codes`` -> (frames completed, new final samples)."""
        start = self._pending_start
        # wav[k] is waveform sample start * 1920 + k; its tail (the samples that would need
        # frames after the last one) is simply absent, so everything it holds is final.
        offset = self._emitted_samples - start * self._samples_per_frame
        pcm = wav[offset:]
        self._emitted_samples = start * self._samples_per_frame + wav.shape[-1]
        frames = len(self._frames) - self.decoded_frames
        self.decoded_frames = len(self._frames)
        if self._first_audio_at is None:
            self._first_audio_at = self._clock()
        return frames, pcm


class _TextStream:
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
