"""One turn's bookkeeping in each stage: the Thinker's tokens and the Talker's codes, their
sampling (generate()'s processors for the turn's settings), and when each stage ends."""

from __future__ import annotations

import torch

from pipeline.contract import FinishReason
from pipeline.local.params import GenerationParams
from pipeline.local.sampling import Sampler, sampling_processors, talker_sampling, thinker_sampling

# max_output_tokens=None ("inf" in the protocol) still needs a bound; 4096 is the protocol's
# largest numeric value.
UNBOUNDED_OUTPUT_TOKENS = 4096
# Qwen3's <think> and </think> (tests/pipeline/local/test_tokenizer.py checks the ids): an Instruct
# Thinker must never open a reasoning block that the Talker would then read aloud.
THINK_TOKEN_IDS = (151667, 151668)
# generate() suppresses the top 1024 talker ids (special codec tokens) except codec EOS.
_TALKER_SUPPRESSED_SPAN = 1024
# generate()'s code predictor sampling (the talker's prepare_inputs_for_generation).
_CODE_PREDICTOR_TOP_K = 50
_CODE_PREDICTOR_TOP_P = 0.8


class ThinkerGeneration:
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
        # A forced answer is taken greedily from scores that allow only its next token: no draw.
        self._forced = params.forced_tokens
        sampling = thinker_sampling(generation_config, params.temperature)
        do_sample = sampling.do_sample and self._forced is None
        processors = sampling_processors(
            do_sample=do_sample,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            repetition_penalty=sampling.repetition_penalty,
            suppress_tokens=list(THINK_TOKEN_IDS),
            device=device,
        )
        self.sampler = Sampler(processors, do_sample=do_sample, generator=generator)
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
        if self._forced is not None:
            scores.fill_(-float("inf"))
            scores[:, self._forced[min(len(self.tokens), len(self._forced) - 1)]] = 0.0
            return scores
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


class TalkerGeneration:
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
        sampling = talker_sampling(model.generation_config)
        vocab_size = talker_config.text_config.vocab_size
        processors = sampling_processors(
            do_sample=do_sample,
            suppress_tokens=[
                i for i in range(vocab_size - _TALKER_SUPPRESSED_SPAN, vocab_size) if i != self._codec_eos
            ],
            device=device,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            repetition_penalty=sampling.repetition_penalty,
        )
        self.sampler = Sampler(processors, do_sample=do_sample, generator=generator)
        # generate() samples the code predictor with top-k 50 / top-p 0.8 whenever the talker samples.
        self.predictor_sampler = Sampler(
            sampling_processors(
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
        self._frames_per_token = params.talker_frames_per_token
        self.trailing: list[torch.Tensor] = []
        self.text_done = False
        self.generated = torch.empty((1, 0), dtype=torch.long, device=device)
        self.frames = 0
        self.finished = False

    def scores(self, logits: torch.Tensor, *, consumed_through: int) -> torch.Tensor:
        """[1, vocab] logits after trailing entry ``consumed_through`` -> scores ready for the draw."""
        scores = logits.to(dtype=torch.float32, copy=True)
        text_pending = not self.text_done or consumed_through < len(self.trailing) - 1
        # The answer's tokens: the first (in the Talker's prompt), then one trailing entry each.
        slow = self._frames_per_token is not None and (
            not self.text_done or self.frames < self._frames_per_token * (len(self.trailing) + 1)
        )
        if (self._hold_eos and text_pending) or slow:
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
