"""The DashScope dialect: Qwen's own realtime clients on this server.

Alibaba's DashScope SDK and its hosted ``qwen-omni-*-realtime`` API speak OpenAI's Realtime
protocol as it was in its beta. A session in this dialect is the same ``RealtimeSession``; the
dialect is a mapping at its edges: :meth:`DashScopeDialect.session_fields` maps every
``session.update``'s fields in (before the session's tolerant reader),
:meth:`DashScopeDialect.server_event` maps every sent event's names and session out, and
:meth:`DashScopeDialect.initial_config` holds DashScope's documented defaults. What maps to what,
and why: docs/DASHSCOPE.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from app.realtime.protocol import (
    DASHSCOPE_EVENT_NAMES,
    DASHSCOPE_UNSENT,
    ConversationItemAddedEvent,
    ConversationItemRetrievedEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
    event_type,
    invalid_value,
)
from app.realtime.session_config import (
    INPUT_PCM_RATES,
    MAX_OUTPUT_TOKENS_LIMIT,
    OPENAI_VOICES,
    InputTranscription,
    SessionConfig,
)
from pipeline.contract import VOICES, Voice

# DashScope's voices (Qwen-Omni-Turbo-Realtime's Chelsie, Serena, Ethan, Cherry, from Model Studio's
# SDK page, and the longer Qwen3-Omni-Flash / Qwen3-TTS list as docs/DASHSCOPE.md sources it), by lower-cased
# name → the served Qwen3-Omni speaker nearest to it: female voices speak as chelsie, male ones as
# ethan, Aiden as aiden (Qwen3-Omni's open checkpoint has these three speakers; DashScope's
# Chelsie, Ethan and Aiden are the same names).
_FEMALE = (
    "cherry", "serena", "chelsie", "momo", "vivian", "maia", "bella", "bunny", "jennifer", "katerina", "mia",
    "bellona", "elias", "nini", "ebona", "stella", "sonrisa", "sohee", "ono anna", "seren", "jada", "sunny", "kiki",
)
_MALE = (
    "ethan", "moon", "kai", "nofish", "ryan", "mochi", "vincent", "neil", "bodega", "alek", "dolce", "lenn",
    "emilien", "andre", "radio gol", "pip", "eldric sage", "arthur", "dylan", "li", "marcus", "roy", "peter",
    "eric", "rocky",
)
DASHSCOPE_VOICES: dict[str, Voice] = {
    **{name: "chelsie" for name in _FEMALE},
    **{name: "ethan" for name in _MALE},
    "aiden": "aiden",
}

# DashScope's VAD threshold runs from -1 to 1 (its SDK: "increase it in a noisy environment,
# decrease it in a quiet one"; default 0.2), ours is silero's speech probability (0, 1), default
# 0.5. How DashScope's scale relates to a probability is not documented, so *decided*: piecewise
# linear, the SDK's default on ours (0.2 → 0.5, the value turn taking is tuned at), -1 → 0.1 and
# 1 → 0.95 (the ends of silero's useful range), monotone as DashScope describes it.
DASHSCOPE_THRESHOLD_RANGE = (-1.0, 1.0)
_DEFAULT_DASHSCOPE_THRESHOLD = 0.2
_DEFAULT_THRESHOLD = 0.5
_LOWEST_THRESHOLD = 0.1
_HIGHEST_THRESHOLD = 0.95
# DashScope's documented session defaults (its session.created): 16 kHz PCM16 in, 24 kHz out,
# barge-in on, an 800 ms silence wait, the user's speech transcribed.
DASHSCOPE_INPUT_RATE = 16_000
DASHSCOPE_SILENCE_DURATION_MS = 800
# DashScope's flat audio format names. Its SDK names both of its formats (16 kHz and 24 kHz)
# "pcm16" (``AudioFormat.format_str``, "16-bit"), so its default output format is "pcm16" too:
# DashScope's output is 24 kHz PCM16 whatever it is called.
_INPUT_FORMATS = ("pcm16", "pcm")
_OUTPUT_FORMATS = ("pcm24", "pcm16", "pcm")
_NEW_STYLE_PCM = ("pcm", "audio/pcm")
_G711_NAMES = {"audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}

_SESSION_EVENTS = (event_type(SessionCreatedEvent), event_type(SessionUpdatedEvent))
_ITEM_EVENTS = tuple(
    event_type(event)
    for event in (
        ConversationItemAddedEvent, ConversationItemRetrievedEvent, ResponseOutputItemAddedEvent,
        ResponseOutputItemDoneEvent,
    )
)
_RESPONSE_EVENTS = (event_type(ResponseCreatedEvent), event_type(ResponseDoneEvent))
# An assistant item's parts as the beta named them.
_PART_TYPES = {"output_audio": "audio", "output_text": "text"}


def vad_threshold(dashscope: float) -> float:
    """DashScope's VAD threshold (-1 to 1) as silero's speech probability (see above)."""
    if dashscope <= _DEFAULT_DASHSCOPE_THRESHOLD:
        low = DASHSCOPE_THRESHOLD_RANGE[0]
        slope = (_DEFAULT_THRESHOLD - _LOWEST_THRESHOLD) / (_DEFAULT_DASHSCOPE_THRESHOLD - low)
    else:
        high = DASHSCOPE_THRESHOLD_RANGE[1]
        slope = (_HIGHEST_THRESHOLD - _DEFAULT_THRESHOLD) / (high - _DEFAULT_DASHSCOPE_THRESHOLD)
    return _DEFAULT_THRESHOLD + (dashscope - _DEFAULT_DASHSCOPE_THRESHOLD) * slope


def dashscope_threshold(threshold: float) -> float:
    """Silero's threshold on DashScope's scale: the inverse of :func:`vad_threshold`, clamped to it."""
    low, high = DASHSCOPE_THRESHOLD_RANGE
    if threshold <= _DEFAULT_THRESHOLD:
        slope = (_DEFAULT_THRESHOLD - _LOWEST_THRESHOLD) / (_DEFAULT_DASHSCOPE_THRESHOLD - low)
    else:
        slope = (_HIGHEST_THRESHOLD - _DEFAULT_THRESHOLD) / (high - _DEFAULT_DASHSCOPE_THRESHOLD)
    value = _DEFAULT_DASHSCOPE_THRESHOLD + (threshold - _DEFAULT_THRESHOLD) / slope
    return round(min(max(value, low), high), 3)


class DashScopeDialect:
    """What a session in DashScope's dialect reads and says differently; stateless."""

    name = "dashscope"

    def initial_config(self, config: SessionConfig) -> SessionConfig:
        """``config`` with DashScope's documented defaults (before any ``session.update``)."""
        turn_detection = config.turn_detection
        if turn_detection is not None:
            turn_detection = dataclasses.replace(
                turn_detection, interrupt_response=True, silence_duration_ms=DASHSCOPE_SILENCE_DURATION_MS
            )
        return dataclasses.replace(
            config, input_audio_format="audio/pcm", input_audio_rate=DASHSCOPE_INPUT_RATE,
            turn_detection=turn_detection,
            transcription=config.transcription or InputTranscription(partials=config.partial_transcripts),
        )

    def session_fields(self, session: Mapping[str, Any]) -> Mapping[str, Any]:
        """A ``session.update``'s DashScope fields as the session's reader takes them; raises
        ``ProtocolError`` naming the DashScope field (the update is then refused whole)."""
        if not isinstance(session, Mapping):
            return session  # the session's reader refuses it
        fields = dict(session)
        if "voice" in fields:
            voice = _voice(fields.pop("voice"))
            if voice is not None:
                fields["voice"] = voice
        _move_formats(fields)
        if "turn_detection" in fields:
            fields["turn_detection"] = _turn_detection(fields["turn_detection"])
        if "max_tokens" in fields:
            fields["max_output_tokens"] = _max_tokens(fields.pop("max_tokens"))
        if "tools" in fields and isinstance(fields["tools"], list):
            fields["tools"] = [_flat_tool(tool) for tool in fields["tools"]]
        video = fields.get("video")
        if isinstance(video, Mapping) and "input" in video:  # DashScope's video.input, not our video
            rest = {key: value for key, value in video.items() if key != "input"}
            if rest:
                fields["video"] = rest
            else:
                del fields["video"]
        return fields

    def server_event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """A server event as DashScope names it; None: DashScope has no such event (not sent)."""
        kind = event.get("type")
        if kind in DASHSCOPE_UNSENT:
            return None
        if kind in _SESSION_EVENTS:
            return {**event, "session": _session(event["session"])}
        if kind in _ITEM_EVENTS:
            event = {**event, "item": _item(event["item"])}
        elif kind in _RESPONSE_EVENTS:
            event = {**event, "response": _response(event["response"])}
        renamed = DASHSCOPE_EVENT_NAMES.get(str(kind))
        return event if renamed is None else {**event, "type": renamed}


