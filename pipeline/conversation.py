"""The conversation a turn is rendered from: items, instructions, the history bound, and the prompts
Qwen3-Omni is given (its spoken-chat system prompt and its ASR instruction).

Nothing here needs torch: the in-process engine (``pipeline.local.prompt``) and the vLLM-Omni
client (``pipeline.vllm_omni.chat_completions``) render the same conversation. What each item adds to a
prompt at most is ``pipeline.token_bounds``'s; the tool items (``FunctionCall``,
``FunctionOutput``) and the tools are ``pipeline.tool_format``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np

from media.rates import SPEECH_RATE
from pipeline.images import image_tokens
from pipeline.token_bounds import (
    ASSISTANT_MESSAGE_TOKENS,
    AUDIO_MARKER_TOKENS,
    USER_MESSAGE_TOKENS,
    VISION_MARKER_TOKENS,
    audio_tokens,
    text_tokens_bound,
)
from pipeline.tool_format import FunctionCall, FunctionOutput, Tool, ToolChoice

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

# Qwen3-Omni's README: its 19 speech input languages (ISO-639-1 codes; Cantonese has none,
# "yue" is its ISO-639-3 code) and its ASR prompts.
ASR_LANGUAGES = {
    "en": "English", "zh": "Chinese", "yue": "Cantonese", "ko": "Korean", "ja": "Japanese",
    "de": "German", "ru": "Russian", "it": "Italian", "fr": "French", "es": "Spanish",
    "pt": "Portuguese", "ms": "Malay", "nl": "Dutch", "id": "Indonesian", "tr": "Turkish",
    "vi": "Vietnamese", "ar": "Arabic", "ur": "Urdu",
}
ASR_PROMPT = "Transcribe the audio into text."
ASR_PROMPT_FOR_LANGUAGE = "Transcribe the {language} audio into text."
ASR_PROMPT_CHINESE = "请将这段中文语音转换为纯文本。"


@dataclass(frozen=True)
class UserAudio:
    """One user utterance: float32 mono PCM at 16 kHz.

    ``transcript`` (input audio transcription, when the session asked for it) lets the
    utterance stay in the prompt as text once its audio no longer fits the history's audio
    budget (:func:`bound_history`).
    """

    pcm: np.ndarray
    transcript: str | None = None

    @property
    def seconds(self) -> float:
        return len(self.pcm) / SPEECH_RATE

    def prompt_tokens(self) -> int:
        """At most this many prompt tokens: its audio, or its transcript once it stands for it."""
        as_audio = AUDIO_MARKER_TOKENS + audio_tokens(len(self.pcm))
        as_text = text_tokens_bound(self.transcript) if self.transcript is not None else 0
        return USER_MESSAGE_TOKENS + max(as_audio, as_text)

    def held_bytes(self) -> int:
        return self.pcm.nbytes + (text_tokens_bound(self.transcript) if self.transcript is not None else 0)


@dataclass(frozen=True)
class UserText:
    text: str

    def prompt_tokens(self) -> int:
        return USER_MESSAGE_TOKENS + text_tokens_bound(self.text)

    def held_bytes(self) -> int:
        return text_tokens_bound(self.text)


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

    def prompt_tokens(self) -> int:
        return USER_MESSAGE_TOKENS + VISION_MARKER_TOKENS + self.tokens

    def held_bytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class AssistantText:
    """What the assistant said, as the user heard it (truncated when cut off)."""

    text: str

    def prompt_tokens(self) -> int:
        return ASSISTANT_MESSAGE_TOKENS + text_tokens_bound(self.text)

    def held_bytes(self) -> int:
        return text_tokens_bound(self.text)


ConversationItem = UserAudio | UserText | UserImage | AssistantText | FunctionCall | FunctionOutput

# What stands in the prompt for an image of an older turn once images no longer fit the history's
# image budget: the model knows one was shown, the prompt does not pay for its pixels.
IMAGE_NOTE = "(an image was shown here)"


# What ``group_turns`` needs to know of an item: whether it is an answer (which ends a turn),
# or the call id it calls or answers (a function call, or its output).
ItemRole = tuple[Literal["answer", "call", "output", "other"], str | None]

T = TypeVar("T")


def group_turns(items: Sequence[T], role: Callable[[T], ItemRole]) -> tuple[list[list[T]], list[T]]:
    """Past turns and the items after the last one (the turn being answered).

    A turn runs up to and including an answer; function calls and their outputs never end
    one. A call and its output always share a turn: when an output comes in a later turn than
    its call (the user spoke before the client returned it), the turns from the call's to the
    output's are one. Pruning and the history bound keep or drop whole turns, so a call is
    never kept without its output, or an output without its call.
    """
    turns: list[list[T]] = []
    pending: list[T] = []
    for item in items:
        pending.append(item)
        if role(item)[0] == "answer":
            turns.append(pending)
            pending = []
    merged: list[list[T]] = []
    calls: list[set[str]] = []  # call ids made in each merged turn
    for turn in turns:
        made = {call_id for kind, call_id in map(role, turn) if kind == "call" and call_id is not None}
        answered = {call_id for kind, call_id in map(role, turn) if kind == "output" and call_id is not None}
        first = next((index for index, ids in enumerate(calls) if ids & answered), len(merged))
        for index in range(len(merged) - 1, first - 1, -1):  # fold the turns since the call into this one
            turn = merged.pop(index) + turn
            made |= calls.pop(index)
        merged.append(turn)
        calls.append(made)
    return merged, pending


def item_role(item: ConversationItem) -> ItemRole:
    """A conversation item's part in ``group_turns``."""
    if isinstance(item, AssistantText):
        return ("answer", None)
    if isinstance(item, FunctionCall):
        return ("call", item.call_id)
    if isinstance(item, FunctionOutput):
        return ("output", item.call_id)
    return ("other", None)


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
    # Every item, whatever turn it joins (conversation.item.create can put one anywhere, even
    # first), counts against these three; past any of them older items' images go first, then
    # the oldest items, each announced with conversation.item.deleted (app.realtime.history). Like OpenAI's token-based truncation
    # (``token_limits.post_instructions``): prompt tokens of the history after the system
    # prompt, as the items estimate them (an upper bound, see ``prompt_tokens``). 16,000 is
    # eight long spoken turns many times over (a turn is ~13 tokens per second of speech).
    max_prompt_tokens: int = 16_000
    # A voice chat holds ~20 items (8 turns, up to 16 unanswered); a client seeding a text
    # conversation reaches the token budget long before this.
    max_items: int = 512
    # PCM (float32, 64 KB per second of speech) and text held: below the 16 MiB an IPC message
    # between processes may carry (app.serving.ipc), so the turn request that carries the history
    # always fits; 12 MiB is ~196 s of audio, more than the 120 s the prompt keeps as audio.
    max_bytes: int = 12 * 1024 * 1024


