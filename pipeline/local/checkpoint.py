"""A checkpoint loaded for the engine process: the model, its tokenizer and renderer, and the
turns' base settings; refused at load when it cannot do what the spec asks (``NoTalkerError``)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from pipeline.local.devices import resolve_device, resolve_dtype, usable_cores
from pipeline.local.emulation import EmulatedSpeed
from pipeline.local.engine_messages import EngineProcessSpec

logger = logging.getLogger(__name__)


class NoTalkerError(ValueError):
    """The checkpoint cannot speak: a Thinking or Captioner variant, or one whose Talker weights are absent."""


@dataclass
class LoadedCheckpoint:
    model: Any
    tokenizer: Any
    renderer: Any
    base_params: Any
    device: str
    dtype: Any
    max_batch: int
    threads: int
    max_prompt_tokens: int


def load_checkpoint(spec: EngineProcessSpec) -> LoadedCheckpoint:
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from pipeline.local.params import GenerationParams
    from pipeline.local.prompt import PromptRenderer
    from pipeline.local.tokenizer import load_tokenizer

    device = resolve_device(spec.device)
    threads = spec.threads
    if threads is None and device == "cpu" and spec.cpu_share > 1:
        threads = max(1, usable_cores() // spec.cpu_share)
    if threads is not None:
        torch.set_num_threads(threads)
    unknown = set(spec.generation) - {f.name for f in dataclasses.fields(GenerationParams)}
    if unknown:
        raise ValueError(f"unknown generation options {sorted(unknown)}")
    generation = dict(spec.generation)
    if generation.get("emulate") is not None:
        generation["emulate"] = EmulatedSpeed.of(generation["emulate"])
        logger.warning("emulating a slower model (benchmarks only): %s", generation["emulate"].describe())
    base_params = GenerationParams(**generation)
    if spec.seed is not None:
        base_params = dataclasses.replace(base_params, seed=spec.seed)

    dtype = resolve_dtype(spec.dtype, device)
    # Checked before the weights load: a refused 30B checkpoint should fail in seconds, not minutes.
    config = Qwen3OmniMoeConfig.from_pretrained(spec.model)
    if spec.audio_output and not config.enable_audio_output:
        raise NoTalkerError(_no_talker_message(spec.model, "its config sets enable_audio_output to false"))
    if not spec.audio_output:
        config.enable_audio_output = False  # Qwen3OmniMoeForConditionalGeneration then builds no Talker
    options: dict[str, Any] = {}
    if spec.attn_implementation is not None:
        options["attn_implementation"] = spec.attn_implementation
    logger.info("loading %s on %s as %s", spec.model, device, dtype)
    # With output_loading_info, a (model, info) pair, which transformers' annotations do not say.
    model_and_info: Any = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        spec.model, config=config, dtype=dtype, device_map=device, output_loading_info=True, **options
    )
    model, loading_info = model_and_info
    missing_talker = sorted(key for key in loading_info["missing_keys"] if key.startswith(("talker.", "code2wav.")))
    if spec.audio_output and missing_talker:
        raise NoTalkerError(
            _no_talker_message(
                spec.model, f"{len(missing_talker)} Talker/Code2Wav weights are missing, e.g. {missing_talker[0]}"
            )
        )
    model.eval()
    tokenizer = load_tokenizer(spec.model)
    loaded = LoadedCheckpoint(
        model=model,
        tokenizer=tokenizer,
        renderer=PromptRenderer.from_pretrained(spec.model, tokenizer=tokenizer),
        base_params=base_params,
        device=device,
        dtype=dtype,
        max_batch=spec.max_batch,
        threads=torch.get_num_threads(),
        max_prompt_tokens=spec.max_prompt_tokens,
    )
    logger.info("loaded %s", spec.model)
    return loaded


def _no_talker_message(model: str, reason: str) -> str:
    return (
        f"{model} has no Talker ({reason}): it cannot speak. Thinking and Captioner checkpoints "
        "write text only; serve an Instruct checkpoint such as Qwen/Qwen3-Omni-30B-A3B-Instruct"
    )


def forced_tokens(tokenizer, reply: str) -> tuple[int, ...]:
    """A scripted reply as the Thinker would write it: its tokens (Qwen's tool tokens included,
    as the model writes them), then ``<|im_end|>``."""
    ids = tokenizer.encode(reply, add_special_tokens=False)
    return (*ids, tokenizer.convert_tokens_to_ids("<|im_end|>"))
