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
4. Every ``first_chunk_frames`` then ``chunk_frames`` new frames, Code2Wav decodes them with
   ``left_context_frames`` frames of left context and the new audio is yielded at once.

Positions, caches, sampling and the code predictor mirror ``generate()`` call for call, so with
greedy decoding in both stages the stream produces the same tokens and codec frames as
``generate()``: streaming changes when things happen, not what is computed.

Code2Wav's upsampling blocks each look one step ahead (a transposed convolution whose last
output needs the next input), so decoding frames ``[a, b)`` yields correct audio only up to a
fixed number of samples before ``b * 1920``. Each chunk therefore emits exactly the samples
that are final, starting where the previous chunk stopped; the chunks concatenate gap-free to
the length of one decode of all frames. With left context at least Code2Wav's attention
window (72 frames in the real model) the chunks equal that decode; with the default 25 frames
(vllm-omni's choice) they differ slightly (tests/pipeline/test_generation.py states how much).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

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
) -> Iterator[TurnEvent]:
    """Run one turn, yielding TextDelta and AudioChunk as they are produced, then one TurnDone.

    ``should_stop`` is polled before every Thinker step, Talker step and Code2Wav chunk; when
    it returns true the turn ends at once with ``finish_reason="cancelled"``.

    Usage counts the answer's text tokens without the closing ``<|im_end|>`` and the codec
    frames produced. ``finish_reason`` describes the text: "stop" when the Thinker ended it,
    "length" when ``max_output_tokens`` did.
    """
    seed = params.seed
    if seed is None and not thinker_sampling(model.generation_config, params.temperature).do_sample:
        seed = GREEDY_TURN_SEED
    if seed is not None:
        # Sampling draws from torch's global generator, as generate() and its code predictor do.
        torch.manual_seed(seed)

    thinker = _ThinkerDecoder(model, inputs, params, keep_hidden_states=params.output_audio)
    text = _TextStream(tokenizer)
    talker: _TalkerDecoder | None = None
    audio: _AudioChunker | None = None
    frames = 0

    def done(finish_reason: FinishReason) -> TurnDone:
        usage = Usage(
            input_text_tokens=inputs.text_tokens,
            input_audio_tokens=inputs.audio_tokens,
            output_text_tokens=thinker.answer_tokens,
            output_audio_tokens=frames,
        )
        return TurnDone(text=text.text, usage=usage, finish_reason=finish_reason)

    if should_stop():
        yield done("cancelled")
        return
    token = thinker.prefill()
    if delta := _text_delta(text, thinker, token):
        yield TextDelta(delta)
    # An answer of one token is only its end marker (or one token cut short): nothing to speak,
    # and generate() cannot build a Talker prompt for it either.
    if params.output_audio and not thinker.finished:
        if should_stop():
            yield done("cancelled")
            return
        talker = _TalkerDecoder(model, inputs, params, thinker)
        audio = _AudioChunker(model.code2wav, params)

    while not thinker.finished or (talker is not None and not talker.finished):
        if not thinker.finished:
            if should_stop():
                yield done("cancelled")
                return
            token = thinker.step()
            if delta := _text_delta(text, thinker, token):
                yield TextDelta(delta)
            if talker is not None:
                talker.add_text_token(token, last=thinker.finished)
        if talker is not None and not talker.finished and talker.can_step(text_finished=thinker.finished):
            if should_stop():
                yield done("cancelled")
                return
            frame = talker.step()
            frames += 1
            audio.push(frame)
            if audio.chunk_due():
                if should_stop():
                    yield done("cancelled")
                    return
                yield AudioChunk(audio.decode())

    if audio is not None and audio.pending_frames:
        if should_stop():
            yield done("cancelled")
            return
        yield AudioChunk(audio.decode())
    yield done(thinker.finish_reason)


