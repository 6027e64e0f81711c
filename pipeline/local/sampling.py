"""Sampling for the Thinker, the Talker and the code predictor, for every row of a batch at once.

The processors are those ``generate()`` builds for the same settings, in its order; the rows of
a batch are warped and drawn together, each turn with its own generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# Qwen's recommended Thinker sampling (the Qwen3-Omni README's vLLM example: temperature 0.6,
# top_p 0.95, top_k 20, no repetition penalty), used for what the checkpoint's generation config
# does not name. docs/MODEL.md says why these and not vllm-omni's.
QWEN_THINKER_TEMPERATURE = 0.6
QWEN_THINKER_TOP_P = 0.95
QWEN_THINKER_TOP_K = 20
QWEN_THINKER_REPETITION_PENALTY = 1.0


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


# generate()'s Talker sampling (Qwen3OmniMoeForConditionalGeneration.generate's talker_* defaults in
# transformers 5.24), used for what the checkpoint's generation config does not name as talker_*.
GENERATE_TALKER_TEMPERATURE = 0.9
GENERATE_TALKER_TOP_K = 50
GENERATE_TALKER_TOP_P = 1.0
GENERATE_TALKER_REPETITION_PENALTY = 1.05


@dataclass(frozen=True)
class TalkerSampling:
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float


def talker_sampling(generation_config) -> TalkerSampling:
    """The Talker's first-codebook sampling: the checkpoint's ``talker_*`` values where its
    generation config names them, else ``generate()``'s."""

    def configured(name: str, default):
        value = getattr(generation_config, f"talker_{name}", None)
        return default if value is None else value

    return TalkerSampling(
        temperature=configured("temperature", GENERATE_TALKER_TEMPERATURE),
        top_k=configured("top_k", GENERATE_TALKER_TOP_K),
        top_p=configured("top_p", GENERATE_TALKER_TOP_P),
        repetition_penalty=configured("repetition_penalty", GENERATE_TALKER_REPETITION_PENALTY),
    )


def sampling_processors(
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


class SuppressTokens:
    """``SuppressTokensLogitsProcessor`` as an index fill of the suppressed ids: the original
    builds a mask over the whole vocabulary with ``torch.isin`` and ``masked_fill``s all of
    it every step (0.09 ms per row against 0.013 ms for the 152k Thinker vocabulary, one
    core), a cost each row of a batch pays again."""

    def __init__(self, suppress_tokens: torch.Tensor) -> None:
        self._tokens = suppress_tokens

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        if self._tokens.device != scores.device:
            self._tokens = self._tokens.to(scores.device)
        return scores.index_fill(-1, self._tokens, -float("inf"))


class Sampler:
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
            SuppressTokens(processor.suppress_tokens)
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

    def process(self, context: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """[1, vocab] float32 scores through the processors that come before the draw."""
        return self._processors(context, scores) if len(self._processors) else scores  # type: ignore[arg-type]

    def uniforms(self, count: int, device: torch.device) -> torch.Tensor:
        """[count] uniform numbers in [0, 1) from this turn's generator."""
        return torch.rand(count, generator=self._generator, device=device)

    def draw_full(self, scores: torch.Tensor) -> torch.Tensor:
        """A draw over the whole vocabulary (processors without a top-k): [1, vocab] -> [1, 1]."""
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1, generator=self._generator)


def choose_rows(samplers: list[Sampler], scores: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
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
        return choose_group(samplers, list(range(len(samplers))), next(iter(groups)), scores, uniforms)
    chosen = torch.empty((len(samplers), 1), dtype=torch.long, device=scores.device)
    for key, rows in groups.items():
        index = torch.tensor(rows, device=scores.device)
        group_uniforms = None if uniforms is None else uniforms.index_select(0, index)
        picks = choose_group(samplers, rows, key, scores.index_select(0, index), group_uniforms)
        chosen.index_copy_(0, index, picks)
    return chosen


def choose_group(
    samplers: list[Sampler],
    rows: list[int],
    key: tuple[int, float | None] | None,
    group: torch.Tensor,
    uniforms: torch.Tensor | None,
) -> torch.Tensor:
    """``choose_rows`` for ``rows`` (of ``samplers``) that share ``key``; ``group`` holds their scores."""
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
    values, indices = torch.topk(group, min(top_k, group.shape[-1]), dim=-1)
    temperatures = [samplers[row].temperature or 1.0 for row in rows]
    if any(temperature != 1.0 for temperature in temperatures):
        # A positive temperature keeps the order, so only the k candidates are scaled, not the
        # whole vocabulary (152k per Thinker row). Multiplied by the reciprocal, per row: the
        # same bits for a row alone or batched (a division by a scalar and by a tensor can
        # round differently).
        inverse = torch.tensor([1.0 / t for t in temperatures], device=group.device, dtype=group.dtype)
        values = values * inverse[:, None]
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
