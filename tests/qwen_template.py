"""Qwen3-Omni's own chat template (tests/fixtures/qwen3_omni/) and conversations written twice:
as the renderer's ``Conversation`` and as the chat-completions messages Qwen's examples and
vLLM-Omni hand the template (content as a list of parts).

tests/pipeline/local/test_prompt.py renders them through the fixture; scripts/gpu_check.py
through a real checkpoint's processor. Audio is read with the standard library (the GPU image
has no soundfile).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.contract import GenerationRequest
from pipeline.conversation import DEFAULT_SYSTEM_PROMPT, AssistantText, Conversation, UserAudio, UserImage, UserText
from pipeline.tool_format import FunctionCall, FunctionOutput, Tool
from tests.bench.harness import read_wav
from tests.pictures import encoded

FIXTURES = Path(__file__).resolve().parent / "fixtures"
QWEN_FILES = FIXTURES / "qwen3_omni"
QWEN_TEMPLATE = (QWEN_FILES / "chat_template.jinja").read_text()
AUDIO_PAD, IMAGE_PAD = "<|audio_pad|>", "<|image_pad|>"
PLACEHOLDER = re.compile(re.escape(AUDIO_PAD) + "|" + re.escape(IMAGE_PAD))
CAMERA_PIXELS = 200_704  # 448 x 448: a 512x384 frame keeps its size (the processor's own budget would too)

GET_TIME = Tool(
    name="get_time",
    description="The current local time in a timezone.",
    parameters={"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
)
WEATHER = Tool(name="weather", description="Météo du jour.", parameters={"type": "object", "properties": {}})


@dataclass(frozen=True)
class TemplateCase:
    """One prompt as the renderer takes it (``request``) and as the template takes it."""

    request: GenerationRequest
    messages: list[dict]
    tools: tuple[Tool, ...] = ()

    @property
    def clips(self) -> list[UserAudio]:
        return [item for item in self.request.conversation.items if isinstance(item, UserAudio)]

    @property
    def images(self) -> list[UserImage]:
        return [item for item in self.request.conversation.items if isinstance(item, UserImage)]

    def tool_dicts(self) -> list[dict] | None:
        """The tools as a chat-completions request lists them (None: no tools)."""
        return [
            {"type": "function",
             "function": {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}}
            for tool in self.tools
        ] or None


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


AUDIO_PART, IMAGE_PART = {"type": "audio", "audio": "clip.wav"}, {"type": "image", "image": "frame.jpg"}


def speech(name: str) -> UserAudio:
    return UserAudio(read_wav(FIXTURES / f"{name}.wav"))


def camera_frame(seed: int) -> UserImage:
    return UserImage(encoded(512, 384, seed=seed), 512, 384, CAMERA_PIXELS)


def call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def spoken_history() -> TemplateCase:
    items = (speech("weather"), UserText("Is it sunny?"), AssistantText("Sunny, 21 °C."),
             UserText("Thanks! And tomorrow?"), speech("hello"))
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": [AUDIO_PART, text_part("Is it sunny?")]},
        {"role": "assistant", "content": "Sunny, 21 °C."},
        {"role": "user", "content": [text_part("Thanks! And tomorrow?"), AUDIO_PART]},
    ]
    return TemplateCase(GenerationRequest(Conversation(items)), messages)


def typed_history() -> TemplateCase:
    # String content, as a chat-completions client writes typed turns: the template's last-query
    # bookkeeping reads it; it renders as a list of one text part renders.
    items = (UserText("hi there"), AssistantText("Hello! How can I help?"), UserText("What is 2+2?"),
             AssistantText("4."), UserText("Thanks. One more?"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "Thanks. One more?"},
    ]
    return TemplateCase(GenerationRequest(Conversation(items, instructions="Be brief.")), messages)


def camera_history() -> TemplateCase:
    items = (camera_frame(1), camera_frame(2), speech("hello"), UserText("What is this?"),
             AssistantText("Two lamps."), camera_frame(3), UserText("And now?"))
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": [IMAGE_PART, IMAGE_PART, AUDIO_PART, text_part("What is this?")]},
        {"role": "assistant", "content": "Two lamps."},
        {"role": "user", "content": [IMAGE_PART, text_part("And now?")]},
    ]
    return TemplateCase(GenerationRequest(Conversation(items)), messages)


def tool_history() -> TemplateCase:
    items = (
        UserText("What time is it in Paris, and the weather?"),
        FunctionCall("c1", "get_time", '{"timezone": "Europe/Paris"}'),
        FunctionCall("c2", "weather", "{}"),
        FunctionOutput("c1", '{"time": "12:00"}'),
        FunctionOutput("c2", "Sunny."),
        AssistantText("Noon, and sunny."),
        UserText("And in Tokyo?"),
        AssistantText("Let me look."),
        FunctionCall("c3", "get_time", '{"timezone": "Asia/Tokyo"}'),
        FunctionOutput("c3", '{"time": "20:00"}'),
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [text_part("What time is it in Paris, and the weather?")]},
        {"role": "assistant", "content": "",
         "tool_calls": [call("get_time", {"timezone": "Europe/Paris"}), call("weather", {})]},
        {"role": "tool", "content": '{"time": "12:00"}'},
        {"role": "tool", "content": "Sunny."},
        {"role": "assistant", "content": "Noon, and sunny."},
        {"role": "user", "content": [text_part("And in Tokyo?")]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call("get_time", {"timezone": "Asia/Tokyo"})]},
        {"role": "tool", "content": '{"time": "20:00"}'},
    ]
    tools = (GET_TIME, WEATHER)
    return TemplateCase(GenerationRequest(Conversation(items, instructions="Be brief.", tools=tools)), messages, tools)


def transcription() -> TemplateCase:
    """No system message: Qwen's ASR setting."""
    messages = [{"role": "user", "content": [AUDIO_PART, text_part("Transcribe the audio into text.")]}]
    return TemplateCase(GenerationRequest.transcription(speech("hello")), messages)


