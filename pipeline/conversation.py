"""The conversation a turn is rendered from: items, instructions and the history bound."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from media.rates import SPEECH_RATE

# Qwen3-Omni's model card: the system prompt its Talker was trained to speak under.
DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
    "perceiving auditory and visual inputs, as well as generating text and speech."
)


@dataclass(frozen=True)
class UserAudio:
    """One user utterance: float32 mono PCM at 16 kHz.

    ``transcript`` (input audio transcription, when the session asked for it) lets the
    utterance stay in the prompt as text once its audio no longer fits the history's audio
    budget (``pipeline.prompt.bound_history``).
    """

    pcm: np.ndarray
    transcript: str | None = None

    @property
    def seconds(self) -> float:
        return len(self.pcm) / SPEECH_RATE


@dataclass(frozen=True)
class UserText:
    text: str


@dataclass(frozen=True)
class AssistantText:
    """What the assistant said, as the user heard it (truncated when cut off)."""

    text: str


ConversationItem = UserAudio | UserText | AssistantText


@dataclass(frozen=True)
class HistoryLimits:
    """Whole turns are kept or dropped, newest first, until every limit holds.

    The audio limits bound the clips heard as audio; an older turn whose clips all have
    transcripts stays as their text instead (``max_turns`` still bounds every kept turn).
    """

    max_turns: int = 8
    max_audio_clips: int = 4
    max_audio_seconds: float = 60.0


@dataclass(frozen=True)
class Conversation:
    """An immutable snapshot: what one turn sees.

    ``items`` run oldest first; the last user items are the turn being answered.
    ``instructions`` of ``None`` mean Qwen's default speech system prompt.
    """

    items: tuple[ConversationItem, ...] = ()
    instructions: str | None = None
    limits: HistoryLimits = field(default_factory=HistoryLimits)

    @property
    def system_prompt(self) -> str:
        return DEFAULT_SYSTEM_PROMPT if self.instructions is None else self.instructions
