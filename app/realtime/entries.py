"""The items of a conversation as the session holds them: a user's message (its audio clips,
text and images as pipeline items), an answer (generated, then heard), a function call and its
output. Each knows its protocol item, what it adds to a prompt, and what it holds in memory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from app.realtime.heard import tokens_heard
from app.realtime.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudioContent,
    ItemContent,
    ItemStatus,
    MessageItem,
    OutputAudioContent,
    OutputTextContent,
)
from app.realtime.session_config import Modality
from pipeline.conversation import IMAGE_NOTE, ConversationItem, UserAudio, UserImage, UserText
from pipeline.token_bounds import ASSISTANT_MESSAGE_TOKENS, text_tokens_bound
from pipeline.tool_format import FunctionCall, FunctionOutput


@dataclass
class UserEntry:
    id: str
    parts: tuple[ConversationItem, ...]  # UserAudio / UserText / UserImage, in content order
    content: list[ItemContent]

    def item(self) -> MessageItem:
        return MessageItem(id=self.id, status="completed", role="user", content=self.content)

    def audio_clips(self) -> list[UserAudio]:
        return [part for part in self.parts if isinstance(part, UserAudio)]

    def images(self) -> list[UserImage]:
        return [part for part in self.parts if isinstance(part, UserImage)]

    def drop_images(self) -> None:
        """Its images leave the prompt (and memory), each for ``IMAGE_NOTE``; the item as the client
        sees it keeps its ``input_image`` parts, and content indices stay those of the parts."""
        self.parts = tuple(UserText(IMAGE_NOTE) if isinstance(part, UserImage) else part for part in self.parts)

    def prompt_tokens(self) -> int:
        """At most this many prompt tokens (each part says its own: ``pipeline.conversation``)."""
        return sum(part.prompt_tokens() for part in self.parts)

    def held_bytes(self) -> int:
        return sum(part.held_bytes() for part in self.parts)

    def transcribed(self, content_index: int, transcript: str) -> None:
        """The audio part at ``content_index`` has a transcript: the prompt may use it, the item shows it."""
        self.parts = tuple(
            dataclasses.replace(part, transcript=transcript)
            if index == content_index and isinstance(part, UserAudio)
            else part
            for index, part in enumerate(self.parts)
        )
        self.content[content_index] = InputAudioContent(transcript=transcript)


@dataclass
class AssistantEntry:
    id: str
    modality: Modality
    status: str = "in_progress"
    text: str = ""  # everything generated
    token_ends: list[int] = field(default_factory=list)  # end offset in ``text`` of each answer token so far
    heard: str | None = None  # set once playback settled; None: not settled yet (see history_text)
    audio_samples: int = 0  # its audio written so far (24 kHz)
    ended_early: bool = False  # the response was cancelled or failed: its text ran ahead of its audio

    def add_delta(self, delta: str, *, tokens: int = 1) -> None:
        """``delta`` completes ``tokens`` answer tokens. Of a delta held back until a character's
        UTF-8 pieces were whole, only its last token ends the text: the earlier ones end where
        the previous delta did, so a character is heard once all of its tokens are."""
        start = len(self.text)
        self.text += delta
        self.token_ends.extend([start] * (tokens - 1))
        self.token_ends.append(len(self.text))

    def add_audio(self, samples: int) -> None:
        self.audio_samples += samples

    def history_text(self) -> str:
        """The text the next turn sees: what was heard, or what will have been once the audio
        still queued plays out (all of it for an answer that ended by itself)."""
        if self.heard is not None:
            return self.heard
        if self.ended_early and self.modality == "audio":
            return self.heard_text(self.audio_samples, finished=False)
        return self.text

    def heard_text(self, heard_samples: int, *, finished: bool) -> str:
        """The text heard when the first ``heard_samples`` of its audio were played.

        ``finished``: the answer ended by itself (not cancelled, failed, or cut before all its
        audio was written): its audio and text are whole, and once all of it has played, all its
        text was heard. Otherwise the tokens heard are those ``app.realtime.heard.tokens_heard``
        gives for the samples played, mapped to text by ``token_ends``.
        """
        if finished and heard_samples >= self.audio_samples:
            return self.text
        tokens = tokens_heard(
            heard_samples, audio_samples=self.audio_samples, tokens=len(self.token_ends), complete=finished
        )
        if tokens >= len(self.token_ends):
            return self.text
        return self.text[: self.token_ends[tokens - 1]] if tokens else ""

    def prompt_tokens(self) -> int:
        """At most this many prompt tokens: its text as the next prompt would carry it."""
        text = self.text if self.status == "in_progress" else self.history_text()
        return ASSISTANT_MESSAGE_TOKENS + text_tokens_bound(text)

    def held_bytes(self) -> int:
        return text_tokens_bound(self.text)

    def content(self) -> list[ItemContent]:
        if self.status == "in_progress":
            return []
        if self.modality == "audio":  # once cut short, only what was heard
            return [OutputAudioContent(transcript=self.history_text())]
        return [OutputTextContent(text=self.text)]

    def item(self) -> MessageItem:
        return MessageItem(id=self.id, status=self.status, role="assistant", content=self.content())


@dataclass
class FunctionCallEntry:
    """A call the model made (streamed while in progress), or one a client created."""

    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: ItemStatus = "in_progress"

    def item(self) -> FunctionCallItem:
        return FunctionCallItem(
            id=self.id, status=self.status, call_id=self.call_id, name=self.name, arguments=self.arguments
        )

    def call(self) -> FunctionCall:
        return FunctionCall(self.call_id, self.name, self.arguments)

    def prompt_tokens(self) -> int:
        return self.call().prompt_tokens()

    def held_bytes(self) -> int:
        return self.call().held_bytes()


@dataclass
class FunctionOutputEntry:
    id: str
    call_id: str
    output: str

    def item(self) -> FunctionCallOutputItem:
        return FunctionCallOutputItem(id=self.id, call_id=self.call_id, output=self.output)

    def prompt_tokens(self) -> int:
        return FunctionOutput(self.call_id, self.output).prompt_tokens()

    def held_bytes(self) -> int:
        return text_tokens_bound(self.output)


Entry = UserEntry | AssistantEntry | FunctionCallEntry | FunctionOutputEntry
