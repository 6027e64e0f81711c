"""The conversation a turn is rendered from: items, instructions and the history bound."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from media.rates import SPEECH_RATE
from pipeline.images import image_tokens

# The system prompt the Qwen3-Omni README (github.com/QwenLM/Qwen3-Omni, "Usage Tips", "Prompt for
# Audio-Visual Interaction") recommends for spoken interaction: the Thinker writes short,
# plain sentences with nothing unspeakable (lists, asterisks, brackets), which the README says
# gives "more stable and fluent audio output from the talker". Verbatim, including its line
# about video, which is moot for audio-only turns but keeps the prompt the model was tuned with.
DEFAULT_SYSTEM_PROMPT = (
    "You are Qwen-Omni, a smart voice assistant created by Alibaba Qwen."
    " You are a virtual voice assistant with no gender or age.\n"
    "You are communicating with the user.\n"
    "In user messages, \u201cI/me/my/we/our\u201d refer to the user and \u201cyou/your\u201d refer to the"
    " assistant. In your replies, address the user as \u201cyou/your\u201d and yourself as"
    " \u201cI/me/my\u201d; never mirror the user\u2019s pronouns\u2014always shift perspective. Keep"
    " original pronouns only in direct quotes; if a reference is unclear, ask a brief clarifying"
    " question.\n"
    "Interact with users using short(no more than 50 words), brief, straightforward language,"
    " maintaining a natural tone.\n"
    "Never use formal phrasing, mechanical expressions, bullet points, overly structured language. \n"
    "Your output must consist only of the spoken content you want the user to hear. \n"
    "Do not include any descriptions of actions, emotions, sounds, or voice changes. \n"
    "Do not use asterisks, brackets, parentheses, or any other symbols to indicate tone or actions. \n"
    "You must answer users' audio or text questions, do not directly describe the video content. \n"
    "You should communicate in the same language strictly as the user unless they request otherwise.\n"
    "When you are uncertain (e.g., you can't see/hear clearly, don't understand, or the user makes a"
    " comment rather than asking a question), use appropriate questions to guide the user to continue"
    " the conversation.\n"
    "Keep replies concise and conversational, as if talking face-to-face."
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
class UserImage:
    """One image the user showed (an ``input_image`` part, or a camera frame): PNG or JPEG bytes,
    already fitted to its pixel budget (``pipeline.images.fit``), and that budget (``max_pixels``),
    which the image processor fits it to again (a no-op for an image already fitted)."""

    data: bytes
    width: int
    height: int
    max_pixels: int

    @property
    def tokens(self) -> int:
        """Its ``<|image_pad|>`` tokens in the prompt."""
        return image_tokens(self.width, self.height, self.max_pixels)


@dataclass(frozen=True)
class AssistantText:
    """What the assistant said, as the user heard it (truncated when cut off)."""

    text: str


ConversationItem = UserAudio | UserText | UserImage | AssistantText

# What stands in the prompt for an image of an older turn once images no longer fit the history's
# image budget: the model knows one was shown, the prompt does not pay for its pixels.
IMAGE_NOTE = "(an image was shown here)"


@dataclass(frozen=True)
class HistoryLimits:
    """Whole turns are kept or dropped, newest first, until every limit holds.

    The audio limits bound the clips heard as audio; an older turn whose clips all have
    transcripts stays as their text instead (``max_turns`` still bounds every kept turn).
    ``max_image_tokens`` bounds the image tokens of past turns: older turns lose their images
    first (each becomes ``IMAGE_NOTE``), and keep their audio.
    """

    max_turns: int = 8
    max_audio_clips: int = 4
    # Also the most audio one user turn may hold (app.realtime.turn_taking): four 30 s segments,
    # ~1,560 audio tokens at 13 per second, so a turn that long, once answered, still fits whole.
    max_audio_seconds: float = 120.0
    # Eight camera turns at the default budget (5 frames of <= 98 tokens each); one 1 MP "high"
    # image takes 1,000. The turn being answered keeps its images whatever they cost.
    max_image_tokens: int = 4_096


@dataclass(frozen=True)
class Conversation:
    """An immutable snapshot: what one turn sees.

    ``items`` run oldest first; the last user items are the turn being answered.
    ``instructions`` of ``None`` mean Qwen3-Omni's recommended spoken-chat system prompt.
    """

    items: tuple[ConversationItem, ...] = ()
    instructions: str | None = None
    limits: HistoryLimits = field(default_factory=HistoryLimits)

    @property
    def system_prompt(self) -> str:
        return DEFAULT_SYSTEM_PROMPT if self.instructions is None else self.instructions
