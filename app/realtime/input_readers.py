"""The readers of what a client sends as input: a ``conversation.item.create``'s content (text,
base64 audio in the session's input format, already-read images) turned into items, and the
checked text of any field, each raising :class:`ProtocolError` naming the ``param``."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence

import numpy as np
import soxr

from app.realtime.entries import AssistantEntry
from app.realtime.protocol import (
    ClientContentPart,
    InputAudioContent,
    InputImageContent,
    InputTextContent,
    ItemContent,
    ProtocolError,
)
from app.realtime.session_config import Modality
from media import g711
from media.rates import SPEECH_RATE, VOICE_RATE
from pipeline.conversation import ConversationItem, UserAudio, UserImage, UserText

MIN_COMMIT_MS = 100  # OpenAI refuses to commit (or take as an item) less than 100 ms of audio


def base64_decoded_size(data: str) -> int:
    """The bytes ``data`` decodes to, read off its length: 3 for each 4 characters, less one for
    each ``=`` of padding (1 s of G.711 is 8,000 bytes, 10,668 characters with one ``=``)."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def decode_pcm16(data: str, param: str) -> np.ndarray:
    """Base64 PCM16 little-endian mono → float32 in [-1, 1); ``ProtocolError`` naming ``param``."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    if len(raw) % 2:
        raise ProtocolError("invalid_value", f"{param} is not whole PCM16 samples (odd byte count).", param=param)
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def decode_input_audio(
    data: str, format_type: str, param: str, *, pcm_rate: int = VOICE_RATE
) -> tuple[np.ndarray, int]:
    """Base64 audio in the session's input format → (float32 PCM, its rate): ``audio/pcm`` is PCM16
    at ``pcm_rate`` (24 kHz unless the session says otherwise), ``audio/pcmu`` / ``audio/pcma``
    G.711 at 8 kHz; ``ProtocolError`` naming ``param``."""
    if format_type not in g711.G711_FORMATS:
        return decode_pcm16(data, param), pcm_rate
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    return g711.decode(raw, format_type), g711.G711_RATE


def read_item_audio(
    content: Sequence[ClientContentPart], *, input_audio_format: str, max_seconds: float,
    input_audio_rate: int = VOICE_RATE,
) -> dict[int, UserAudio]:
    """A user message's ``input_audio`` parts, by part index, as 16 kHz clips; blocking (decoding
    and resampling: call it off the loop). ``input_audio_rate``: the rate of ``audio/pcm`` input.
    Their length is checked from the base64 before any is decoded: the message's audio together is
    at most ``max_seconds`` (one turn's worth, ``HistoryLimits.max_audio_seconds``)."""
    indexed = [(index, part) for index, part in enumerate(content) if part.type == "input_audio"]
    rate, sample_bytes = (g711.G711_RATE, 1) if input_audio_format in g711.G711_FORMATS else (input_audio_rate, 2)
    seconds = 0.0
    for index, part in indexed:
        param = f"item.content[{index}].audio"
        if part.audio is None:
            raise ProtocolError("missing_required_parameter", f"{param} is required.", param=param)
        seconds += base64_decoded_size(part.audio) / sample_bytes / rate
        if seconds > max_seconds:
            raise ProtocolError(
                "invalid_value", f"{param}: the message's audio passes {max_seconds:g} s (one turn's most).", param=param
            )
    clips: dict[int, UserAudio] = {}
    for index, part in indexed:
        param = f"item.content[{index}].audio"
        assert part.audio is not None  # checked above
        pcm, rate = decode_input_audio(part.audio, input_audio_format, param, pcm_rate=input_audio_rate)
        if pcm.size < MIN_COMMIT_MS * rate // 1000:
            raise ProtocolError("invalid_value", f"{param} holds less than {MIN_COMMIT_MS} ms.", param=param)
        clips[index] = UserAudio(soxr.resample(pcm, rate, SPEECH_RATE).astype(np.float32))
    return clips


def checked_text(text: str | None, param: str, *, max_chars: int) -> str:
    if text is None:
        raise ProtocolError("missing_required_parameter", f"{param} is required.", param=param)
    if len(text) > max_chars:
        raise ProtocolError("invalid_value", f"{param} is longer than {max_chars} characters.", param=param)
    return text


def read_user_content(
    content: list[ClientContentPart],
    *,
    max_chars: int,
    images: Mapping[int, UserImage],
    audio: Mapping[int, UserAudio],
) -> tuple[tuple[ConversationItem, ...], list[ItemContent]]:
    """A user message's parts (for the prompt) and its content (as echoed to the client);
    ``images`` and ``audio``: its ``input_image`` and ``input_audio`` parts by index, already
    read (``app.realtime.input_images``, :func:`read_item_audio`)."""
    parts: list[ConversationItem] = []
    echoed: list[ItemContent] = []
    for index, part in enumerate(content):
        param = f"item.content[{index}]"
        if part.type == "input_text":
            text = checked_text(part.text, f"{param}.text", max_chars=max_chars)
            parts.append(UserText(text))
            echoed.append(InputTextContent(text=text))
        elif part.type == "input_audio" and index in audio:
            parts.append(audio[index])
            echoed.append(InputAudioContent(transcript=part.transcript))
        elif part.type == "input_image" and index in images:
            parts.append(images[index])
            echoed.append(InputImageContent(detail=part.detail or "auto"))
        else:
            raise ProtocolError(
                "invalid_value", f"A user message takes input_text, input_audio or input_image, not {part.type}.",
                param=f"{param}.type",
            )
    return tuple(parts), echoed


def read_assistant_item(item_id: str, content: list[ClientContentPart], *, max_chars: int) -> AssistantEntry:
    """A client-created assistant message: heard in full (the client says it was said)."""
    if len(content) != 1:
        raise ProtocolError("invalid_value", "An assistant message takes exactly one content part.",
                            param="item.content")
    part = content[0]
    if part.type in ("output_text", "text"):
        modality: Modality = "text"
        text = part.text
    else:
        if part.type not in ("output_audio", "audio"):
            raise ProtocolError("invalid_value", f"An assistant message takes output_text or output_audio, "
                                f"not {part.type}.", param="item.content[0].type")
        modality = "audio"
        text = part.transcript
    param = "item.content[0].text" if modality == "text" else "item.content[0].transcript"
    text = checked_text(text, param, max_chars=max_chars)
    entry = AssistantEntry(item_id, modality, status="completed", heard=text)
    entry.add_delta(text)
    return entry
