"""What one turn takes and what it yields: the contract between the session and any engine."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from pipeline.conversation import Conversation

Voice = Literal["ethan", "chelsie", "aiden"]
VOICES: tuple[Voice, ...] = ("ethan", "chelsie", "aiden")


@dataclass(frozen=True)
class TurnRequest:
    conversation: Conversation
    voice: Voice = "ethan"
    temperature: float = 0.8
    # None: until the Thinker stops by itself ("inf" in the protocol).
    max_output_tokens: int | None = None
    output_audio: bool = True


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class AudioChunk:
    """Float32 mono PCM at 24 kHz, in order; chunks concatenate to the turn's waveform."""

    pcm: np.ndarray


@dataclass(frozen=True)
class Usage:
    input_text_tokens: int
    input_audio_tokens: int
    output_text_tokens: int
    output_audio_tokens: int = 0  # Talker codec frames

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_audio_tokens

    @property
    def output_tokens(self) -> int:
        return self.output_text_tokens + self.output_audio_tokens


FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class TurnTimings:
    """Seconds, measured inside the engine, from the moment the turn was submitted."""

    queue_wait: float = 0.0
    first_text: float | None = None
    first_audio: float | None = None
    total: float = 0.0


@dataclass(frozen=True)
class TurnDone:
    """The last event of every turn that did not raise."""

    text: str
    usage: Usage
    finish_reason: FinishReason
    timings: TurnTimings = field(default_factory=TurnTimings)


TurnEvent = TextDelta | AudioChunk | TurnDone


class EngineError(Exception):
    """A turn failed inside the engine; the engine itself serves the next turn."""

    def __init__(self, message: str, *, code: str = "engine_error") -> None:
        super().__init__(message)
        self.code = code


class Engine(Protocol):
    """Runs turns. ``run_turn`` yields deltas and chunks and ends with exactly one ``TurnDone``.

    Closing the iterator early (``aclose()``, or cancelling the task that iterates it)
    cancels the turn: compute stops within one decoding step and the engine is free
    for the next queued turn.
    """

    name: str

    async def start(self) -> None: ...

    def run_turn(self, request: TurnRequest) -> AsyncGenerator[TurnEvent, None]: ...

    async def close(self) -> None: ...
