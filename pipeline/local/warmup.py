"""The engine process's warm-up: short turns on every path a first turn takes, before it says ready.

A loaded model's first turn pays costs no later turn pays: on a GPU, CUDA's context, cuBLAS
handles and workspaces, each kernel's first load (CUDA loads modules lazily) and the caching
allocator's first blocks; on a CPU, torch's first dispatch of each operator and its first
allocations, the Whisper feature extractor's first call (its mel filters, numpy's FFT plans)
and the audio encoder's first convolution. Measured on the dev model (one CPU thread, in the
engine's own code path, median CPU ms, tests/bench/README.md "first_turn"): a first spoken turn
costs 72.6 ms to its first audio against 65.7 for the second (render 6.3 vs 3.3, Thinker prefill
17.3 vs 12.7, first Code2Wav chunk 7.2 vs 6.2); after this warm-up, 62.2 and 62.3.

:func:`warm_up_generations` is what the engine process runs through its own batch server
(``pipeline.local.engine_process``) right after loading, one group at a time, each group submitted together
as concurrent sessions' turns are:

1. a spoken answer to a short clip alone: the Whisper features and the audio encoder, the
   Thinker's prefill and sampled decoding steps, the Talker's prefill and steps with the code
   predictor, Code2Wav's first chunk and a later one from the state the first left;
2. a spoken answer to text and a transcription of the clip together: the batched, left-padded
   prefill of rows with and without audio, a text-only row beside a speaking one, greedy
   decoding and the transcription prompt;
3. one end-of-turn score (semantic VAD's text judge): a forward without a cache.

Each answer is forced to ``WARM_UP_TOKENS`` tokens and ``first_chunk_frames + 1`` codec frames
(sampled, with codec EOS held until then), so every stage runs whatever the weights say; the
answers are thrown away. A benchmark's emulated speed (``pipeline.local.emulation``) does not apply:
it slows the turns users wait for, not the server's start. A checkpoint loaded without its Talker warms the text paths only.
The clip is fixed pseudo-random noise, never a user's audio. Turns here draw from their own
seeded generators, so they change no later turn's random numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from media.rates import SPEECH_RATE
from pipeline.contract import GenerationRequest
from pipeline.conversation import Conversation, UserAudio, UserText
from pipeline.local.params import GenerationParams

WARM_UP_TOKENS = 3
WARM_UP_CLIP_S = 1.0
_CLIP_LEVEL = 0.01  # -40 dBFS of noise: features like a quiet room's, no clipping anywhere
_CLIP_SEED = 0


def warm_up_clip() -> np.ndarray:
    """One second of quiet noise at 16 kHz (the same every time)."""
    rng = np.random.default_rng(_CLIP_SEED)
    return (rng.standard_normal(int(WARM_UP_CLIP_S * SPEECH_RATE)) * _CLIP_LEVEL).astype(np.float32)


def warm_up_generations(*, speaks: bool) -> list[list[GenerationRequest]]:
    """The groups of turns to run in order (see the module docstring); ``speaks``: the model has a Talker."""
    clip = UserAudio(warm_up_clip())
    answer = GenerationRequest(conversation=Conversation(items=(clip,)), max_output_tokens=WARM_UP_TOKENS, output_audio=speaks)
    to_text = dataclasses.replace(answer, conversation=Conversation(items=(UserText("Hello."),)))
    transcription = dataclasses.replace(GenerationRequest.transcription(clip), max_output_tokens=WARM_UP_TOKENS)
    return [[answer], [to_text, transcription], [GenerationRequest.end_of_turn("Hello")]]


def warm_up_params(base: GenerationParams) -> GenerationParams:
    """The engine's settings with each answer held to its full length and audio (see above)."""
    frames = base.first_chunk_frames + 1  # the first chunk, and one frame more decoded from its state
    return dataclasses.replace(
        base,
        emulate=None,
        force_output_tokens=WARM_UP_TOKENS,
        talker_frames_per_token=frames / WARM_UP_TOKENS,
        max_audio_frames=min(base.max_audio_frames, frames),
    )


@dataclass(frozen=True)
class WarmUpReport:
    """What the engine process's warm-up ran (sent with ``Ready``, shown in ``/healthz``)."""

    turns: int
    failed: int  # turns that failed (logged): the paths they take were not warmed
    audio_chunks: int
    text_deltas: int
    ms: float  # wall time
    cpu_ms: float  # the engine process's CPU time (all its threads): the figure a loaded machine does not inflate

    def describe(self) -> dict[str, float]:
        return dataclasses.asdict(self)
