"""The conversation as the session keeps it: items, their order, pruning, and history as heard.

The items themselves are ``app.realtime.entries``: a user item holds what the user gave (audio
clips, text, images) as pipeline items; an assistant item holds everything generated and, once
its playback has settled, what was *heard* of it. The
prompt of the next turn is rendered from what was heard (``History.conversation``), and the
history is kept to whole turns within the session's limits (``History.prune``).

A client's ``conversation.item.create`` content is read into items by ``app.realtime.input_readers``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from app.realtime.entries import AssistantEntry, Entry, FunctionCallEntry, FunctionOutputEntry, UserEntry
from app.realtime.input_readers import checked_text, read_assistant_item, read_user_content
from app.realtime.ledger import Playback, PlaybackLedger
from app.realtime.protocol import (
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
    InputAudioBufferCommittedEvent,
    InputAudioContent,
    InputImageContent,
    ItemContent,
    ProtocolError,
    ServerEvent,
    new_id,
)
from app.realtime.session_config import Truncation
from app.realtime.tools import check_function_name
from media.rates import VOICE_RATE
from pipeline.conversation import (
    AssistantText,
    Conversation,
    ConversationItem,
    HistoryLimits,
    ItemRole,
    UserAudio,
    UserImage,
    group_turns,
)
from pipeline.tool_format import FunctionOutput

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
        read off the loop (``app.realtime.input_images``, :func:`read_item_audio`)."""
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