# -- fields in ------------------------------------------------------------------------------



def _object(value: Any, param: str) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object or null")
    return value


def _voice(value: Any) -> str | None:
    """A DashScope voice name → the served voice; None (DashScope SDK's default): keep the session's."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_value("session.voice", "must be a string or null")
    name = value.strip().lower()
    if name in DASHSCOPE_VOICES:
        return DASHSCOPE_VOICES[name]
    if name in VOICES or name in OPENAI_VOICES:
        return name  # the session's reader takes these
    raise invalid_value(
        "session.voice",
        f"unknown voice {value!r}; this server speaks as Chelsie, Ethan or Aiden and takes DashScope's voice "
        "names (Cherry, Serena, Ethan, Chelsie, … as docs/DASHSCOPE.md lists them)",
    )


def _move_formats(fields: dict[str, Any]) -> None:
    """DashScope's audio formats (flat, or its SDK's newer ``audio.*.format``) as GA format objects
    under ``audio.input`` / ``audio.output``; the newer style wins when a client sends both."""
    formats: dict[str, dict[str, Any]] = {}
    if "input_audio_format" in fields:
        formats["input"] = _flat_format(fields.pop("input_audio_format"), _INPUT_FORMATS, DASHSCOPE_INPUT_RATE,
                                        "session.input_audio_format", "PCM16 mono at 16 kHz")
    if "sample_rate" in fields:  # the SDK's transcription_params: the input's rate
        rate = fields.pop("sample_rate")
        if not isinstance(rate, int) or isinstance(rate, bool) or rate not in INPUT_PCM_RATES:
            raise invalid_value("session.sample_rate", "must be " + ", ".join(map(str, INPUT_PCM_RATES)))
        formats["input"] = {"type": "audio/pcm", "rate": rate}
    if "output_audio_format" in fields:
        formats["output"] = _flat_format(fields.pop("output_audio_format"), _OUTPUT_FORMATS, 24_000,
                                         "session.output_audio_format", "PCM16 mono at 24 kHz")
    audio = _object(fields.get("audio"), "session.audio")
    moved = {} if audio is None else dict(audio)
    for side in ("input", "output"):
        direction = _object(moved.get(side), f"session.audio.{side}")
        if direction is not None and "format" in direction:
            formats[side] = _new_style_format(direction["format"], f"session.audio.{side}.format")
        if side in formats:
            moved[side] = {**(direction or {}), "format": formats[side]}
    if audio is not None or formats:
        fields["audio"] = moved


def _flat_format(value: Any, names: tuple[str, ...], rate: int, param: str, what: str) -> dict[str, Any]:
    if not isinstance(value, str) or value not in names:
        raise invalid_value(param, f"must be {' or '.join(repr(name) for name in names)} ({what})")
    return {"type": "audio/pcm", "rate": rate}


def _new_style_format(value: Any, param: str) -> dict[str, Any]:
    """The SDK's ``AudioFormatConfig``: ``{type: "pcm", sample_rate, ...extra_params}``."""
    if not isinstance(value, Mapping):
        raise invalid_value(param, "must be an object like {type: 'pcm', sample_rate: 16000}")
    if value.get("type", "pcm") not in _NEW_STYLE_PCM:
        raise invalid_value(f"{param}.type", "must be 'pcm' (PCM16 mono)")
    is_input = param.endswith("input.format")
    rates = INPUT_PCM_RATES if is_input else (24_000,)
    rate = value.get("sample_rate", DASHSCOPE_INPUT_RATE if is_input else 24_000)
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in rates:
        raise invalid_value(f"{param}.sample_rate", "must be " + " or ".join(map(str, rates)))
    return {"type": "audio/pcm", "rate": rate}


