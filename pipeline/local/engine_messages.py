"""What the engine process and its parent say to each other over their two pipes (all picklable).

``EngineProcessSpec`` starts the process; ``Submit`` and ``Cancel`` go to it; ``WarmingUp``,
``Ready``, ``LoadFailed``, ``GenerationEventMessage`` and ``GenerationFailed`` come back
(``pipeline.local.engine_process`` has the protocol).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract import EngineErrorCode, GenerationEvent, GenerationRequest
from pipeline.local.warmup import WarmUpReport
from pipeline.token_count import DEFAULT_MAX_PROMPT_TOKENS

# Turns decoded together by default: on a GPU a step for 8 rows costs little more than one;
# on the 2-core dev box (dev model, 1 thread) 4 turns make 2.2-2.5x the codec frames/s of one
# and 8 about 1.8x (tests/bench/batch.py), still far above one at a time.
DEFAULT_MAX_BATCH = 8


@dataclass(frozen=True)
class EngineProcessSpec:
    """Everything the engine process needs to load its model (picklable)."""

    model: str
    device: str = "auto"
    dtype: str = "auto"
    seed: int | None = None
    # GenerationParams fields applied to every generation, e.g. {"force_output_tokens": 64}.
    generation: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None
    # Engine processes of one pool on this machine: on a CPU, without ``threads``, each takes its
    # share of the usable cores (torch would give every one of them all the cores, and N engines
    # would then contend for each core N ways).
    cpu_share: int = 1
    log_level: int = logging.INFO
    # from_pretrained's attn_implementation ("sdpa", "eager", "flash_attention_2"); None: transformers' default.
    attn_implementation: str | None = None
    # False: a text-only engine (no Talker loaded, generations asking for audio fail). True refuses a
    # checkpoint without a Talker at load, not at its first audio generation.
    audio_output: bool = True
    # Turns decoded together (see _BatchServer); the parent submits at most this many at a time.
    max_batch: int = DEFAULT_MAX_BATCH
    # The longest prompt a turn may have (its rendered ids); longer, it fails before it joins the
    # batch (PromptTooLong), alone: a batched prefill pads every row to the longest (KVCache.joined).
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS


# Parent -> engine process.
@dataclass(frozen=True)
class Submit:
    generation_id: int
    request: GenerationRequest


@dataclass(frozen=True)
class Cancel:
    generation_id: int


# Engine process -> parent.
@dataclass(frozen=True)
class WarmingUp:
    """Loaded; the warm-up generations run now (``Ready`` follows them)."""


@dataclass(frozen=True)
class Ready:
    pid: int
    device: str
    dtype: str
    threads: int  # torch's CPU threads in the engine process
    warm_up: WarmUpReport | None = None


@dataclass(frozen=True)
class LoadFailed:
    message: str


@dataclass(frozen=True)
class GenerationEventMessage:
    generation_id: int
    event: GenerationEvent


@dataclass(frozen=True)
class GenerationFailed:
    generation_id: int
    message: str
    code: EngineErrorCode = "engine_error"
