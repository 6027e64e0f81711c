"""What a ``DecodeBatch`` keeps per turn (``BatchGeneration``) and per stage (``StageRows``: the
Thinker's or the Talker's batched rows, their cache and positions)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from pipeline.contract import FinishReason, GenerationDone, GenerationEvent, TextDelta, Usage
from pipeline.local.kv_cache import KVCache
from pipeline.local.params import GREEDY_TURN_SEED, GenerationParams
from pipeline.local.prompt import ThinkerInputs
from pipeline.local.sampling import thinker_sampling
from pipeline.local.stages import TalkerGeneration, ThinkerGeneration
from pipeline.local.streaming import AudioChunker, TextStream
from pipeline.local.tool_calls import ToolCallStream

# What a DecodeBatch knows its turns by (the engine process: turn ids).
GenerationKey = TypeVar("GenerationKey", bound=Hashable)


@dataclass
class GenerationSpeech:
    talker: TalkerGeneration
    audio: AudioChunker


@dataclass
class StageRows(Generic[GenerationKey]):
    """One stage's batched decoding state: row ``r`` is ``turns[r]``."""

    turns: list[BatchGeneration[GenerationKey]]
    cache: KVCache
    positions: torch.Tensor  # [3, rows, 1] multimodal RoPE positions of the last fed entry
    last: torch.Tensor  # [rows, 1] last sampled id (answer token or first-layer code)
    hidden: torch.Tensor  # [rows, 1, hidden] last layer's output at the last position

    def joined(self, other: StageRows[GenerationKey]) -> StageRows[GenerationKey]:
        return StageRows(
            self.turns + other.turns,
            self.cache.joined(other.cache),
            torch.cat([self.positions, other.positions], dim=1),
            torch.cat([self.last, other.last], dim=0),
            torch.cat([self.hidden, other.hidden], dim=0),
        )

    def kept(self, keep: list[int]) -> StageRows[GenerationKey] | None:
        """Only rows ``keep`` (None when none is left)."""
        if not keep:
            return None
        if len(keep) == len(self.turns):
            return self
        index = torch.tensor(keep, device=self.last.device)
        return StageRows(
            [self.turns[row] for row in keep],
            self.cache.kept(keep),
            self.positions.index_select(1, index),
            self.last.index_select(0, index),
            self.hidden.index_select(0, index),
        )


class BatchGeneration(Generic[GenerationKey]):
    """Everything a ``DecodeBatch`` keeps for one turn."""

    def __init__(self, key: GenerationKey, model, tokenizer, inputs: ThinkerInputs, params: GenerationParams, clock) -> None:
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
        self.thinker = ThinkerGeneration(model, params, self.generator)
        self.text = TextStream(tokenizer)
        self._tokens_held = 0  # answer tokens pushed since the last delta (held-back UTF-8 pieces)
        # Function calls: from the first <tool_call> on the answer is calls, no longer speech.
        self.calls = ToolCallStream(tokenizer, inputs.answer_prefix)
        # Set when the Talker's prefill begins: the turn speaks. A chunked Talker prefill joins
        # the Talker's rows later; the Thinker's tokens wait in ``speech.talker.trailing`` meanwhile.
        self.speech: GenerationSpeech | None = None
        # Set by the Thinker's prefill for the Talker's: the prompt's input embeddings (audio
        # merged in) and the hidden states at the layer the Talker listens to.
        self.prompt_embeds: torch.Tensor | None = None
        self.prompt_hidden: torch.Tensor | None = None
        self.clock = clock

    @property
    def frames(self) -> int:
        return 0 if self.speech is None else self.speech.talker.frames

    def speaking(self) -> GenerationSpeech:
        """The Talker and chunker of a turn in the Talker's rows (which always has them)."""
        if self.speech is None:
            raise RuntimeError(f"turn {self.key!r} does not speak")
        return self.speech

    def done(self, finish_reason: FinishReason) -> GenerationDone:
        usage = Usage(
            input_text_tokens=self.inputs.text_tokens,
            input_audio_tokens=self.inputs.audio_tokens,
            output_text_tokens=self.thinker.answer_tokens,
            output_audio_tokens=self.frames,
            input_image_tokens=self.inputs.image_tokens,
        )
        return GenerationDone(text=self.text.text, usage=usage, finish_reason=finish_reason)

    @property
    def feeds_talker(self) -> bool:
        """The Talker takes this turn's newest token as text: it speaks, and its speech goes on."""
        return (
            self.speech is not None
            and not self.speech.talker.text_done
            and not self.thinker.finished
            and self.calls.speaking
        )

    def token_events(self, token: int) -> list[GenerationEvent]:
        """What a new (recorded) Thinker token releases: speech text, or from the first
        ``<tool_call>`` on, function calls (``pipeline.local.tool_calls``)."""
        if self.calls.speaking and not self.calls.opens(token):
            delta = self.text_delta(token)
            return [] if delta is None else [delta]
        events: list[GenerationEvent] = []
        if self.calls.speaking:  # this token opens the first call: the speech ended before it
            if held := self.text.flush():
                events.append(TextDelta(held, tokens=max(1, self._tokens_held)))
            self._tokens_held = 0
        if token not in self.thinker.stop_ids:
            events.extend(self.calls.push(token))
        if self.thinker.finished:
            events.extend(self.calls.end())
        return events

    def text_delta(self, token: int) -> TextDelta | None:
        """The text a new Thinker token releases, with the answer tokens it completes; a stop
        token is never text, only the end of it."""
        if token in self.thinker.stop_ids:
            text = ""
        else:
            self._tokens_held += 1
            text = self.text.push(token)
        if self.thinker.finished:
            text += self.text.flush()
        if not text:
            return None
        delta = TextDelta(text, tokens=max(1, self._tokens_held))
        self._tokens_held = 0
        return delta

