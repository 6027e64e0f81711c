"""What a turn asks of generation: voice, sampling, lengths and the Code2Wav chunk schedule."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.contract import VOICES
from pipeline.local.emulation import EmulatedSpeed

# generate()'s talker_max_new_tokens: 4096 frames are 5.5 minutes of speech.
DEFAULT_MAX_AUDIO_FRAMES = 4096
# temperature <= 0 promises a reproducible turn; the Talker still samples (greedy codec frames
# degenerate), so an unseeded greedy turn seeds its sampling with this.
GREEDY_TURN_SEED = 0


@dataclass(frozen=True)
class GenerationParams:
    voice: str = "ethan"
    # None: the checkpoint's generation config, else Qwen's (thinker_sampling); <= 0: greedy.
    temperature: float | None = None
    max_output_tokens: int | None = None
    output_audio: bool = True
    seed: int | None = None
    first_chunk_frames: int = 4
    # Later chunks without adaptive_chunks (vllm-omni's 25 frames, 2 s).
    chunk_frames: int = 25
    # The largest adaptive chunk (100 frames, 8 s of audio): once the audio is far ahead of the
    # listener, few large chunks pay Code2Wav's per-call cost (~2 ms on the dev model, one core)
    # less often. Qwen's own chunked_decode uses 300-frame chunks.
    max_chunk_frames: int = 100
    force_output_tokens: int | None = None  # benchmarks only: suppress EOS until N tokens
    # The answer's tokens, ending with its stop token, taken instead of sampled (the dev model's
    # scripted replies, GenerationRequest.forced_reply); they draw no random numbers.
    forced_tokens: tuple[int, ...] | None = None
    # Tests and benchmarks only: hold codec EOS until the audio has this many frames per answer
    # token, as a trained Talker speaks (3-4 tokens a second: 3-4 frames per token; the dev
    # model's Talker stops ~0.8 s after its text).
    talker_frames_per_token: float | None = None
    # Extensions beyond the agreed fields (defaults keep the agreed behaviour):
    # a safety cap on codec frames per turn (the Talker normally ends with codec EOS first).
    max_audio_frames: int = DEFAULT_MAX_AUDIO_FRAMES
    # False: greedy codec frames and code predictor, as generate(talker_do_sample=False).
    talker_do_sample: bool = True
    # Chunks after the first sized by how far the audio is ahead of the listener, up to
    # max_chunk_frames (see AudioChunker); False: every later chunk holds chunk_frames.
    adaptive_chunks: bool = True
    # Benchmarks and tests only: hold each turn's events until a model this slow would have
    # produced them (``pipeline.local.emulation``; ``--generation '{"emulate": {"first_audio_ms": 400}}'``).
    emulate: EmulatedSpeed | None = None

    def __post_init__(self) -> None:
        if self.voice.lower() not in VOICES:
            raise ValueError(f"unknown voice {self.voice!r}; expected one of {', '.join(VOICES)}")
        for name in ("max_output_tokens", "force_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 or None, got {value}")
        if self.forced_tokens is not None and not self.forced_tokens:
            raise ValueError("forced_tokens must hold at least one token or be None")
        if self.talker_frames_per_token is not None and self.talker_frames_per_token <= 0:
            raise ValueError(f"talker_frames_per_token must be positive or None, got {self.talker_frames_per_token}")
        for name in ("first_chunk_frames", "chunk_frames", "max_chunk_frames", "max_audio_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