@dataclass(frozen=True)
class Conversation:
    """An immutable snapshot: what one turn sees.

    ``items`` run oldest first; the last user items are the turn being answered.
    ``instructions`` of ``None`` mean Qwen3-Omni's recommended spoken-chat system prompt.
    """

    items: tuple[ConversationItem, ...] = ()
    instructions: str | None = None
    limits: HistoryLimits = field(default_factory=HistoryLimits)
    tools: tuple[Tool, ...] = ()  # rendered in the system message unless tool_choice is "none"
    tool_choice: ToolChoice = field(default_factory=ToolChoice)

    @property
    def system_prompt(self) -> str:
        return DEFAULT_SYSTEM_PROMPT if self.instructions is None else self.instructions


Turn = tuple[ConversationItem, ...]


def split_turns(items: Sequence[ConversationItem]) -> tuple[list[Turn], Turn]:
    """Past turns (items up to and including the next assistant answer, a function call kept
    with its output: ``group_turns``) and the current one, the items after the last answer:
    the turn being answered."""
    turns, pending = group_turns(items, item_role)
    return [tuple(turn) for turn in turns], tuple(pending)


def bound_history(conversation: Conversation) -> tuple[ConversationItem, ...]:
    """The items one turn sees: the current turn plus as many whole past turns as the limits allow.

    Past turns are taken newest first. ``max_turns`` bounds them all. The first turn whose audio
    would break an audio limit (clip count or seconds) and every older one are kept as text, each
    clip replaced by its transcript (``UserAudio.transcript``); the first such turn with a clip
    that has no transcript ends the history. What is kept is always a contiguous, answered
    stretch right before the current turn, audio for the newest turns and text before them.
    Images go before audio: the first past turn whose images would take the past turns' image
    tokens over ``max_image_tokens``, and every older one, keep a note (``IMAGE_NOTE``) for each
    run of images instead (``noted``). The current turn is always whole.
    """
    limits = conversation.limits
    past, current = split_turns(conversation.items)
    kept: list[Turn] = []
    clips = 0
    seconds = 0.0
    as_text = False
    past_image_tokens = 0
    images_noted = False
    for turn in reversed(past):
        if len(kept) >= limits.max_turns:
            break
        audio = [item for item in turn if isinstance(item, UserAudio)]
        if not as_text:
            clips += len(audio)
            seconds += sum(clip.seconds for clip in audio)
            as_text = clips > limits.max_audio_clips or seconds > limits.max_audio_seconds
        if as_text:
            if any(clip.transcript is None for clip in audio):
                break
            turn = tuple(UserText(item.transcript or "") if isinstance(item, UserAudio) else item for item in turn)
        if not images_noted:
            past_image_tokens += sum(item.tokens for item in turn if isinstance(item, UserImage))
            images_noted = past_image_tokens > limits.max_image_tokens
        kept.append(noted(turn, drop_images=images_noted))
    return tuple(item for turn in reversed(kept) for item in turn) + current


def noted(items: Sequence[ConversationItem], *, drop_images: bool) -> tuple[ConversationItem, ...]:
    """``items`` with each image replaced by ``IMAGE_NOTE`` when ``drop_images``, and each run of
    notes (a camera turn's frames; a history that dropped images one by one) written once."""
    note = UserText(IMAGE_NOTE)
    kept: list[ConversationItem] = []
    for item in items:
        if drop_images and isinstance(item, UserImage):
            item = note
        if not (item == note and kept and kept[-1] == note):
            kept.append(item)
    return tuple(kept)


def asr_instruction(language: str | None) -> str:
    """Qwen3-Omni's ASR prompt for ``language`` (ISO-639-1; an unknown one gets the generic prompt)."""
    code = (language or "").strip().lower()
    if code == "zh":
        return ASR_PROMPT_CHINESE
    name = ASR_LANGUAGES.get(code)
    return ASR_PROMPT if name is None else ASR_PROMPT_FOR_LANGUAGE.format(language=name)