def _turn_detection(value: Any) -> Any:
    """DashScope's turn detection: its threshold scale, and barge-in unless it says otherwise."""
    if not isinstance(value, Mapping):
        return value  # null (manual commits), or a mistake the session's reader names
    fields = dict(value)
    fields.setdefault("interrupt_response", True)
    if "threshold" in fields:
        threshold = fields["threshold"]
        low, high = DASHSCOPE_THRESHOLD_RANGE
        valid = isinstance(threshold, int | float) and not isinstance(threshold, bool) and math.isfinite(threshold)
        if not valid or not low <= threshold <= high:
            raise invalid_value("session.turn_detection.threshold", f"must be a number from {low:g} to {high:g}")
        fields["threshold"] = vad_threshold(float(threshold))
    return fields


def _max_tokens(value: Any) -> int:
    """DashScope's ``max_tokens`` (up to the model's output length, 16,384 for its Qwen3-Omni-Flash):
    ``max_output_tokens``, at most 4096 (this server's bound, OpenAI's)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid_value("session.max_tokens", "must be a positive integer")
    return min(value, MAX_OUTPUT_TOKENS_LIMIT)


def _flat_tool(tool: Any) -> Any:
    """A chat-completions tool (``{type: "function", function: {name, description, parameters}}``,
    as DashScope documents them) as a Realtime one (``{type: "function", name, …}``)."""
    if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping) and "name" not in tool:
        return {"type": tool.get("type", "function"), **tool["function"]}
    return tool


# -- names out ------------------------------------------------------------------------------


def _session(session: Mapping[str, Any]) -> dict[str, Any]:
    """The session object as DashScope's (flat, as its session.created documents it)."""
    audio_input = session["audio"]["input"]
    audio_output = session["audio"]["output"]
    input_format = audio_input["format"]
    transcription = audio_input.get("transcription")
    flat: dict[str, Any] = {
        "object": session.get("object", "realtime.session"),
        "id": session["id"],
        "model": session["model"],
        "modalities": _modalities(session["output_modalities"]),
        "instructions": session["instructions"],
        "voice": str(audio_output["voice"]).capitalize(),
        "input_audio_format": _flat_format_name(input_format),
        "output_audio_format": "pcm24",
        "input_audio_transcription": None if transcription is None else {"model": transcription.get("model")},
        "input_audio_noise_reduction": audio_input.get("noise_reduction"),
        "turn_detection": _turn_detection_out(audio_input.get("turn_detection")),
        "tools": session.get("tools", []),
        "tool_choice": session.get("tool_choice", "auto"),
        "temperature": session["temperature"],
        "audio": {
            "input": {"format": {"type": "pcm", "sample_rate": input_format.get("rate") or 8_000}},
            "output": {"format": {"type": "pcm", "sample_rate": 24_000}},
        },
    }
    if session.get("max_output_tokens") != "inf":
        flat["max_tokens"] = session.get("max_output_tokens")
    return flat


