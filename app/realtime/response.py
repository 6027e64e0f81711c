"""One response as the session keeps it: its settings (the session's, or ``response.create``'s),
its ids and output items, and where it stands (announced, cancelling, its first audio and first
frame). ``app.realtime.response_run`` runs it; ``app.realtime.response_events`` builds its events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from app.realtime.entries import AssistantEntry, FunctionCallEntry
from app.realtime.protocol import (
    AudioFormat,
    ContentPart,
    ResponseAudio,
    ResponseAudioOutput,
    ResponseObject,
    ResponseStatus,
    new_id,
)
from app.realtime.session_config import Modality, SessionConfig
from app.realtime.speculation import Speculation
from pipeline.contract import FunctionCallDone, Voice
from pipeline.tool_format import Tool, ToolChoice, offers_tools

# How long response.done may wait for the answer's first frame to reach the transport. A paced
# track sends the first queued frame within 20 ms; only a worker far behind takes longer, and
# then the reported latency should include that wait. Bounded so that response.done never hangs.
FIRST_FRAME_WAIT_S = 1.0


@dataclass
class Response:
    id: str
    conversation_id: str
    modality: Modality
    voice: Voice
    temperature: float
    max_output_tokens: int | None
    instructions: str | None
    metadata: dict[str, str] | None
    started_at: float  # monotonic: commit (VAD) or response.create
    silence_wait_ms: float = 0.0  # audio the VAD waited through before committing
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    # Its items in output order: the message (``entry``) and the function calls after it.
    output: list[AssistantEntry | FunctionCallEntry] = field(default_factory=list)
    announced: bool = False  # response.created sent
    written: dict[str, FunctionCallDone] = field(default_factory=dict)  # calls the model finished, by item id
    call_problems: list[str] = field(default_factory=list)  # calls not as their function takes them
    cancelling: bool = False
    cancel_reason: str | None = None
    first_audio_at: float | None = None  # monotonic: the first audio chunk handed to the output
    # Monotonic: the output handed that audio's first frame to the transport (its on_playback_started).
    first_frame_sent_at: float | None = None
    expects_first_frame: bool = False
    first_frame_sent: asyncio.Event = field(default_factory=asyncio.Event)
    # Set at its first audio, or when it ends: work for the engine that must not delay the
    # answer (input transcription) waits for it.
    output_started: asyncio.Event = field(default_factory=asyncio.Event)
    # The speculation taken at its commit (app.realtime.speculation), and, once its held answer
    # is used, when that answer's engine turn started (monotonic).
    speculation: Speculation | None = None
    speculation_started_at: float | None = None

    @property
    def entry(self) -> AssistantEntry | None:
        """The message item (audio or text), once opened."""
        return next((item for item in self.output if isinstance(item, AssistantEntry)), None)

    @entry.setter
    def entry(self, entry: AssistantEntry | None) -> None:
        self.output = [item for item in self.output if not isinstance(item, AssistantEntry)]
        if entry is not None:
            self.output.insert(0, entry)

    @property
    def calls(self) -> list[FunctionCallEntry]:
        return [item for item in self.output if isinstance(item, FunctionCallEntry)]

    @property
    def may_call(self) -> bool:
        """The model sees tools (and may answer with calls only)."""
        return offers_tools(self.tools, self.tool_choice)

    def object(self, status: ResponseStatus, **fields: Any) -> ResponseObject:
        return ResponseObject(
            id=self.id,
            status=status,
            conversation_id=self.conversation_id,
            output_modalities=[self.modality],
            max_output_tokens="inf" if self.max_output_tokens is None else self.max_output_tokens,
            audio=ResponseAudio(output=ResponseAudioOutput(format=AudioFormat(), voice=self.voice)),
            metadata=self.metadata,
            **fields,
        )

    @classmethod
    def for_session(
        cls, config: SessionConfig, conversation_id: str, started_at: float, silence_wait_ms: float = 0.0
    ) -> Response:
        """A response with the session's settings (what the server starts by itself)."""
        return cls(
            id=new_id("resp"),
            conversation_id=conversation_id,
            modality=config.output_modality,
            voice=config.voice,
            temperature=config.temperature,
            max_output_tokens=config.max_output_tokens,
            instructions=config.instructions,
            metadata=None,
            started_at=started_at,
            silence_wait_ms=silence_wait_ms,
            tools=config.tools,
            tool_choice=config.tool_choice,
        )

    def audio_written(self, *, to_idle_paced_output: bool) -> None:
        """Audio of this response went to the output (a paced one with nothing queued, or not)."""
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
            # A paced output reports the first frame it sends (on_playback_started) when nothing plays before it.
            self.expects_first_frame = to_idle_paced_output
            self.output_started.set()

    def first_frame_out(self, response_id: str) -> None:
        """The output sent the first frame of ``response_id``'s audio (its ``on_playback_started``)."""
        if response_id == self.id and self.first_frame_sent_at is None:
            self.first_frame_sent_at = time.monotonic()
            self.first_frame_sent.set()

    async def wait_first_frame(self) -> None:
        """Before ``response.done``: let the first frame reach the transport, so that its latency does."""
        if not self.expects_first_frame or self.first_frame_sent_at is not None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_FRAME_WAIT_S):
                await self.first_frame_sent.wait()

    def content_ids(self) -> dict[str, Any]:
        entry = self.entry
        assert entry is not None
        return {"response_id": self.id, "item_id": entry.id, "output_index": self.output.index(entry), "content_index": 0}

    def call_ids(self, call: FunctionCallEntry) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": call.id, "output_index": self.output.index(call), "call_id": call.call_id}

    def part(self, text: str) -> ContentPart:
        if self.modality == "audio":
            return ContentPart(type="audio", transcript=text)
        return ContentPart(type="text", text=text)