def _text_delta(text: _TextStream, thinker: _ThinkerDecoder, token: int) -> str:
    """The text a new Thinker token releases; a stop token is never text, only the end of it."""
    delta = "" if token in thinker.stop_ids else text.push(token)
    if thinker.finished:
        delta += text.flush()
    return delta


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
        processors.append(SuppressTokensLogitsProcessor(suppress_tokens, device=device))
    if do_sample:
        if temperature is not None and temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_k is not None and top_k != 0:
            processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
        if top_p is not None and top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return processors


def _choose(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """[1, vocab] processed scores -> [1, 1] token id, as generate()'s sampling step."""
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)
    return torch.argmax(scores, dim=-1, keepdim=True)


class _ThinkerDecoder:
    """Thinker prefill and one-token decoding steps with a KV cache, positions as generate()."""

    def __init__(self, model, inputs: ThinkerInputs, params: GenerationParams, *, keep_hidden_states: bool) -> None:
        self._thinker = model.thinker
        self._device = model.thinker.device
        self._inputs = inputs
        self._keep_hidden_states = keep_hidden_states
        generation_config = model.generation_config
        stop_ids = {model.config.im_end_token_id}
        configured = generation_config.eos_token_id
        if configured is not None:
            stop_ids.update([configured] if isinstance(configured, int) else configured)
        self.stop_ids = frozenset(stop_ids)
        self._stop_tensor = torch.tensor(sorted(self.stop_ids), device=self._device)
        self._max_tokens = params.max_output_tokens or UNBOUNDED_OUTPUT_TOKENS
        self._force_tokens = params.force_output_tokens or 0
        sampling = thinker_sampling(generation_config, params.temperature)
        self._do_sample = sampling.do_sample
        self._processors = _sampling_processors(
            do_sample=sampling.do_sample,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            repetition_penalty=sampling.repetition_penalty,
            suppress_tokens=list(THINK_TOKEN_IDS),
            device=self._device,
        )
        self.tokens: list[int] = []
        self.finish_reason: FinishReason = "stop"
        self.finished = False
        # Set by prefill for the Talker: the prompt's input embeddings (audio merged in) and
        # hidden states at the layer the Talker listens to.
        self.prompt_embeds: torch.Tensor | None = None
        self.prompt_hidden: torch.Tensor | None = None
        self._sequence: torch.Tensor | None = None
        self._attention_mask: torch.Tensor | None = None
        self._position_ids: torch.Tensor | None = None
        self._cache: DynamicCache | None = None
        self._accept_hidden_layer = model.config.talker_config.accept_hidden_layer if keep_hidden_states else None

    @property
    def answer_tokens(self) -> int:
        """Answer tokens generated so far, not counting a closing stop token."""
        if self.tokens and self.tokens[-1] in self.stop_ids:
            return len(self.tokens) - 1
        return len(self.tokens)

    def embed(self, token: int) -> torch.Tensor:
        """[1, 1, hidden] input embedding of one text token (what generate() records for it)."""
        with torch.inference_mode():
            return self._thinker.get_input_embeddings()(torch.tensor([[token]], device=self._device))

    def prefill(self) -> int:
        inputs = self._inputs
        input_ids = inputs.input_ids.to(self._device)
        attention_mask = inputs.attention_mask.to(self._device)
        model_kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        forward_kwargs = {}
        if inputs.input_features is not None:
            feature_attention_mask = inputs.feature_attention_mask.to(self._device)
            model_kwargs["feature_attention_mask"] = feature_attention_mask
            forward_kwargs["input_features"] = inputs.input_features.to(self._device, self._thinker.dtype)
            forward_kwargs["feature_attention_mask"] = feature_attention_mask
        with torch.inference_mode():
            # [4, 1, T]: text positions, then the three multimodal-RoPE rows (sets rope_deltas).
            position_ids = self._thinker._prepare_position_ids_for_generation(input_ids, model_kwargs)
            output = self._thinker(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=self._keep_hidden_states,
                use_audio_in_video=False,
                **forward_kwargs,
            )
        if self._keep_hidden_states:
            self.prompt_embeds = output.hidden_states[0]
            self.prompt_hidden = output.hidden_states[self._accept_hidden_layer]
        self._sequence = input_ids
        self._attention_mask = attention_mask
        self._position_ids = position_ids
        self._cache = output.cache
        return self._sample(output.logits)

    def step(self) -> int:
        """Feed the last token, sample the next one."""
        last = torch.tensor([[self.tokens[-1]]], device=self._device)
        self._attention_mask = torch.cat([self._attention_mask, self._attention_mask.new_ones((1, 1))], dim=-1)
        self._position_ids = self._position_ids[..., -1:] + 1
        with torch.inference_mode():
            output = self._thinker(
                input_ids=last,
                attention_mask=self._attention_mask,
                position_ids=self._position_ids,
                cache=self._cache,
                use_cache=True,
            )
        self._cache = output.cache
        return self._sample(output.logits)

    def _sample(self, logits: torch.Tensor) -> int:
        with torch.inference_mode():
            scores = logits[:, -1, :].to(dtype=torch.float32, copy=True)
            if len(self.tokens) < self._force_tokens:
                scores[:, self._stop_tensor] = -float("inf")
            scores = self._processors(self._sequence, scores)
            token = _choose(scores, self._do_sample)
            self._sequence = torch.cat([self._sequence, token], dim=-1)
        token_id = int(token.item())
        self.tokens.append(token_id)
        if token_id in self.stop_ids:
            self.finished, self.finish_reason = True, "stop"
        elif len(self.tokens) >= self._max_tokens:
            self.finished, self.finish_reason = True, "length"
        return token_id