def _flat_format_name(format_object: Mapping[str, Any]) -> str:
    kind = format_object.get("type")
    if kind in _G711_NAMES:
        return _G711_NAMES[str(kind)]
    return {16_000: "pcm16", 24_000: "pcm24"}.get(int(format_object.get("rate") or 0), "pcm")


def _turn_detection_out(turn_detection: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if turn_detection is None:
        return None
    out = dict(turn_detection)
    if "threshold" in out:
        out["threshold"] = dashscope_threshold(float(out["threshold"]))
    return out


def _modalities(output_modalities: list[str]) -> list[str]:
    """DashScope's combinations: ``["text"]`` or ``["text", "audio"]`` (audio always has its text)."""
    return ["text", "audio"] if "audio" in output_modalities else ["text"]


def _item(item: Mapping[str, Any]) -> dict[str, Any]:
    content = item.get("content")
    if not isinstance(content, list):
        return dict(item)
    return {**item, "content": [_part(part) for part in content]}


def _part(part: Any) -> Any:
    if isinstance(part, Mapping) and part.get("type") in _PART_TYPES:
        return {**part, "type": _PART_TYPES[str(part["type"])]}
    return part


def _response(response: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in response.items() if key != "output_modalities"}
    out["modalities"] = _modalities(response.get("output_modalities", ["audio"]))
    out["output"] = [_item(item) for item in response.get("output", [])]
    return out
