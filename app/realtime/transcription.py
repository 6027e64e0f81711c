"""Input audio transcription: the user's words, final after the commit and partial while speaking.

:class:`Transcriptions` runs one Qwen3-Omni ASR turn per committed user item with
``audio.input.transcription`` on (``conversation.item.input_audio_transcription.delta`` /
``.completed`` / ``.failed``), after the answer has started, taking a speculative answer's own
transcription when one ran. :class:`PartialTranscripts` transcribes the utterance so far about
every second while the user speaks, as preemptible engine turns on spare capacity only, one in
flight per session, and shows the words two hypotheses agree on (LocalAgreement-2, after
whisper_streaming). docs/SESSION.md "Input audio transcription" and "Partial transcripts".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import numpy as np

from app.realtime.failures import FailureCode, transcription_failed_event
from app.realtime.held_generation import HeldGeneration
from app.realtime.history import Entry, UserEntry
from app.realtime.protocol import (
    ConversationItemInputAudioTranscriptionCompletedEvent,
    ConversationItemInputAudioTranscriptionDeltaEvent,
    EmitEvent,
    TranscriptionInputTokenDetails,
    TranscriptionUsage,
    new_id,
)
from app.realtime.session_config import InputTranscription
from app.realtime.shares import SessionShare, request_estimate
from app.realtime.turn_taking import SpeechSoFar
from media.rates import SPEECH_RATE
from pipeline.contract import (
    Engine,
    EngineError,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    Usage,
)
from pipeline.conversation import UserAudio

# ---- partial_transcripts ----

logger = logging.getLogger(__name__)

# The cadence: "every second or so of speech". Qwen3-Omni's audio encoder makes 12.5
# tokens a second, so a second adds ~13 audio tokens and, in English, 2-3 words.
PARTIAL_INTERVAL_MS = 1_000
# Past 4 s the step is this share of the audio so far: each partial transcribes the whole
# utterance, so with fixed 1 s steps a 30 s segment's partials would transcribe 465 s of audio;
# with this rule 13 partials transcribe ~140 s (~5x the audio, at most).
STEP_SHARE = 0.25
MAX_BACKOFF_DOUBLINGS = 3  # superseded partials in a row double the step, up to 8x

# One word, as partial hypotheses are compared: its leading space and a run of non-space
# characters, or one CJK character (Chinese and Japanese put no spaces between words); trailing space.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)|\s+$")

# (outcome, engine seconds): "started", then "done", "superseded", "cancelled", "refused",
# "preempted" or "failed".
PartialObserver = Callable[[str, float], None]


def words(text: str) -> list[str]:
    """``text`` cut into words as hypotheses are compared; they join back to ``text``."""
    return _WORD.findall(text)


def agreed_prefix(older: str, newer: str) -> str:
    """The words two hypotheses start with alike (LocalAgreement-2's commit)."""
    agreed: list[str] = []
    for a, b in zip(words(older), words(newer), strict=False):
        if a != b:
            break
        agreed.append(a)
    return "".join(agreed)


@dataclass
class PartialText:
    """What one item part's transcription deltas have said (``shown``: their concatenation, what
    a client that appends them shows) and the newest partial hypothesis (``latest``)."""

    content_index: int
    shown: str = ""
    latest: str | None = None

    def partial(self, hypothesis: str) -> str | None:
        """The ``delta`` of a new partial hypothesis: the words the previous one agreed on past
        what was shown (often ""); None: nothing new to tell (the same text again, or a first empty one)."""
        previous, self.latest = self.latest, hypothesis
        if hypothesis == (previous or ""):
            return None
        agreed = "" if previous is None else agreed_prefix(previous, hypothesis)
        return self._extend(agreed) or ""

    def final(self, text: str) -> str | None:
        """The ``delta`` of the final transcription's text so far: what it says past ``shown`` when
        it starts with it; None otherwise (nothing new yet, or it revises what the partials said:
        the ``.completed`` transcript tells the client)."""
        return self._extend(text)

    def _extend(self, text: str) -> str | None:
        if len(text) <= len(self.shown) or not text.startswith(self.shown):
            return None
        delta, self.shown = text[len(self.shown):], text
        return delta


class PartialTranscripts:
    """One session's partial transcripts: the item being spoken, the partial in flight, the cadence.

    ``content_index``: the audio part's index a commit now would give it. ``close()`` cancels the
    partial in flight and awaits every one it started (safe twice).
    """

    def __init__(self, engine: Engine, emit: EmitEvent, content_index: Callable[[], int], *,
                 session_id: str, share: SessionShare, on_outcome: PartialObserver | None = None) -> None:
        self._engine = engine
        self._emit = emit
        self._content_index = content_index
        self._session_id = session_id
        self._on_outcome = on_outcome
        self._share = share  # a partial runs only within the share of the engine (the session's and its client's)
        self._item_id: str | None = None  # the item being spoken
        self._text: PartialText | None = None  # what its partials have said
        self._next_due = 0  # its audio, in samples, at which the next partial is due
        self._superseded = 0  # partials superseded in a row
        self._current: HeldGeneration | None = None
        self._stopping: list[HeldGeneration] = []  # cancelled, maybe still stopping in the engine
        self._closed = False

    def __len__(self) -> int:
        """Partial turns still running (stats)."""
        return int(self._current is not None) + sum(not held.stopped for held in self._stopping)

    def heard(self, speech: SpeechSoFar | None, settings: InputTranscription | None) -> None:
        """After each piece of input: the item being spoken (None: none) and the session's transcription."""
        if self._closed:
            return
        if speech is None:
            if self._item_id is not None:
                self.stop()  # dropped without a commit (input_audio_buffer.clear, a turn detection change)
            return
        if speech.item_id != self._item_id:
            self.stop()
            self._item_id = speech.item_id
            self._next_due = PARTIAL_INTERVAL_MS * SPEECH_RATE // 1000
        if settings is None or not settings.partials:
            self._cancel("cancelled")
            return
        if speech.hearing and speech.samples >= self._next_due:
            self._start(speech, settings)

    def committed(self, item_id: str) -> PartialText | None:
        """``item_id`` was committed: its partial in flight is cancelled; what its partials said
        is handed to the final transcription."""
        text = self._text if item_id == self._item_id else None
        self.stop()
        return text

    def stop(self) -> None:
        """The utterance is over (committed or dropped): nothing of it is transcribed partially any more."""
        self._cancel("cancelled")
        self._item_id = None
        self._text = None
        self._superseded = 0

    async def close(self) -> None:
        self._closed = True
        self.stop()
        stopping, self._stopping = self._stopping, []
        for held in stopping:
            await held.close()

    def _start(self, speech: SpeechSoFar, settings: InputTranscription) -> None:
        if self._current is not None:
            self._superseded += 1
            self._cancel("superseded")
        pcm = speech.audio()
        step = max(PARTIAL_INTERVAL_MS * SPEECH_RATE // 1000, int(pcm.size * STEP_SHARE))
        # From the point it was due (the audio comes in 20 ms pieces, or more: no drift), unless
        # it started later than that by a step or more (after a pause).
        anchor = self._next_due if pcm.size - self._next_due < step else pcm.size
        self._next_due = anchor + step * 2 ** min(self._superseded, MAX_BACKOFF_DOUBLINGS)
        if not np.any(pcm):
            return  # digital silence (a muted microphone) holds no words
        request = dataclasses.replace(GenerationRequest.transcription(UserAudio(pcm), settings.hint()),
                                      preemptible_id=new_id("partial"))
        if self._share.charge_within(request_estimate(request), "partial_transcript") is not None:
            return  # throw-away work runs only within the share of the engine (the session's and its client's)
        self._report("started", 0.0)
        self._current = HeldGeneration(self._engine, request, name=f"partial transcript {speech.item_id}",
                                 on_end=self._ended)

    def _ended(self, held: HeldGeneration) -> None:
        """A partial ended by itself: shown if it has a transcript, else forgotten."""
        if held is not self._current:
            return
        self._current = None
        code = held.engine_code
        if code == "no_spare_capacity":
            self._report("refused", 0.0)
            return
        if code == "preempted":
            self._report("preempted", held.engine_seconds())
            return
        done = held.done
        if done is None:
            logger.warning("session %s: a partial transcript failed (%r); the final transcription is unaffected",
                           self._session_id, held.error)
            self._report("failed", held.engine_seconds())
            return
        self._superseded = 0
        self._report("done", held.engine_seconds())
        self._show(done.text)

    def _show(self, hypothesis: str) -> None:
        assert self._item_id is not None
        index = self._content_index()
        if self._text is None or self._text.content_index != index:
            self._text = PartialText(index)
        delta = self._text.partial(hypothesis)
        if delta is not None:
            self._emit(ConversationItemInputAudioTranscriptionDeltaEvent(
                item_id=self._item_id, content_index=index, delta=delta, partial=True, transcript=hypothesis,
            ))

    def _cancel(self, outcome: str) -> None:
        held, self._current = self._current, None
        if held is None:
            return
        self._report(outcome, held.engine_seconds())
        held.cancel()
        self._stopping = [other for other in self._stopping if not other.stopped]
        self._stopping.append(held)

    def _report(self, outcome: str, engine_seconds: float) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome, engine_seconds)


# ---- transcription ----

# Given a transcription request, the held turn already running it (the caller's to own), or None.
HeldTranscriptions = Callable[[GenerationRequest], HeldGeneration | None]

logger = logging.getLogger(__name__)


# Transcriptions a session runs on the engine at once; the others wait their turn, and one whose
# item leaves the history meanwhile is dropped (``forget_gone``). Each commit with transcription
# on is one engine generation: 150 commits of 100 ms of noise, each in the engine's one queue, put
# another visitor's first words 19.4 s late.
MAX_TRANSCRIPTIONS_RUNNING = 2


class Transcriptions:
    """The session's transcription tasks; ``close()`` cancels and awaits them (safe twice)."""

    def __init__(
        self, engine: Engine, emit: EmitEvent, holds_item: Callable[[Entry], bool], session_id: str, *,
        share: SessionShare,
    ) -> None:
        self._engine = engine
        self._share = share
        self._emit = emit
        self._holds_item = holds_item  # False once the item was deleted or pruned
        self._session_id = session_id
        self._answer_started: asyncio.Event | None = None  # the latest response's first output
        self._tasks: dict[asyncio.Task[None], UserEntry] = {}
        self._running = asyncio.Semaphore(MAX_TRANSCRIPTIONS_RUNNING)
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
                request = None if not np.any(part.pcm) else GenerationRequest.transcription(part, settings.hint())
                running = held(request) if held is not None and request is not None else None
                said = partial if partial is not None and partial.content_index == content_index else None
                text = PartialText(content_index, shown=said.shown) if said is not None else PartialText(content_index)
                task = asyncio.create_task(
                    self._run(entry, content_index, request, running, text),
                    name=f"transcription {entry.id}[{content_index}]",
                )
                self._tasks[task] = entry
                task.add_done_callback(self._on_task_done)

    def forget_gone(self) -> None:
        """Drops the transcriptions of items that have left the history (deleted or pruned)."""
        for task, entry in list(self._tasks.items()):
            if not self._holds_item(entry):
                task.cancel()

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: %s crashed", self._session_id, task.get_name(), exc_info=task.exception())

    async def _run(
        self, entry: UserEntry, content_index: int, request: GenerationRequest | None, held: HeldGeneration | None,
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
                done = GenerationDone(text="", usage=Usage(0, 0, 0), finish_reason="stop")
            else:
                async with self._running if held is None else contextlib.nullcontext():
                    if not self._holds_item(entry):
                        logger.debug("session %s: item %s is gone; not transcribing it", self._session_id, entry.id)
                        return
                    if held is None:
                        self._share.charge(request_estimate(request))
                    try:
                        events = held.events() if held is not None else self._engine.run_generation(request)
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

    async def _stream(self, item_id: str, text: PartialText, events: AsyncGenerator[GenerationEvent, None]) -> GenerationDone:
        done: GenerationDone | None = None
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
                elif isinstance(event, GenerationDone):
                    done = event
        if done is None:
            raise EngineError("The engine ended the transcription without GenerationDone.", code="engine_protocol_error")
        return done

    def _fail(self, item_id: str, content_index: int, code: FailureCode, cause: BaseException | str) -> None:
        where = f"session {self._session_id}: transcribing {item_id}"
        self._emit(transcription_failed_event(code, cause, where=where, item_id=item_id, content_index=content_index))