class _TalkerDecoder:
    """Talker prefill and steps as generate() does them, fed answer text as it arrives.

    Built right after the Thinker's prefill (it needs the first answer token). Each ``step``
    completes one codec frame (the code predictor adds the 15 residual codes to the last
    sampled first-layer code) and samples the next first-layer code.
    """

    def __init__(self, model, inputs: ThinkerInputs, params: GenerationParams, thinker: _ThinkerDecoder) -> None:
        config = model.config
        talker_config = config.talker_config
        self._talker = model.talker
        self._thinker_decoder = thinker
        self._device = model.talker.device
        self._num_code_groups = talker_config.num_code_groups
        self._codec_eos = talker_config.codec_eos_token_id
        self._max_frames = params.max_audio_frames
        self._do_sample = params.talker_do_sample
        generation_config = model.generation_config
        sampling = {}
        for name, default in _TALKER_SAMPLING_DEFAULTS.items():
            configured = getattr(generation_config, f"talker_{name}", None)
            sampling[name] = default if configured is None else configured
        vocab_size = talker_config.text_config.vocab_size
        self._processors = _sampling_processors(
            do_sample=self._do_sample,
            suppress_tokens=[
                i for i in range(vocab_size - _TALKER_SUPPRESSED_SPAN, vocab_size) if i != self._codec_eos
            ],
            device=self._device,
            **sampling,
        )
        # generate() samples the code predictor with top-k 50 / top-p 0.8 whenever the talker samples.
        self._predictor_processors = _sampling_processors(
            do_sample=self._do_sample,
            temperature=None,
            top_k=_CODE_PREDICTOR_TOP_K,
            top_p=_CODE_PREDICTOR_TOP_P,
            repetition_penalty=None,
            device=self._device,
        )
        # Benchmarks force long answers from random weights; keep the Talker from stopping
        # before it has spoken them (until it has consumed the <tts_eos> entry).
        self._hold_eos = params.force_output_tokens is not None

        speaker_id = talker_config.speaker_id.get(params.voice.lower())
        if speaker_id is None:
            raise ValueError(f"the checkpoint has no speaker {params.voice!r}")

        with torch.inference_mode():
            tts_tokens = torch.tensor(
                [[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]],
                device=model.thinker.device,
            )
            tts_bos, tts_eos, tts_pad = (
                self._talker.text_projection(model.thinker.get_input_embeddings()(tts_tokens))
                .to(self._device)
                .chunk(3, dim=1)
            )
        self._tts_eos = tts_eos
        self._tts_pad = tts_pad
        # trailing[j] is what Talker step j adds: answer token j + 1, or <tts_eos> for the last.
        self._trailing: list[torch.Tensor] = []
        self._text_done = False

        prompt_embeds, prompt_ids = self._prompt(model, inputs, thinker, speaker_id, tts_pad, tts_bos, tts_eos)
        attention_mask = torch.ones(prompt_ids.shape, dtype=torch.long, device=self._device)
        model_kwargs = {"attention_mask": attention_mask, "talker_input_ids": prompt_ids}
        if inputs.feature_attention_mask is not None:
            model_kwargs["audio_feature_lengths"] = inputs.feature_attention_mask.to(self._device).sum(dim=1)
        with torch.inference_mode():
            position_ids = self._talker._prepare_position_ids_for_generation(prompt_embeds, model_kwargs)
            output = self._talker(
                inputs_embeds=prompt_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                output_hidden_states=True,
            )
        self._attention_mask = attention_mask
        self._position_ids = position_ids
        self._generated = torch.empty((1, 0), dtype=torch.long, device=self._device)
        self.frames = 0
        self.finished = False
        self._absorb(output)

    def _prompt(self, model, inputs, thinker, speaker_id, tts_pad, tts_bos, tts_eos):
        """The Talker's prompt exactly as generate() builds it (batch of one, no padding)."""
        config = model.config
        input_ids = inputs.input_ids.to(self._device)
        length = input_ids.shape[1]
        thinker_config = config.thinker_config
        multimodal_mask = (
            (input_ids == thinker_config.audio_token_id)
            | (input_ids == thinker_config.image_token_id)
            | (input_ids == thinker_config.video_token_id)
        )
        prompt_embeds = thinker.prompt_embeds.to(self._device)
        prompt_hidden = thinker.prompt_hidden.to(self._device)
        with torch.inference_mode():
            # Every position whose segment (from the last <|im_start|>) is a user turn.
            positions = torch.arange(length, device=self._device).unsqueeze(0)
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
            embeds = torch.cat([prompt_embeds, thinker.embed(thinker.tokens[0]).to(self._device)], dim=1)
            assistant_embeds, assistant_ids, _ = model._get_talker_assistant_parts(
                assistant_start, length + 1, speaker_id, embeds, tts_pad, tts_bos, tts_eos
            )
        return torch.cat([user_embeds, assistant_embeds], dim=1), torch.cat([user_ids, assistant_ids], dim=1)

    def add_text_token(self, token: int, *, last: bool) -> None:
        """Answer token k (k >= 1) has been sampled; ``last`` when the Thinker stopped there."""
        if last:
            self._trailing.append(self._tts_eos)
            self._text_done = True
            return
        with torch.inference_mode():
            self._trailing.append(self._talker.text_projection(self._thinker_decoder.embed(token)).to(self._device))

    def can_step(self, *, text_finished: bool) -> bool:
        """Step j needs trailing entry j, unless the text is over (then it runs on <tts_pad>)."""
        return text_finished or self.frames < len(self._trailing)

    def step(self) -> torch.Tensor:
        """Complete frame ``self.frames`` ([16] codes) and, unless that was the last, sample on."""
        talker = self._talker
        with torch.inference_mode():
            last_code = self._generated[:, -1:]
            last_code_embed = talker.get_input_embeddings()(last_code)
            residual_codes, residual_embeds = self._predict_residual_codes(last_code_embed)
            frame = torch.cat((last_code, residual_codes), dim=-1)[0]
            step = self.frames
            self.frames += 1
            if self.frames >= self._max_frames:
                self.finished = True
                return frame
            inputs_embeds = torch.cat([last_code_embed, residual_embeds], dim=1).sum(1, keepdim=True)
            text_embed = self._trailing[step] if step < len(self._trailing) else self._tts_pad
            inputs_embeds = inputs_embeds + text_embed
            self._attention_mask = torch.cat([self._attention_mask, self._attention_mask.new_ones((1, 1))], dim=-1)
            self._position_ids = self._position_ids[..., -1:] + 1
            output = talker(
                inputs_embeds=inputs_embeds,
                attention_mask=self._attention_mask,
                position_ids=self._position_ids,
                cache=self._cache,
                use_cache=True,
                output_hidden_states=True,
                generation_step=step,  # only echoed back (+1) by forward
            )
        self._absorb(output, text_consumed_through=step)
        return frame

    def _predict_residual_codes(self, last_code_embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The code predictor's 15 residual codes ([1, 15]) and their embeddings ([1, 15, hidden]).

        What generate()'s ``code_predictor.generate(...)`` computes, as a plain loop: a
        two-position prefill (last talker hidden state, first-layer code), then one code per
        step, code ``k`` embedded by embedding table ``k - 1`` and scored by head ``k``.
        """
        predictor = self._talker.code_predictor
        embeddings = predictor.get_input_embeddings()
        output = predictor(inputs_embeds=torch.cat((self._last_hidden, last_code_embed), dim=1), use_cache=True)
        codes = torch.empty((1, 0), dtype=torch.long, device=self._device)
        residual_embeds = []
        for group in range(1, self._num_code_groups):
            scores = self._predictor_processors(codes, output.logits[:, -1, :].to(torch.float32))
            code = _choose(scores, self._do_sample)
            codes = torch.cat([codes, code], dim=-1)
            residual_embeds.append(embeddings[group - 1](code))
            if group < self._num_code_groups - 1:
                output = predictor(input_ids=code, cache=output.cache, use_cache=True, generation_steps=group)
        return codes, torch.cat(residual_embeds, dim=1)

    def _absorb(self, output, *, text_consumed_through: int = -1) -> None:
        """Keep the cache and last hidden state; sample the next first-layer code."""
        self._cache = output.cache
        with torch.inference_mode():
            # generate() feeds the code predictor the last layer's output at the last position.
            self._last_hidden = output.hidden_states[0][-1][:, -1:]
            scores = output.logits[:, -1, :].to(dtype=torch.float32, copy=True)
            text_pending = not self._text_done or text_consumed_through < len(self._trailing) - 1
            if self._hold_eos and text_pending:
                scores[:, self._codec_eos] = -float("inf")
            scores = self._processors(self._generated, scores)
            code = _choose(scores, self._do_sample)
            self._generated = torch.cat([self._generated, code], dim=-1)
        if int(code.item()) == self._codec_eos:
            self.finished = True


class _AudioChunker:
    """Collects codec frames; decodes due chunks with left context into final 24 kHz samples."""

    def __init__(self, code2wav, params: GenerationParams) -> None:
        self._code2wav = code2wav
        self._samples_per_frame = int(code2wav.total_upsample)
        self._left_context = params.left_context_frames
        self._chunk_frames = params.chunk_frames
        self._next_boundary = params.first_chunk_frames
        self._frames: list[torch.Tensor] = []
        self._decoded_frames = 0  # frames covered by decoded chunks
        self._emitted_samples = 0  # waveform samples yielded so far

    @property
    def pending_frames(self) -> int:
        return len(self._frames) - self._decoded_frames

    def push(self, frame: torch.Tensor) -> None:
        self._frames.append(frame)

    def chunk_due(self) -> bool:
        return len(self._frames) >= self._next_boundary

    def decode(self) -> np.ndarray:
        """Decode the pending frames; return the waveform from the last emitted sample on."""
        end = len(self._frames)
        start = max(0, self._decoded_frames - self._left_context)
        codes = torch.stack(self._frames[start:end], dim=-1).unsqueeze(0)  # [1, groups, frames]
        with torch.inference_mode():
            wav = self._code2wav(codes)[0, 0]
        # wav[k] is waveform sample start * 1920 + k; its tail (the samples that would need
        # frames after `end`) is simply absent, so everything it holds is final.
        offset = self._emitted_samples - start * self._samples_per_frame
        pcm = wav[offset:].float().cpu().numpy()
        self._emitted_samples = start * self._samples_per_frame + wav.shape[-1]
        self._decoded_frames = end
        self._next_boundary = end + self._chunk_frames
        return pcm


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
