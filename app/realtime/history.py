"""The conversation as the session keeps it, and as the user heard it.

Items (:class:`UserEntry`, :class:`AssistantEntry`, :class:`FunctionCallEntry`,
:class:`FunctionOutputEntry`) each know their protocol item, their prompt part and their size.
:class:`History` orders them, reads a client's ``conversation.item.create`` into one, prunes to
whole turns within the session's limits, and renders the next prompt from what was *heard*:
an answer enters the history once its playback settles (``settle_all``), truncated to the
tokens heard (:func:`tokens_heard`: the text's share of the audio played when the answer is
whole, else ``SPEAKING_TOKENS_PER_SECOND`` of speech). A client's ``playback.ack`` says what
was heard where the transport has acks (:func:`acknowledge_playback`).
docs/SESSION.md "History as heard" has the rules; docs/MODEL.md "Heard text" their error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from app.realtime.playback import Playback, PlaybackLedger, PlaybackReports
from app.realtime.protocol import (
    ClientContentPart,
    ClientFunctionCallItem,
    ClientFunctionCallOutputItem,
    ClientMessageItem,
    ConversationItemAddedEvent,
    ConversationItemCreateEvent,
    ConversationItemDeletedEvent,
    ConversationItemDoneEvent,
    ConversationItemRetrievedEvent,
    ConversationItemTruncatedEvent,
    ConversationItemTruncateEvent,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudioBufferCommittedEvent,
    InputAudioContent,
    InputImageContent,
    InputTextContent,
    ItemContent,
    ItemStatus,
    MessageItem,
    OutputAudioContent,
    OutputTextContent,
    PlaybackAckEvent,
    PlaybackAcknowledgedEvent,
    PlaybackAcknowledgement,
    ProtocolError,
    ServerEvent,
    new_id,
)
from app.realtime.session_config import Modality, Truncation
from app.realtime.tools import check_function_name
from media.rates import VOICE_RATE
from pipeline.conversation import (
    IMAGE_NOTE,
    AssistantText,
    Conversation,
    ConversationItem,
    HistoryLimits,
    ItemRole,
    UserAudio,
    UserImage,
    UserText,
    group_turns,
)
from pipeline.token_bounds import ASSISTANT_MESSAGE_TOKENS, text_tokens_bound
from pipeline.tool_format import FunctionCall, FunctionOutput

# ---- heard ----

# A trained Talker's pace: English speech at ~150 words a minute is ~2.5 words, ~3.3 Qwen
# tokens a second; Chinese at ~4-5 characters a second is ~3-4 tokens. Used only while an
# answer's total audio is unknown.
SPEAKING_TOKENS_PER_SECOND = 3.5


def tokens_heard(played_samples: int, *, audio_samples: int, tokens: int, complete: bool) -> int:
    """Answer tokens heard when the first ``played_samples`` of its audio were played.

    ``audio_samples``: the answer's audio written so far; ``tokens``: its text tokens released
    so far; ``complete``: that audio and text are the whole answer.
    """
    if played_samples <= 0 or tokens <= 0:
        return 0
    if complete:
        if played_samples >= audio_samples:
            return tokens
        return tokens * played_samples // audio_samples
    return min(tokens, int(played_samples * SPEAKING_TOKENS_PER_SECOND) // VOICE_RATE)


# ---- entries ----

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
        text was heard. Otherwise the tokens heard are those ``app.realtime.history.tokens_heard``
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


# ---- item_readers ----

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
    read (``app.realtime.input``, :func:`read_item_audio`)."""
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


# ---- history ----

AUTO_TRUNCATION = Truncation()  # OpenAI's default: past the token budget the oldest items go
# User items not yet answered (created without a response) kept before the oldest is dropped.
MAX_UNANSWERED_ITEMS = 16


