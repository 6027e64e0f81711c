"""What a session refuses or turns off because its engine cannot do it (``Engine.capabilities``).

Decided where the client asks, from what the engine declares, rather than found out when a turn
runs (docs/SESSION.md "What the engine can do"):

- no ``function_calls``: a ``tool_choice`` that forces a call (``required``, a named function) is
  refused wherever it is set (``session.update``, ``response.create``), and so is a function call
  or output item (``conversation.item.create``): an ``error`` ``tools_unsupported`` naming the
  field; nothing changes and the session goes on. Tools the model may leave alone (``auto``,
  ``none``) are kept: the model answers without calling, which ``auto`` allows (the page offers
  a tool whatever the engine).
- no ``images``: an ``input_image`` part or an ``input_image_buffer.append`` is refused
  (``images_unsupported``), and camera frames never join a turn (the session's
  ``video.frames_per_turn`` reads 0).
- no ``preemptible_turns``: no speculative answers and no partial transcripts, both made of
  preemptible turns (the session's ``turn_detection.speculative_response`` and
  ``transcription.partials`` read false).

The session a call starts with (an offer's, a client secret's) is fitted the same way, and a
forced ``tool_choice`` in it becomes ``auto`` with an ``error`` after ``session.created``, as
semantic_vad without its model becomes server_vad (``app.realtime.semantic_vad``); a client
secret forcing one is refused when minted (``app.web.server``).
"""

from __future__ import annotations

import dataclasses

from app.realtime.protocol import ClientItem, ClientMessageItem, ProtocolError
from app.realtime.session_config import SessionConfig
from pipeline.contract import EngineCapabilities
from pipeline.tool_format import ToolChoice

TOOLS_UNSUPPORTED = "tools_unsupported"
IMAGES_UNSUPPORTED = "images_unsupported"
_NO_CALLS = "This server's engine does not call functions"
_NO_IMAGES = "This server's engine does not see images."


def fitted(config: SessionConfig, capabilities: EngineCapabilities) -> SessionConfig:
    """``config`` as it runs on an engine with ``capabilities``: what needs a missing capability off."""
    if not capabilities.preemptible_turns:
        detection, transcription = config.turn_detection, config.transcription
        config = dataclasses.replace(
            config,
            turn_detection=None if detection is None else dataclasses.replace(detection, speculative_response=False),
            transcription=None if transcription is None else dataclasses.replace(transcription, partials=False),
            speculative_responses=False,
            partial_transcripts=False,
        )
    if not capabilities.images and config.video.frames_per_turn:
        config = dataclasses.replace(config, video=dataclasses.replace(config.video, frames_per_turn=0))
    return config


def first_config(config: SessionConfig, capabilities: EngineCapabilities) -> tuple[SessionConfig, ProtocolError | None]:
    """The session a call starts with, fitted; a forced ``tool_choice`` the engine cannot keep
    becomes ``auto``, with the error to send after ``session.created``."""
    config = fitted(config, capabilities)
    try:
        check_tool_choice(config.tool_choice, capabilities, "session.tool_choice")
    except ProtocolError as exc:
        error = ProtocolError(exc.code, f"{exc.message} tool_choice stays 'auto'.", param=exc.param)
        return dataclasses.replace(config, tool_choice=ToolChoice()), error
    return config, None


def check_tool_choice(choice: ToolChoice, capabilities: EngineCapabilities, param: str) -> None:
    """``ProtocolError`` ``tools_unsupported`` naming ``param`` when ``choice`` forces a call the
    engine cannot make."""
    if not capabilities.function_calls and choice.mode in ("required", "function"):
        raise ProtocolError(
            TOOLS_UNSUPPORTED, f"{_NO_CALLS}: tool_choice may be 'auto' or 'none' (it answers without calling).",
            param=param,
        )


def check_item(item: ClientItem, capabilities: EngineCapabilities) -> None:
    """``ProtocolError`` for an item of ``conversation.item.create`` the engine could not read:
    a function call or output without ``function_calls``, an image without ``images``."""
    if not capabilities.function_calls and item.type in ("function_call", "function_call_output"):
        raise ProtocolError(TOOLS_UNSUPPORTED, f"{_NO_CALLS}: its conversation holds no {item.type}.",
                            param="item.type")
    if not capabilities.images and isinstance(item, ClientMessageItem):
        for index, part in enumerate(item.content):
            if part.type == "input_image":
                raise ProtocolError(IMAGES_UNSUPPORTED, _NO_IMAGES, param=f"item.content[{index}]")


def check_pushed_image(capabilities: EngineCapabilities) -> None:
    """``ProtocolError`` for an ``input_image_buffer.append`` on an engine without ``images``."""
    if not capabilities.images:
        raise ProtocolError(IMAGES_UNSUPPORTED, _NO_IMAGES, param="image")
