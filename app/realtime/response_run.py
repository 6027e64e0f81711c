"""One response run from start to end: the room that owns a response's lifecycle.

The session decides *when* to respond (a commit, ``response.create``, an idle timeout) and when to
cancel (barge-in, ``response.cancel``, an output clear, ``session.finish``); ``ResponseRun`` does
the rest, in one task that it owns: it waits for the response before it to send its
``response.done``, renders the conversation, runs the engine turn (the speculative one taken at the
commit when it answers the same request), announces the response, streams its text, audio and
function calls into its items and out as events, and finishes it (``response.done``, an ``error``
event when it failed, the message settled as heard). What it needs of the session is its
``ResponsePort``; the events themselves are built by ``app.realtime.response_events`` and
``app.realtime.function_calls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from app.realtime.answer_audio import AnswerAudio
from app.realtime.entries import AssistantEntry
from app.realtime.failures import failure_event
from app.realtime.function_calls import call_events, close_calls
from app.realtime.history import History
from app.realtime.protocol import ResponseStatus, new_id
from app.realtime.response import Response
from app.realtime.response_events import (
    created_event,
    delta_event,
    ended_as,
    finish_events,
    message_events,
    turn_request,
)
from app.realtime.session_config import SessionConfig
from app.realtime.speculation import Speculation
from pipeline.contract import (
    AudioChunk,
    Engine,
    EngineError,
    FunctionCallEvent,
    TextDelta,
    TurnDone,
    TurnEvent,
    TurnRequest,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResponsePort:
    """What a response run needs of its session."""

    session_id: str
    engine: Engine
    history: History
    audio: AnswerAudio
    config: Callable[[], SessionConfig]  # the session's settings now (session.update may change them)
    emit: Callable[[Any], None]
    prune: Callable[[], None]
    release_speculation: Callable[[Speculation], None]
    # The run has sent its response.done: the session forgets it as its current response, lets
    # the audio settle and looks at speculation again.
    finished: Callable[[ResponseRun], None]
    # Its task is over (done, cancelled or crashed): the session stops tracking it.
    over: Callable[[ResponseRun], None]


class ResponseRun:
    """Runs ``response``; ``start`` starts its task, ``cancel`` and ``close`` end it."""

    def __init__(self, response: Response, port: ResponsePort) -> None:
        self.response = response
        self._port = port
        self._task: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        return self.response.id

    @property
    def cancelling(self) -> bool:
        return self.response.cancelling

    @property
    def task(self) -> asyncio.Task[None]:
        if self._task is None:
            raise RuntimeError(f"response {self.id} was never started")
        return self._task

    def start(self, previous: ResponseRun | None) -> None:
        """Starts the run; it waits for ``previous`` (one being cancelled) to send its ``response.done`` first."""
        self._task = asyncio.create_task(self._run(previous._task if previous is not None else None),
                                         name=f"response {self.id}")
        self._task.add_done_callback(self._on_task_done)

    def cancel(self, reason: str) -> asyncio.Task[None]:
        """Cancels the run (its ``response.done`` says ``reason``); its task, to await when the
        caller must see it end."""
        self.response.cancelling = True
        self.response.cancel_reason = reason
        self.task.cancel()
        return self.task

    async def close(self) -> None:
        """Cancels the task and awaits it; safe to call twice."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait({self._task})

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        self._port.over(self)
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: %s crashed", self._port.session_id, task.get_name(), exc_info=task.exception())

    async def _run(self, previous: asyncio.Task[None] | None) -> None:
        response, port = self.response, self._port
        try:
            if previous is not None and not previous.done():
                await asyncio.wait({previous})  # a cancelled response first sends its response.done
            request = turn_request(response, port.history.conversation(response.instructions, port.config().history))
            events = await self._engine_turn(request)
            self._announce()
            self._check_context()
            done: TurnDone | None = None
            async with contextlib.aclosing(events) as turn:
                async for event in turn:
                    if isinstance(event, TextDelta):
                        self._on_text(event)
                    elif isinstance(event, AudioChunk):
                        self._on_audio(event)
                    elif isinstance(event, FunctionCallEvent):
                        for server_event in call_events(response, event, port.history):
                            port.emit(server_event)
                    elif isinstance(event, TurnDone):
                        done = event
            if done is None:
                raise EngineError("The engine ended the turn without TurnDone.", code="engine_protocol_error")
            await response.wait_first_frame()
            status, reason = ended_as(response, done)
            self._finish(status, reason=reason, done=done)
        except asyncio.CancelledError:
            self._finish("cancelled", reason=response.cancel_reason or "client_cancelled")
            raise
        except EngineError as exc:
            self._finish("failed", failure=(exc.code, str(exc)))
        except Exception as exc:
            self._finish("failed", failure=("server_error", exc))
        finally:
            if response.speculation is not None:  # used, or thrown away: the speculator awaits what is left
                port.release_speculation(response.speculation)

    async def _engine_turn(self, request: TurnRequest) -> AsyncGenerator[TurnEvent, None]:
        """The answer's engine turn: the speculative one taken at the commit when it answers
        ``request`` (its held events first), else a new one."""
        response = self.response
        held = await response.speculation.use(request) if response.speculation is not None else None
        if held is None:
            return self._port.engine.run_turn(request)
        response.speculation_started_at = held.started_at
        return held.events()

    def _check_context(self) -> None:
        """With truncation "disabled" nothing is dropped for tokens: past the budget a response fails."""
        config = self._port.config()
        limits = config.history
        tokens = self._port.history.prompt_tokens()
        if config.truncation.token_budget(limits) is None and tokens > limits.max_prompt_tokens:
            raise EngineError(f"the history holds {tokens} prompt tokens, past the {limits.max_prompt_tokens} "
                              "of its budget, and truncation is disabled", code="context_length_exceeded")

    def _announce(self) -> None:
        self._port.emit(created_event(self.response))
        if not self.response.may_call:  # with tools, the message opens at its first text: there may be none
            self._open_message()

    def _open_message(self) -> AssistantEntry:
        response = self.response
        entry = response.entry
        if entry is None:
            entry = AssistantEntry(new_id("item"), response.modality)
            response.entry = entry
            previous_id = self._port.history.append(entry)
            for event in message_events(response, previous_id):
                self._port.emit(event)
        return entry

    def _on_text(self, delta: TextDelta) -> None:
        if not delta.text:
            return
        self._open_message().add_delta(delta.text, tokens=delta.tokens)
        self._port.emit(delta_event(self.response, delta.text))

    def _on_audio(self, chunk: AudioChunk) -> None:
        pcm = chunk.pcm
        if self.response.modality != "audio" or pcm.size == 0:
            return
        entry = self._open_message()
        self.response.audio_written(to_idle_paced_output=self._port.audio.idle_and_paced())
        self._port.audio.write(self.response.id, entry, pcm)

    def _finish(
        self,
        status: ResponseStatus,
        *,
        reason: str | None = None,
        done: TurnDone | None = None,
        failure: tuple[str, BaseException | str] | None = None,
    ) -> None:
        """Ends the response; a ``failure`` (its code, and its cause for the log) is told in an ``error`` event."""
        response, port = self.response, self._port
        for event in close_calls(response, status, port.history):
            port.emit(event)
        if response.announced and not response.output:  # a plain answer has its item, even empty
            self._open_message()
        entry = response.entry
        previous_id = port.history.previous_id(entry) if entry is not None else None
        if entry is not None:  # its text ran ahead of its audio: only what is heard counts
            entry.ended_early = status in ("cancelled", "failed")
        events = finish_events(
            response, status, previous_item_id=previous_id, reason=reason, done=done,
            error_code=failure[0] if failure else None,
        )
        for event in events:
            port.emit(event)
        if failure is not None:
            code, cause = failure
            port.emit(failure_event(code, cause, where=f"session {port.session_id}: response {response.id}"))
        if entry is not None:
            if entry.audio_samples == 0:  # nothing to hear: text-only, or cut before any audio
                entry.heard = entry.text if response.modality == "text" else ""
                port.prune()
            else:
                port.audio.ledger.complete(entry.id)
        port.finished(self)