class History:
    """The session's items in conversation order."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def last_id(self) -> str | None:
        return self._entries[-1].id if self._entries else None

    def append(self, entry: Entry) -> str | None:
        """Adds ``entry`` last; the id of the item before it."""
        previous_id = self.last_id()
        self._entries.append(entry)
        return previous_id

    def _insert(self, position: int, entry: Entry) -> str | None:
        """Adds ``entry`` at ``position`` (from :meth:`_position_after`); the id of the item before it."""
        previous_id = self._entries[position - 1].id if position > 0 else None
        self._entries.insert(position, entry)
        return previous_id

    def holds(self, entry: Entry) -> bool:
        """``entry`` is still in the conversation (not deleted, not pruned)."""
        return any(candidate is entry for candidate in self._entries)

    def find(self, item_id: str) -> Entry | None:
        return next((entry for entry in self._entries if entry.id == item_id), None)

    def require(self, item_id: str) -> Entry:
        entry = self.find(item_id)
        if entry is None:
            raise ProtocolError("item_not_found", f"Item with item_id not found: {item_id}.", param="item_id")
        return entry

    def previous_id(self, entry: Entry) -> str | None:
        for index, candidate in enumerate(self._entries):
            if candidate is entry:
                return self._entries[index - 1].id if index > 0 else None
        return None

    def prompt_tokens(self) -> int:
        """The history's prompt tokens after the system prompt, as its items estimate them."""
        return prompt_tokens(self._entries)

    def audio_clip_count(self) -> int:
        return sum(len(entry.audio_clips()) for entry in self._entries if isinstance(entry, UserEntry))

    def image_count(self) -> int:
        return sum(len(entry.images()) for entry in self._entries if isinstance(entry, UserEntry))

    def commit_audio(self, item_id: str, pcm: np.ndarray, images: tuple[UserImage, ...] = ()) -> list[ServerEvent]:
        """A committed utterance becomes the last user item, after the camera frames seen while it
        was spoken (``images``, in time order); its committed/added/done events."""
        content: list[ItemContent] = [InputImageContent() for _ in images]
        entry = UserEntry(item_id, (*images, UserAudio(pcm)), [*content, InputAudioContent()])
        previous_id = self.append(entry)
        return [
            InputAudioBufferCommittedEvent(item_id=item_id, previous_item_id=previous_id),
            ConversationItemAddedEvent(previous_item_id=previous_id, item=entry.item()),
            ConversationItemDoneEvent(previous_item_id=previous_id, item=entry.item()),
        ]

    def create_item(
        self,
        event: ConversationItemCreateEvent,
        *,
        max_chars: int,
        images: Mapping[int, UserImage] | None = None,
        audio: Mapping[int, UserAudio] | None = None,
    ) -> list[ServerEvent]:
        """Adds a client's item where it asked; the ``conversation.item.added``/``done`` pair.
        ``images`` and ``audio``: its ``input_image`` and ``input_audio`` parts by index, already
        read off the loop (``app.realtime.input``, :func:`read_item_audio`)."""
        item = event.item
        if item.id is not None and self.find(item.id) is not None:
            raise ProtocolError("invalid_value", f"An item with id {item.id!r} already exists.", param="item.id")
        position = self._position_after(event.previous_item_id)
        if isinstance(item, ClientMessageItem) and not item.content:
            raise ProtocolError("invalid_value", "A message needs at least one content part.", param="item.content")
        item_id = item.id or new_id("item")
        entry: Entry
        if not isinstance(item, ClientMessageItem):
            entry = self._function_item(item_id, item, max_chars=max_chars)
        elif item.role == "user":
            parts, content = read_user_content(item.content, max_chars=max_chars, images=images or {}, audio=audio or {})
            entry = UserEntry(item_id, parts, content)
        elif item.role == "assistant":
            entry = read_assistant_item(item_id, item.content, max_chars=max_chars)
        else:
            raise ProtocolError(
                "invalid_value",
                "System messages are not supported; set the system prompt with session.update instructions.",
                param="item.role",
            )
        previous_id = self._insert(position, entry)
        return [
            ConversationItemAddedEvent(previous_item_id=previous_id, item=entry.item()),
            ConversationItemDoneEvent(previous_item_id=previous_id, item=entry.item()),
        ]

    def delete_item(self, item_id: str, *, in_progress: Sequence[Entry]) -> ServerEvent:
        """``in_progress``: the items of the response being generated, which stay."""
        entry = self.require(item_id)
        if any(entry is generating for generating in in_progress):
            raise ProtocolError(
                "invalid_value", "The item belongs to the response in progress; cancel it first.", param="item_id"
            )
        self._entries.remove(entry)
        return ConversationItemDeletedEvent(item_id=entry.id)

    def retrieve_item(self, item_id: str) -> ServerEvent:
        """The item as it stands now (a user item with its transcript, an answer as heard)."""
        return ConversationItemRetrievedEvent(item=self.require(item_id).item())

    def truncate_item(self, event: ConversationItemTruncateEvent, ledger: PlaybackLedger) -> ServerEvent:
        """The client says only ``audio_end_ms`` of an answer was heard; its text is cut to match."""
        entry = self.require(event.item_id)
        if not isinstance(entry, AssistantEntry) or entry.modality != "audio" or entry.status == "in_progress":
            raise ProtocolError(
                "invalid_value", "Only a finished assistant audio item can be truncated.", param="item_id"
            )
        if event.content_index != 0:
            raise ProtocolError("invalid_value", "An assistant item has one content part (index 0).",
                                param="content_index")
        # Clients bound audio_end_ms by the audio they received in whole ms, rounded up (the
        # openai-agents SDK: 29,610 bytes = 616.875 ms -> 617): that much is the whole item.
        audio_ms = -(-entry.audio_samples * 1000 // VOICE_RATE)
        if event.audio_end_ms > audio_ms:
            raise ProtocolError(
                "invalid_value",
                f"audio_end_ms {event.audio_end_ms} is past the item's audio ({audio_ms} ms).",
                param="audio_end_ms",
            )
        samples = min(event.audio_end_ms * VOICE_RATE // 1000, entry.audio_samples)
        playback = ledger.get(entry.id)
        if playback is not None:  # still playing: what is heard later stays within the cut
            playback.limit = samples if playback.limit is None else min(playback.limit, samples)
            playback.truncated = True  # announced here, not again when it settles
        entry.heard = entry.heard_text(samples, finished=not entry.ended_early)
        return ConversationItemTruncatedEvent(item_id=entry.id, content_index=0, audio_end_ms=event.audio_end_ms)

    def settle(self, playback: Playback, played: int) -> bool:
        """Put what was heard of the item into the history; True when it was cut short: not all
        its audio played, or its response was cancelled or failed (its text ran ahead of the audio)."""
        entry = self.find(playback.item_id)
        if not isinstance(entry, AssistantEntry):
            return False  # deleted by the client meanwhile
        heard = playback.heard(played)
        finished = not (playback.unfinished or entry.ended_early)
        cut_short = heard < playback.written or not finished
        if entry.heard is None or cut_short:
            entry.heard = entry.heard_text(heard, finished=finished)
        return cut_short

    def settle_all(self, playbacks: list[Playback], played: int) -> list[ServerEvent]:
        """Settles items whose playback ended (played out or cleared); ``conversation.item.truncated``
        for each cut short, with ``audio_end_ms`` = its audio played (unless the client's own
        ``conversation.item.truncate`` said so already)."""
        return [
            ConversationItemTruncatedEvent(
                item_id=playback.item_id, content_index=0, audio_end_ms=playback.heard(played) * 1000 // VOICE_RATE
            )
            for playback in playbacks
            if self.settle(playback, played) and not playback.truncated
        ]

    def conversation(
        self, instructions: str | None, limits: HistoryLimits, pending: tuple[ConversationItem, ...] = ()
    ) -> Conversation:
        """What the next turn's prompt is rendered from: user items as given, assistant items as
        heard; ``pending``: the parts of a user item not yet committed, as if it were the last."""
        items: list[ConversationItem] = []
        for entry in self._entries:
            if isinstance(entry, UserEntry):
                items.extend(entry.parts)
            elif isinstance(entry, FunctionCallEntry):
                if entry.status == "completed":  # a call cut off while written was never made
                    items.append(entry.call())
            elif isinstance(entry, FunctionOutputEntry):
                items.append(FunctionOutput(entry.call_id, entry.output))
            elif entry.status != "in_progress" and (text := entry.history_text()):
                items.append(AssistantText(text))  # nothing heard: as if it had not been said
        return Conversation(items=(*items, *pending), instructions=instructions, limits=limits)

    def _function_item(
        self, item_id: str, item: ClientFunctionCallItem | ClientFunctionCallOutputItem, *, max_chars: int
    ) -> Entry:
        """A client's function call, or the output of a call in the history."""
        if isinstance(item, ClientFunctionCallItem):
            name = check_function_name(item.name, "item.name")
            arguments = checked_text(item.arguments, "item.arguments", max_chars=max_chars)
            return FunctionCallEntry(item_id, item.call_id, name, arguments, status="completed")
        made = (entry for entry in self._entries if isinstance(entry, FunctionCallEntry) and entry.status == "completed")
        if not any(entry.call_id == item.call_id for entry in made):  # a call cut off was never made
            raise ProtocolError(
                "item_not_found", f"No completed function call with call_id {item.call_id!r} in the conversation.",
                param="item.call_id",
            )
        return FunctionOutputEntry(item_id, item.call_id, checked_text(item.output, "item.output", max_chars=max_chars))

    def prune(self, limits: HistoryLimits, truncation: Truncation = AUTO_TRUNCATION) -> list[ServerEvent]:
        """Keep whole turns, newest first, while the history limits hold (as the prompt renderer
        bounds them), at most ``MAX_UNANSWERED_ITEMS`` unanswered user items, and then the
        oldest items go until the items, bytes and prompt tokens are within the budget
        (as the session's ``truncation`` says); a ``conversation.item.deleted`` for each item that went."""
        kept = within_budget(pruned(self._entries, limits), limits, truncation)
        staying = {id(entry) for entry in kept}
        gone = [entry for entry in self._entries if id(entry) not in staying]
        self._entries = kept
        return [ConversationItemDeletedEvent(item_id=entry.id) for entry in gone]

    def _position_after(self, previous_item_id: str | None) -> int:
        """Where an item goes after ``previous_item_id``: last when None, first when ``"root"``."""
        if previous_item_id is None:
            return len(self._entries)
        if previous_item_id == "root":
            return 0
        for index, entry in enumerate(self._entries):
            if entry.id == previous_item_id:
                return index + 1
        raise ProtocolError("item_not_found", f"No item with id {previous_item_id!r}.", param="previous_item_id")


def pruned(entries: list[Entry], limits: HistoryLimits) -> list[Entry]:
    """``entries`` cut to whole turns (items up to an answer, a function call kept with its
    output: ``pipeline.conversation.group_turns``), newest first, within
    ``limits``; a turn still being answered is always kept, and so are at most
    ``MAX_UNANSWERED_ITEMS`` trailing user items.

    The same rule as ``pipeline.conversation.bound_history``: once a turn's audio breaks an audio
    limit, it and older turns are kept only while every clip of theirs has its transcript (the
    prompt then carries them as text); ``max_turns`` bounds all kept turns. Once a turn's
    images take the past turns over ``max_image_tokens``, it and older turns drop their images
    (``UserEntry.drop_images``), as the prompt would.
    """
    turns, pending = group_turns(entries, _entry_role)
    kept: list[list[Entry]] = []
    clips = 0
    seconds = 0.0
    as_text = False
    image_tokens = 0
    for turn in reversed(turns):
        users = [entry for entry in turn if isinstance(entry, UserEntry)]
        if image_tokens <= limits.max_image_tokens:
            image_tokens += sum(image.tokens for entry in users for image in entry.images())
        if image_tokens > limits.max_image_tokens:
            for entry in users:
                entry.drop_images()
        audio = [clip for entry in turn if isinstance(entry, UserEntry) for clip in entry.audio_clips()]
        if not as_text:
            clips += len(audio)
            seconds += sum(clip.seconds for clip in audio)
            as_text = clips > limits.max_audio_clips or seconds > limits.max_audio_seconds
        in_progress = any(
            isinstance(entry, AssistantEntry | FunctionCallEntry) and entry.status == "in_progress" for entry in turn
        )
        untranscribed = as_text and any(clip.transcript is None for clip in audio)
        if not in_progress and (len(kept) >= limits.max_turns or untranscribed):
            break
        kept.append(turn)
    pending = pending[-MAX_UNANSWERED_ITEMS:]
    return [entry for turn in reversed(kept) for entry in turn] + pending


def _entry_role(entry: Entry) -> ItemRole:
    """An entry's part in ``group_turns``: answers end turns; a call stays with its output."""
    if isinstance(entry, AssistantEntry):
        return ("answer", None)
    if isinstance(entry, FunctionCallEntry):
        return ("call", entry.call_id)
    if isinstance(entry, FunctionOutputEntry):
        return ("output", entry.call_id)
    return ("other", None)


def prompt_tokens(entries: Sequence[Entry]) -> int:
    """The history's prompt tokens after the system prompt, as its items estimate them."""
    return sum(entry.prompt_tokens() for entry in entries)


def within_budget(entries: list[Entry], limits: HistoryLimits, truncation: Truncation = AUTO_TRUNCATION) -> list[Entry]:
    """``entries`` within the budget: at most ``max_items``, holding at most ``max_bytes``, and
    estimating at most ``max_prompt_tokens`` prompt tokens, as ``truncation`` applies that
    (``Truncation.token_budget``: "retention_ratio" then keeps less, "disabled" drops nothing
    for tokens).

    Images go first: older items' images become ``IMAGE_NOTE`` (the item keeps its words and
    audio), oldest first; then the oldest items go. Whatever turn an item joined counts: an item
    inserted first (``previous_item_id: "root"``) is the oldest and goes first. Two items always
    stay whole: the newest (what the next turn answers; alone it may pass the budget, by at most
    one event's worth) and a response's item while it is generated.
    """
    items, held, tokens = len(entries), 0, 0
    for entry in entries:
        held += entry.held_bytes()
        tokens += entry.prompt_tokens()
    token_budget = truncation.token_budget(limits)
    if token_budget is None:
        token_bound = float("inf")
    else:
        token_bound = token_budget[0] if tokens <= token_budget[0] else token_budget[1]

    def over() -> bool:
        return items > limits.max_items or held > limits.max_bytes or tokens > token_bound

    for entry in evictable(entries):
        if not over():
            break
        if isinstance(entry, UserEntry) and entry.images():
            held, tokens = held - entry.held_bytes(), tokens - entry.prompt_tokens()
            entry.drop_images()
            held, tokens = held + entry.held_bytes(), tokens + entry.prompt_tokens()
    dropped: set[int] = set()
    for entry in evictable(entries):
        if not over():
            break
        if id(entry) in dropped:
            continue
        # A function call goes with its outputs: Qwen pairs them by position, not by id.
        going = [entry] + [
            e for e in entries[:-1]
            if isinstance(entry, FunctionCallEntry) and isinstance(e, FunctionOutputEntry) and e.call_id == entry.call_id
        ]
        for gone in going:
            if id(gone) not in dropped:
                dropped.add(id(gone))
                items, held, tokens = items - 1, held - gone.held_bytes(), tokens - gone.prompt_tokens()
    return [entry for entry in entries if id(entry) not in dropped] if dropped else entries


def evictable(entries: list[Entry]) -> Iterator[Entry]:
    """The items the budget may shrink or drop, in the order they go: oldest first, never the
    newest or one being generated (an answer, or a call being written)."""
    for entry in entries[:-1]:
        if not (isinstance(entry, AssistantEntry | FunctionCallEntry) and entry.status == "in_progress"):
            yield entry


def acknowledge_playback(
    event: PlaybackAckEvent, reports: PlaybackReports | None, history: History, ledger: PlaybackLedger,
    session_id: str,
) -> PlaybackAcknowledgedEvent:
    """Applies a ``playback.ack``: advances the output's played clock and the item's history as
    heard; ``reports`` is the output's (None: its transport takes no acks)."""
    if reports is None:
        raise ProtocolError(
            "playback_ack_unsupported",
            "playback.ack is for WebSocket sessions; over WebRTC the server's audio track knows what was played.",
        )
    segment = reports.find(item_id=event.item_id, response_id=event.response_id)
    if segment is None:
        named = event.item_id or event.response_id
        raise ProtocolError(
            "playback_item_not_found",
            f"No answer audio {'for ' + repr(named) if named else 'has been sent'} to acknowledge.",
            param="item_id" if event.item_id else "response_id" if event.response_id else None,
        )
    played = _samples(event.played_ms, segment.written)
    committed = min(_samples(event.played_ms if event.committed_ms is None else event.committed_ms, segment.written),
                    played)
    playback = ledger.get(segment.item_id)
    if playback is not None and committed < played:  # the client counts less as heard than it played
        playback.limit = committed if playback.limit is None else min(playback.limit, committed)
    reports.acknowledge(segment, played)
    entry = history.find(segment.item_id)
    settled = ledger.get(segment.item_id) is None and isinstance(entry, AssistantEntry)
    if settled and isinstance(entry, AssistantEntry) and entry.audio_samples:
        # In the history already (settled by this ack, or before it, when audio counted as played
        # once written): the ack says what was heard.
        entry.heard = entry.heard_text(min(committed, entry.audio_samples), finished=not entry.ended_early)
    return PlaybackAcknowledgedEvent(
        event=PlaybackAcknowledgement(
            session_id=session_id, item_id=segment.item_id, response_id=segment.response_id,
            played_ms=played * 1000 // VOICE_RATE, committed_ms=committed * 1000 // VOICE_RATE,
            audio_ms=segment.written * 1000 // VOICE_RATE, history_committed=settled,
        )
    )


def _samples(ms: float, written: int) -> int:
    """Milliseconds of a segment as samples; the segment's length in whole ms (rounded down, as a
    client counting ms reports it) is all of it."""
    if ms >= written * 1000 // VOICE_RATE:
        return written
    return int(ms * VOICE_RATE / 1000)