def answer_last() -> TemplateCase:
    """The prompt ends with the assistant's own message (a response asked for without new input)."""
    items = (UserText("Tell me a joke."), AssistantText("Why did the chicken cross the road?"))
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": [text_part("Tell me a joke.")]},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
    ]
    return TemplateCase(GenerationRequest(Conversation(items)), messages)


# The five the device check compares with a real processor; the tests take these and answer_last.
FIVE_CONVERSATIONS: dict[str, Callable[[], TemplateCase]] = {
    "audio and history": spoken_history,
    "typed history": typed_history,
    "images": camera_history,
    "tools": tool_history,
    "transcription": transcription,
}


def template_text(tokenizer, case: TemplateCase, chat_template: str = QWEN_TEMPLATE) -> str:
    """The template's prompt for ``case``, rendered by transformers' ``apply_chat_template`` (its
    Jinja environment and globals: ``tojson``, ``raise_exception``)."""
    return tokenizer.apply_chat_template(
        case.messages, tools=case.tool_dicts(), chat_template=chat_template, tokenize=False, add_generation_prompt=True
    )


def expand_placeholders(text: str, pad_runs: list[tuple[str, int]]) -> str:
    """``text`` with its n-th placeholder repeated as the n-th run says (the processor's expansion)."""
    runs = iter(pad_runs)

    def expand(placeholder: re.Match) -> str:
        token, count = next(runs)
        if token != placeholder.group():
            raise ValueError(f"placeholder {placeholder.group()} where the renderer has a run of {token}")
        return token * count

    expanded = PLACEHOLDER.sub(expand, text)
    if next(runs, None) is not None:
        raise ValueError("the renderer has more pad runs than the template has placeholders")
    return expanded


def pad_runs(tokenizer, ids: list[int]) -> list[tuple[str, int]]:
    """Each run of ``<|audio_pad|>`` or ``<|image_pad|>`` in ``ids``, in order, with its length."""
    pads = {tokenizer.convert_tokens_to_ids(AUDIO_PAD): AUDIO_PAD, tokenizer.convert_tokens_to_ids(IMAGE_PAD): IMAGE_PAD}
    return [(pads[token], len(list(run))) for token, run in itertools.groupby(ids) if token in pads]
