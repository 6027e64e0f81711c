"""Input audio transcription: Qwen3-Omni writes down what the user said, beside the answer.

When the session sets ``audio.input.transcription``, every committed user audio item gets one
engine turn of its own (``TurnRequest.transcription``: Qwen3-Omni's ASR prompt, text only,
greedy) and the client gets OpenAI's events for it: ``…input_audio_transcription.delta`` as the
words come, then ``.completed`` (the transcript and its token usage) or ``.failed`` (an error).
The item's ``input_audio`` part carries the transcript from then on, and the history may keep
the turn as that text once its audio no longer fits the audio budget.

It must not slow the answer. A transcription is submitted to the engine only once the response
started for the same commit has handed out its first audio (or ended): with a FIFO engine it
then queues behind the answer's turn; with an engine that batches concurrent turns it joins the
answer's batch after its first audio, never before. With no response running it is submitted at
once (a commit without ``create_response``, or a client commit before its ``response.create``;
on a FIFO engine that response then waits for this transcription).

A clip of digital silence (every sample zero: the idle timeout's clip, a muted microphone's
commit) holds no words: its transcript is "" without an engine turn, which could only cost a
visitor's answer time and might make up words.

A commit whose answer was speculative may bring its transcription already started
(``app.realtime.speculation``: held, started after the held answer's first audio): when it
transcribes exactly the committed clip it is promoted and its held events are released, in the
same order and at the same point as a fresh turn's would be.

Partial transcripts sent while the user spoke (``app.realtime.partial_transcripts``) come with
the commit as what their deltas said (``PartialText``): the final transcription's deltas go on
from there, appending what it says past those words when it starts with them, and nothing more
when it revises them (the ``.completed`` transcript is the final text either way). Without
partials every delta is sent as it comes, and the deltas concatenate to ``.completed``'s
transcript. Each delta also carries the extensions ``partial`` (false here) and ``transcript``
(the final text so far).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

import numpy as np

from app.realtime.entries import Entry, UserEntry
from app.realtime.failures import transcription_failed_event
from app.realtime.held_turn import HeldTurn
from app.realtime.partial_transcripts import PartialText
from app.realtime.protocol import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    TranscriptionInputTokenDetails,
    TranscriptionUsage,
)
from app.realtime.session_config import InputTranscription
from pipeline.contract import Engine, EngineError, TextDelta, TurnDone, TurnEvent, TurnRequest, Usage
from pipeline.conversation import UserAudio

# Given a transcription request, the held turn already running it (the caller's to own), or None.
HeldTranscriptions = Callable[[TurnRequest], HeldTurn | None]

logger = logging.getLogger(__name__)


class Transcriptions:
    """The session's transcription tasks; ``close()`` cancels and awaits them (safe twice)."""

    def __init__(
        self, engine: Engine, emit: Callable[[Any], None], holds_item: Callable[[Entry], bool], session_id: str
    ) -> None:
        self._engine = engine
        self._emit = emit
        self._holds_item = holds_item  # False once the item was deleted or pruned
        self._session_id = session_id
        self._answer_started: asyncio.Event | None = None  # the latest response's first output
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def hold_until(self, answer_started: asyncio.Event) -> None:
        """A response has been started: transcriptions not yet submitted wait for its first output."""
        self._answer_started = answer_started

    def transcribe(
        self, entry: Entry, settings: InputTranscription | None, held: HeldTranscriptions | None = None,
        partial: PartialText | None = None,
    ) -> None:
        """Transcribe a user item's audio parts, if the session asks for it (``settings``); ``held``
        offers transcriptions already running (a speculative answer's); ``partial``: what partial
        transcripts said of one part while it was spoken."""
        if settings is None or self._closed or not isinstance(entry, UserEntry):
            return
        for content_index, part in enumerate(entry.parts):
            if isinstance(part, UserAudio):
                request = None if not np.any(part.pcm) else TurnRequest.transcription(part, settings.hint())
                running = held(request) if held is not None and request is not None else None
                said = partial if partial is not None and partial.content_index == content_index else None
                text = PartialText(content_index, shown=said.shown) if said is not None else PartialText(content_index)
                task = asyncio.create_task(
                    self._run(entry, content_index, request, running, text),
                    name=f"transcription {entry.id}[{content_index}]",
                )
                self._tasks.add(task)
                task.add_done_callback(self._on_task_done)

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: %s crashed", self._session_id, task.get_name(), exc_info=task.exception())

    async def _run(
        self, entry: UserEntry, content_index: int, request: TurnRequest | None, held: HeldTurn | None,
        text: PartialText,
    ) -> None:
        """Transcribe one audio part; ``request`` None: digital silence, transcribed as "" at once;
        ``held``: its turn, already running (promoted now, so that it is no longer preemptible);
        ``text``: what its deltas have said so far (the partial transcripts')."""
        # Runs first on the loop's next turn, after the commit's response (if any) was started.
        answer_started = self._answer_started
        try:
            if held is not None and not await held.promote():
                await held.close()
                held = None
            if answer_started is not None:
                await answer_started.wait()
            if not self._holds_item(entry):
                logger.debug("session %s: item %s is gone; not transcribing it", self._session_id, entry.id)
                return
            if request is None:
                done = TurnDone(text="", usage=Usage(0, 0, 0), finish_reason="stop")
            else:
                try:
                    events = held.events() if held is not None else self._engine.run_turn(request)
                    done = await self._stream(entry.id, text, events)
                except EngineError as exc:
                    self._fail(entry.id, content_index, exc.code, str(exc))
                    return
                except Exception as exc:
                    self._fail(entry.id, content_index, "server_error", exc)
                    return
        finally:
            if held is not None:
                await held.close()
        entry.transcribed(content_index, done.text)
        usage = done.usage
        self._emit(
            ConversationItemInputAudioTranscriptionCompletedEvent(
                item_id=entry.id,
                content_index=content_index,
                transcript=done.text,
                usage=TranscriptionUsage(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_text_tokens,
                    total_tokens=usage.input_tokens + usage.output_text_tokens,
                    input_token_details=TranscriptionInputTokenDetails(
                        text_tokens=usage.input_text_tokens, audio_tokens=usage.input_audio_tokens
                    ),
                ),
            )
        )

    async def _stream(self, item_id: str, text: PartialText, events: AsyncGenerator[TurnEvent, None]) -> TurnDone:
        done: TurnDone | None = None
        so_far = ""
        async with contextlib.aclosing(events) as turn:
            async for event in turn:
                if isinstance(event, TextDelta) and event.text:
                    so_far += event.text
                    delta = text.final(so_far)
                    if delta is not None:
                        self._emit(ConversationItemInputAudioTranscriptionDeltaEvent(
                            item_id=item_id, content_index=text.content_index, delta=delta, transcript=so_far,
                        ))
                elif isinstance(event, TurnDone):
                    done = event
        if done is None:
            raise EngineError("The engine ended the transcription without TurnDone.", code="engine_protocol_error")
        return done

    def _fail(self, item_id: str, content_index: int, code: str, cause: BaseException | str) -> None:
        where = f"session {self._session_id}: transcribing {item_id}"
        self._emit(transcription_failed_event(code, cause, where=where, item_id=item_id, content_index=content_index))
