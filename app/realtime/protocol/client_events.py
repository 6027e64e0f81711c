"""Client events: one model per event a client sends (strict: wrong types are errors, unknown
keys are ignored). Their union and the parser are ``app.realtime.protocol.unions``'s."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class _ClientModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _ClientEventBase(_ClientModel):
    event_id: str | None = None


ImageDetail = Literal["low", "high", "auto"]


class ClientContentPart(_ClientModel):
    """One part of a message the client creates.

    ``input_text``, ``input_audio`` (base64 PCM16 in the session's input format) and
    ``input_image`` (``image_url``: a PNG or JPEG data URL; ``detail``) for user messages;
    ``output_text`` / ``text`` / ``output_audio`` (its ``transcript``) for assistant messages
    seeded into the history.
    """

    type: Literal["input_text", "input_audio", "input_image", "output_text", "text", "output_audio", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: ImageDetail | None = None


class ClientMessageItem(_ClientModel):
    type: Literal["message"]
    role: Literal["user", "assistant", "system"]
    content: list[ClientContentPart]
    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class ClientFunctionCallItem(_ClientModel):
    """A function call the client puts into the history (one it made elsewhere, say)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=64)
    arguments: str
    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class ClientFunctionCallOutputItem(_ClientModel):
    """What a function call returned: the client ran the call the model made."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=64)
    output: str
    id: str | None = Field(default=None, min_length=1, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


def _item_tag(item: Any) -> str | None:
    """The tag of an item by its ``type``; None (pydantic's ``union_tag_not_found``) without one."""
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return None if kind is None else f"item:{kind}"


# Tagged by type; the tags name no field (":"), so error params read "item.content", not
# "item.message.content" (see _param_path).
ClientItem = Annotated[
    Annotated[ClientMessageItem, Tag("item:message")]
    | Annotated[ClientFunctionCallItem, Tag("item:function_call")]
    | Annotated[ClientFunctionCallOutputItem, Tag("item:function_call_output")],
    Discriminator(_item_tag),
]


class SessionUpdateEvent(_ClientEventBase):
    type: Literal["session.update"]
    # Validated field by field by ``app.realtime.session_config`` (tolerant of OpenAI-only fields).
    session: dict[str, Any]


class InputAudioBufferAppendEvent(_ClientEventBase):
    type: Literal["input_audio_buffer.append"]
    audio: str  # base64 PCM16 in the session's input format (transports without a media track)


class InputAudioBufferCommitEvent(_ClientEventBase):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClearEvent(_ClientEventBase):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreateEvent(_ClientEventBase):
    type: Literal["conversation.item.create"]
    item: ClientItem
    previous_item_id: str | None = None  # None: append; "root": first; an id: right after it

    @property
    def image_url_chars(self) -> int:
        """The characters of its ``input_image`` data URLs: all an image upload may hold past
        ``max_event_bytes`` (the rest of it is bounded as any event is)."""
        if not isinstance(self.item, ClientMessageItem):
            return 0
        return sum(len(part.image_url or "") for part in self.item.content if part.type == "input_image")


class ConversationItemDeleteEvent(_ClientEventBase):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemRetrieveEvent(_ClientEventBase):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ConversationItemTruncateEvent(_ClientEventBase):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseAudioOutputParams(_ClientModel):
    format: dict[str, Any] | None = None
    voice: str | None = None


class ResponseAudioParams(_ClientModel):
    output: ResponseAudioOutputParams | None = None


class ResponseCreateParams(_ClientModel):
    """Per-response overrides of the session; fields this server cannot honour are rejected."""

    instructions: str | None = None
    output_modalities: list[Literal["audio", "text"]] | None = Field(default=None, min_length=1)
    modalities: list[Literal["audio", "text"]] | None = Field(default=None, min_length=1)  # beta name
    max_output_tokens: Annotated[int, Field(ge=1, le=4096)] | Literal["inf"] | None = None
    max_response_output_tokens: Annotated[int, Field(ge=1, le=4096)] | Literal["inf"] | None = None  # beta
    audio: ResponseAudioParams | None = None
    voice: str | None = None  # beta name
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    conversation: Literal["auto"] | None = None  # out-of-band ("none") responses are not supported
    input: list[Any] | None = None  # a custom context: rejected by the session
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)
    tools: list[Any] | None = None  # read by app.realtime.tools, as the session's
    tool_choice: Any = None


class ResponseCreateEvent(_ClientEventBase):
    type: Literal["response.create"]
    response: ResponseCreateParams | None = None


class ResponseCancelEvent(_ClientEventBase):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioBufferClearEvent(_ClientEventBase):
    type: Literal["output_audio_buffer.clear"]


class InputImageBufferAppendEvent(_ClientEventBase):
    """DashScope's camera frame (its SDK's ``append_video``): a base64 JPEG (or PNG), no data URL."""

    type: Literal["input_image_buffer.append"]
    image: str


class SessionFinishEvent(_ClientEventBase):
    """DashScope's end of a session (its SDK's ``end_session``): answered with ``session.finished``."""

    type: Literal["session.finish"]


class PlaybackAckEvent(_ClientEventBase):
    """vLLM-Omni's playback acknowledgement, for transports without a media track (WebSocket).

    The shape of ``AckPlayback`` in vllm-omni 0.30.0 (``vllm_omni/protocol/duplex/commands.py``,
    read by ``vllm_omni/engine/duplex/realtime_commands.py``): ``played_ms`` is the cumulative
    audio of one response the client has played; ``committed_ms`` (default ``played_ms``) how
    much of it counts as heard; the response is named by ``response_id`` or ``item_id`` (neither:
    the oldest answer not yet played out). Milliseconds may be fractional, as vllm-omni accepts.
    """

    type: Literal["playback.ack"]
    played_ms: Annotated[int | float, Field(ge=0, le=86_400_000)]  # a day bounds any real playback
    committed_ms: Annotated[int | float, Field(ge=0, le=86_400_000)] | None = None
    response_id: str | None = None
    item_id: str | None = None
