"""A turn as one streaming chat completion of a vLLM-Omni server, and that stream read back.

Written from reading vllm-omni 0.32.0rc1 (``vllm_omni/entrypoints/openai/serving_chat.py``,
``protocol/audio.py``, ``audio_utils_mixin.py``, ``api_server.py``,
``model_executor/models/qwen3_omni/tool_speech.py``) and vLLM 0.32.0's ``ChatCompletionRequest``
(``vllm/entrypoints/openai/chat_completion/protocol.py``) and Hermes tool parser
(``vllm/tool_parsers/hermes_tool_parser.py``); nothing is copied from them. docs/VLLM_OMNI.md lists
what each field maps to, what changed since vllm-omni 0.30.0 and what was decided.

The request (:func:`chat_request`):

- ``messages``: the session's instructions (or Qwen3-Omni's spoken-chat prompt) as the system
  message; each user turn one user message, its clips as ``input_audio`` parts (base64 WAV,
  16 kHz PCM16), its images as ``image_url`` parts (a data URL of the image as the session kept
  it, already fitted to its pixel budget) and its text as ``text`` parts, in order; each earlier answer an assistant
  message holding its text as heard, which the function calls after it join (``tool_calls``,
  with the session's call ids); each function output a ``tool`` message (``tool_call_id``). The
  history is bounded as for the in-process engine (:func:`pipeline.conversation.bound_history`).
  A transcription is Qwen3-Omni's ASR prompt: the clip, then the instruction, with the client's
  hint prompt (if any) as the system message.
- ``modalities``: ``["text", "audio"]``, or ``["text"]`` for text-only answers and
  transcriptions (vLLM-Omni then runs the Thinker stage only). Not a field of vLLM's
  ``ChatCompletionRequest``: it keeps unknown fields, and serving_chat reads this one.
- ``speaker``: the voice, another extra field serving_chat reads (``voice`` or ``speaker``) and
  checks against the checkpoint's Talker speakers.
- ``temperature``, ``max_tokens`` and ``seed``: serving_chat overrides the Thinker stage's
  deploy defaults with the sampling fields a request sets explicitly, ``max_tokens`` among them
  (``max_completion_tokens`` is not); the Talker and Code2Wav keep their deploy defaults.
- ``stream: true`` with ``stream_options.include_usage``: the usage chunk comes last.
- ``tools`` (OpenAI's chat-completions form) with ``tool_choice: "auto"`` while the conversation
  offers tools; with ``tool_choice`` ``none`` neither (the in-process prompt then has no tool
  block either). The server parses the Thinker's ``<tool_call>`` with the tool parser it was
  started with (``--enable-auto-tool-choice --tool-call-parser hermes``). A turn that must call
  (``required``, a named function) is one no session sends to this engine (it declares no
  ``forced_function_calls``): vLLM forces those with structured output, without the
  ``<tool_call>`` token at which vLLM-Omni stops the Talker, so the call's JSON would be spoken.
  Given one, this raises :class:`ToolsUnsupported`.

The stream (:func:`read_chunk`): server-sent events, each ``data:`` one JSON chunk, then
``data: [DONE]``. A chunk's top-level ``modality`` says what ``choices[0].delta.content`` holds:
``"text"``, the new answer text (the first one carries ``role`` and ``""``); ``"audio"``, base64 of
a whole WAV file (PCM16, 24 kHz mono for Qwen3-Omni) holding the newest piece of the answer's
audio, described by ``choices[0].audio_metadata`` (:func:`decode_audio` takes nothing else, and
checks the header before it reads a sample). A text chunk may instead carry
``delta.tool_calls`` (the Hermes parser's stream: each call's first delta has its ``index``,
``id``, ``type`` and ``function.name``, later ones ``index`` and a fragment of
``function.arguments``), read as :class:`ToolCallPiece`. The usage chunk has
``choices: []`` and no ``modality``. An error mid-stream is a chunk ``{"error": {...}}``, then
``[DONE]``. The events are read by :class:`EventStream`, every line bounded.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np
import soundfile
from pydantic import BaseModel, ValidationError

from media.rates import SPEECH_RATE, VOICE_RATE
from pipeline.contract import GenerationRequest, TranscriptionHint
from pipeline.conversation import (
    AssistantText,
    ConversationItem,
    UserAudio,
    UserImage,
    UserText,
    asr_instruction,
    bound_history,
)
from pipeline.token_count import PromptTooLong, prompt_tokens_at_most
from pipeline.tool_format import FunctionCall, FunctionOutput, Tool, ToolChoice, offers_tools

DONE = "[DONE]"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# vLLM-Omni's deploy config sends audio in chunks of 4 codec frames, then 25 (2 s); a chunk of
# 30 s is 15 times that, and the most decoded at once: 1.4 MB of PCM16, 2.9 MB as float32.
MAX_AUDIO_CHUNK_SECONDS = 30
_WAV_HEADER_ROOM = 4_096  # RIFF, fmt, and any LIST chunk a writer adds before the data
MAX_AUDIO_CONTENT_CHARS = 4 * math.ceil((_WAV_HEADER_ROOM + MAX_AUDIO_CHUNK_SECONDS * VOICE_RATE * 2) / 3)
# One server-sent event line: the largest audio chunk's base64 and its JSON, with room (4 MiB).
MAX_EVENT_LINE_BYTES = 4 * 1024 * 1024


def chat_request(request: GenerationRequest, *, model: str | None = None, seed: int | None = None) -> dict[str, Any]:
    """The body of ``POST /v1/chat/completions`` that runs ``request`` as one streaming turn.

    ``model`` None leaves the choice to the server (vLLM serves its one model for a request
    without one); ``seed`` makes the Thinker's sampling reproducible.
    """
    body: dict[str, Any] = {}
    if model is not None:
        body["model"] = model
    body["messages"] = _messages(request)
    tools = _offered_tools(request)
    if tools:
        body["tools"] = [_tool(tool) for tool in tools]
        body["tool_choice"] = "auto"
    body["modalities"] = ["text", "audio"] if request.output_audio else ["text"]
    if request.output_audio:
        body["speaker"] = request.voice
    body["temperature"] = request.temperature
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if seed is not None:
        body["seed"] = seed
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


def encode_chat_request(request: GenerationRequest, *, model: str | None = None, seed: int | None = None) -> bytes:
    """:func:`chat_request` as UTF-8 JSON (a few MB for long audio: build it off the event loop)."""
    return json.dumps(chat_request(request, model=model, seed=seed), ensure_ascii=False).encode()


class ToolsUnsupported(ValueError):
    """A turn whose ``tool_choice`` forces a call, which this client does not send to vLLM-Omni (a
    caller's mistake: ``VllmOmniEngine.capabilities`` says so)."""


def _offered_tools(request: GenerationRequest) -> tuple[Tool, ...]:
    """The tools the answer may call (none for a transcription, or with ``tool_choice`` none)."""
    conversation = request.conversation
    if request.task != "respond" or not offers_tools(conversation.tools, conversation.tool_choice):
        return ()
    if conversation.tool_choice != ToolChoice("auto"):
        raise ToolsUnsupported(f"tool_choice {conversation.tool_choice.mode!r} is not sent to vLLM-Omni servers")
    return conversation.tools


def _tool(tool: Tool) -> dict[str, Any]:
    """A tool in the chat-completions form (``{"type": "function", "function": {…}}``)."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = dict(tool.parameters)
    return {"type": "function", "function": function}


def _messages(request: GenerationRequest) -> list[dict[str, Any]]:
    """The prompt as chat messages, grouped as the in-process renderer groups them
    (``pipeline.local.prompt``): consecutive user items are one user message; an answer opens an
    assistant message that the function calls right after it join (a call with no answer before
    it opens one with empty content); each function output is a ``tool`` message."""
    system_prompt, items = _prompt(request)
    messages: list[dict[str, Any]] = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    user_items: list[ConversationItem] = []
    assistant: dict[str, Any] | None = None  # the assistant message calls would join
    for item in items:
        if isinstance(item, UserAudio | UserText | UserImage):
            user_items.append(item)
            assistant = None
            continue
        if user_items:
            messages.append(_user_message(user_items))
            user_items = []
        if isinstance(item, AssistantText):
            assistant = {"role": "assistant", "content": item.text}
            messages.append(assistant)
        elif isinstance(item, FunctionCall):
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                messages.append(assistant)
            assistant.setdefault("tool_calls", []).append(_tool_call(item))
        elif isinstance(item, FunctionOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
            assistant = None
        else:
            raise TypeError(f"not a conversation item: {item!r}")
    if user_items:
        messages.append(_user_message(user_items))
    return messages


def _tool_call(call: FunctionCall) -> dict[str, Any]:
    """A call in an assistant message: its arguments as written (vLLM reads them as JSON for the
    chat template, and writes arguments that are not a JSON object as ``{}``)."""
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _prompt(request: GenerationRequest) -> tuple[str | None, tuple[ConversationItem, ...]]:
    """The system message (None: none) and the items of the prompt ``request`` sends."""
    conversation = request.conversation
    if request.task == "transcribe":
        clips = [item for item in request.conversation.items if isinstance(item, UserAudio)]
        if len(clips) != 1 or len(request.conversation.items) != 1:
            raise ValueError(
                f"a transcription turn takes one audio clip and nothing else, got {len(request.conversation.items)} items"
            )
        hint = request.hint or TranscriptionHint()
        return hint.prompt or None, (UserAudio(clips[0].pcm), UserText(asr_instruction(hint.language)))
    return conversation.system_prompt, bound_history(conversation)


def check_prompt_length(request: GenerationRequest, limit: int) -> None:
    """``PromptTooLong`` when the prompt ``request`` sends may be longer than ``limit`` tokens
    (``pipeline.token_count``: exact for audio and images, text counted once its bytes pass the
    limit; the server's chat template may add or save a few framing tokens). Blocking when counted."""
    system_prompt, items = _prompt(request)
    tokens = prompt_tokens_at_most(system_prompt, items, limit, _offered_tools(request))
    if tokens > limit:
        raise PromptTooLong(f"the prompt is {tokens} tokens; this engine takes at most {limit}")


def _user_message(items: list[ConversationItem]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, UserAudio):
            parts.append({"type": "input_audio", "input_audio": {"data": wav_base64(item.pcm), "format": "wav"}})
        elif isinstance(item, UserText):
            parts.append({"type": "text", "text": item.text})
        elif isinstance(item, UserImage):
            parts.append({"type": "image_url", "image_url": {"url": image_data_url(item.data)}})
        else:
            raise TypeError(f"not a user item: {item!r}")
    return {"role": "user", "content": parts}


def image_data_url(data: bytes) -> str:
    """A kept image (PNG or JPEG, ``pipeline.images``) as the data URL vLLM's ``image_url`` takes."""
    mime = "image/png" if data.startswith(PNG_SIGNATURE) else "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def wav_base64(pcm16k: np.ndarray) -> str:
    """A 16 kHz float32 clip as base64 of a PCM16 WAV file (what ``input_audio`` carries)."""
    buffer = io.BytesIO()
    soundfile.write(buffer, np.clip(pcm16k, -1.0, 1.0), SPEECH_RATE, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# -- the stream ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class AudioPiece:
    pcm: np.ndarray  # float32 mono at 24 kHz


@dataclass(frozen=True)
class UsagePiece:
    prompt_tokens: int
    completion_tokens: int  # the Thinker's text tokens
    # prompt_tokens_details.multimodal_tokens["audio"]: sent by servers started with
    # --enable-prompt-tokens-details, else None.
    audio_prompt_tokens: int | None = None


@dataclass(frozen=True)
class FinishPiece:
    reason: str  # a choice's finish_reason: "stop", "length", "tool_calls", ...


@dataclass(frozen=True)
class ToolCallPiece:
    """One entry of ``delta.tool_calls``: call ``index`` (0-based in the answer) begins with the
    function ``name`` (the call's first delta), or goes on (``name`` None); ``arguments``: the
    next fragment of its arguments' JSON text ("" for none)."""

    index: int
    name: str | None
    arguments: str


StreamPiece = TextPiece | AudioPiece | UsagePiece | FinishPiece | ToolCallPiece


class MalformedChunk(ValueError):
    """A chunk that is not what serving_chat sends."""


class ServerError(Exception):
    """The server reported an error in the stream (``{"error": {...}}``); the message is the server's."""


class _DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class _DeltaToolCall(BaseModel):
    index: int
    function: _DeltaFunction | None = None


class _Delta(BaseModel):
    content: str | None = None
    # vLLM's DeltaMessage drops an empty list from the chunk: absent means none.
    tool_calls: list[_DeltaToolCall] | None = None


class _Choice(BaseModel):
    delta: _Delta
    finish_reason: str | None = None


class _PromptTokensDetails(BaseModel):
    multimodal_tokens: dict[str, int] | None = None


class _Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: _PromptTokensDetails | None = None


class _Chunk(BaseModel):
    """The fields of ``OmniChatCompletionStreamResponse`` read here (others are ignored)."""

    choices: list[_Choice]
    # OmniChatCompletionStreamResponse's default; dumped with exclude_unset, so absent when unset.
    modality: str | None = "text"
    usage: _Usage | None = None


class _ErrorChunk(BaseModel):
    error: dict[str, Any]


def read_chunk(data: str) -> list[StreamPiece]:
    """One ``data:`` payload (not ``[DONE]``) as the pieces it holds, in order.

    Raises :class:`MalformedChunk` for anything serving_chat would not send, and
    :class:`ServerError` for the server's error chunk.
    """
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        raise MalformedChunk(f"not JSON: {exc}") from None
    if isinstance(raw, dict) and "error" in raw and "choices" not in raw:
        try:
            error = _ErrorChunk.model_validate(raw).error
        except ValidationError:
            raise MalformedChunk("an error chunk without an error object") from None
        raise ServerError(str(error.get("message", error)))
    try:
        chunk = _Chunk.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise MalformedChunk(f"not a chat.completion.chunk: {first['msg']} at {first['loc']}") from None
    pieces: list[StreamPiece] = []
    for choice in chunk.choices[:1]:  # n is 1: one answer
        content = choice.delta.content
        if chunk.modality == "audio":
            if content:
                pieces.append(AudioPiece(decode_audio(content)))
        elif chunk.modality == "text":
            if content:
                pieces.append(TextPiece(content))
            for call in choice.delta.tool_calls or ():
                function = call.function or _DeltaFunction()
                pieces.append(ToolCallPiece(call.index, function.name, function.arguments or ""))
        else:
            raise MalformedChunk(f"a chunk of modality {chunk.modality!r}")
        if choice.finish_reason is not None:
            pieces.append(FinishPiece(choice.finish_reason))
    if chunk.usage is not None and not chunk.choices:  # the last chunk; audio chunks repeat the prompt's usage
        details = chunk.usage.prompt_tokens_details
        audio_tokens = (details.multimodal_tokens or {}).get("audio") if details is not None else None
        pieces.append(UsagePiece(chunk.usage.prompt_tokens, chunk.usage.completion_tokens or 0, audio_tokens))
    return pieces


def decode_audio(content: str) -> np.ndarray:
    """An audio delta (base64 of a WAV file) as float32 mono at 24 kHz.

    Only what serving_chat sends is decoded: a PCM16 mono WAV at 24 kHz of at most
    ``MAX_AUDIO_CHUNK_SECONDS``, its size checked from the base64 length and its header (rate,
    channels, sample format, length) before the samples are read. Any other format is refused
    unread: the link to vLLM-Omni is often plain HTTP, and 58 KB of FLAC decoded whole took 55 MB
    in the front process, which holds every call."""
    if len(content) > MAX_AUDIO_CONTENT_CHARS:
        raise MalformedChunk(f"an audio chunk of {len(content)} base64 characters; at most {MAX_AUDIO_CONTENT_CHARS}")
    try:
        encoded = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedChunk("audio content is not base64") from None
    try:
        with wave.open(io.BytesIO(encoded)) as sound:
            rate, channels, width, frames = (
                sound.getframerate(), sound.getnchannels(), sound.getsampwidth(), sound.getnframes()
            )
            # Qwen3-Omni's Code2Wav speaks 24 kHz mono, which serving_chat writes as PCM_16.
            if (rate, channels, width) != (VOICE_RATE, 1, 2):
                raise MalformedChunk(
                    f"audio at {rate} Hz, {channels} channels, {8 * width}-bit; expected {VOICE_RATE} Hz mono PCM16"
                )
            if frames > MAX_AUDIO_CHUNK_SECONDS * VOICE_RATE:
                raise MalformedChunk(f"an audio chunk of {frames / VOICE_RATE:.1f} s; at most {MAX_AUDIO_CHUNK_SECONDS} s")
            data = sound.readframes(frames)
    except (wave.Error, EOFError) as exc:  # not RIFF/WAVE, not PCM, or cut inside its header
        raise MalformedChunk(f"audio content is not a PCM WAV file: {exc}") from None
    return np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0


class EventStreamTooLarge(MalformedChunk):
    """A server-sent event line (or event) longer than ``MAX_EVENT_LINE_BYTES``."""


class EventStream:
    """Server-sent events read from the body's bytes, each event's ``data`` as one string.

    Every line is bounded (``MAX_EVENT_LINE_BYTES``, and one event's data lines together): a
    line that never ends would otherwise grow until memory runs out, as an SSE reader that
    reads whole lines does. The WHATWG rules that serving_chat's stream needs: ``data:`` lines
    (one leading space dropped) joined by newlines, a blank line ends the event, comments and
    other fields ignored; lines end with LF or CRLF (a lone CR, which no server here sends, is
    not a line end).
    """

    def __init__(self, max_line_bytes: int = MAX_EVENT_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._pending = bytearray()
        self._data: list[bytes] = []
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> list[str]:
        """The events ``chunk`` completes; ``EventStreamTooLarge`` past the bound."""
        self._pending += chunk
        events: list[str] = []
        while (end := self._pending.find(b"\n")) >= 0:
            line = bytes(self._pending[:end]).removesuffix(b"\r")
            del self._pending[: end + 1]
            event = self._line(line)
            if event is not None:
                events.append(event)
        if len(self._pending) > self._max:
            raise EventStreamTooLarge(f"a server-sent event line past {self._max} bytes")
        return events

    def _line(self, line: bytes) -> str | None:
        if not line:
            if not self._data:
                return None
            data = b"\n".join(self._data).decode("utf-8", errors="replace")
            self._data, self._data_bytes = [], 0
            return data
        name, _, value = line.partition(b":")
        if name == b"data":
            value = value.removeprefix(b" ")
            self._data_bytes += len(value) + 1
            if self._data_bytes > self._max:
                raise EventStreamTooLarge(f"a server-sent event past {self._max} bytes")
            self._data.append(value)
        return None
