"""The engine process: loads one checkpoint and decodes its generations together, streaming events back.

``TransformersEngine`` starts :func:`main` in a spawned process so that model compute never
holds the server's GIL. Two one-way pipes join them: commands (``Submit``, ``Cancel``) arrive
on one and are read by a command thread while the main thread computes; events
(``WarmingUp``, ``Ready``, ``GenerationEventMessage``, ``GenerationFailed``) go back on the other, one message
per event as soon as it is produced. Closing the command pipe stops the process.

The messages are ``pipeline.local.engine_messages``'s, the checkpoint's loading
``pipeline.local.checkpoint``'s. Between loading and ``Ready`` the process warms up (``pipeline.local.warmup``): a few short generations
through the same batch server that then serves, so that the first user's turn pays none of the
first-call costs; the parent submits no generation before ``Ready``, which carries the warm-up's report.
A benchmark's emulated speed (``pipeline.local.emulation``) is kept here, between the batch server and
the pipe.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Protocol, TypeAlias

from pipeline.contract import AudioChunk, GenerationDone, GenerationEvent, TextDelta, Usage
from pipeline.local.checkpoint import LoadedCheckpoint, forced_tokens, load_checkpoint
from pipeline.local.devices import ENGINE_NICENESS
from pipeline.local.emulation import EmulatedGenerations
from pipeline.local.engine_messages import (
    Cancel,
    EngineProcessSpec,
    GenerationEventMessage,
    GenerationFailed,
    LoadFailed,
    Ready,
    Submit,
    WarmingUp,
)
from pipeline.local.warmup import WarmUpReport, warm_up_generations, warm_up_params
from pipeline.token_count import PromptTooLong

if TYPE_CHECKING:
    from pipeline.local.decode_batch import PrefillInProgress, TalkerPrefillInProgress
    from pipeline.local.end_of_turn import ChunkedMessageEndProbability
    from pipeline.local.params import GenerationParams
    from pipeline.local.prompt import ThinkerInputs

    # A long prompt's work done a chunk at a time between the batch's steps.
    _ChunkedWork: TypeAlias = "PrefillInProgress[int] | TalkerPrefillInProgress[int] | _ScoreInProgress"

logger = logging.getLogger(__name__)


def main(spec: EngineProcessSpec, commands: Connection, events: Connection) -> None:
    """Entry point of the engine process."""
    # Ctrl-C (SIGINT) and a service manager's stop (SIGTERM to the whole control group: systemd's
    # default KillMode) reach this process too; the parent decides when it stops (its command pipe
    # closes, also when the parent dies), as multiprocessing's own resource tracker does.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.SIG_IGN)
    os.nice(ENGINE_NICENESS)
    logging.basicConfig(
        level=spec.log_level, format=f"%(asctime)s %(levelname)s engine[{os.getpid()}] %(name)s: %(message)s"
    )
    try:
        loaded = load_checkpoint(spec)
    except Exception as exc:
        logger.exception("loading %s failed", spec.model)
        events.send(LoadFailed(f"loading {spec.model} failed: {type(exc).__name__}: {exc}"))
        return
    events.send(WarmingUp())
    report = warm_up(loaded)
    events.send(
        Ready(
            pid=os.getpid(),
            device=loaded.device,
            dtype=str(loaded.dtype).removeprefix("torch."),
            threads=loaded.threads,
            warm_up=report,
        )
    )
    _serve(loaded, commands, events)


class _Commands:
    """Reads commands on its own thread so that a cancel lands while a generation computes."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        # Generations submitted back to back arrive as one list, so that they are prefilled together.
        self.submitted: queue.SimpleQueue[list[Submit] | None] = queue.SimpleQueue()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="engine-commands", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_cancelled(self, generation_id: int) -> bool:
        if self._closed.is_set():
            return True
        with self._lock:
            return generation_id in self._cancelled

    def forget(self, generation_id: int) -> None:
        with self._lock:
            self._cancelled.discard(generation_id)

    def _read(self) -> None:
        try:
            submits: list[Submit] = []
            while True:
                command = self._connection.recv()
                if isinstance(command, Submit):
                    submits.append(command)
                elif isinstance(command, Cancel):
                    with self._lock:
                        self._cancelled.add(command.generation_id)
                    # Wakes a batch server asleep until an emulated release: the cancel is at once.
                    self.submitted.put([])
                else:
                    logger.error("ignoring an unknown command %r", command)
                # The parent sends concurrent sessions' generations one after another within
                # microseconds; handing over each alone would prefill the first by itself
                # (~12 ms on the dev model) before the others join.
                if submits and not self._connection.poll(0):
                    self.submitted.put(submits)
                    submits = []
        except (EOFError, OSError):
            # The parent closed the pipe (or died): finish the running generation as cancelled and exit.
            logger.info("command pipe closed; stopping")
        finally:
            self._closed.set()
            self.submitted.put(None)


def _serve(loaded: LoadedCheckpoint, commands_connection: Connection, events: Connection) -> None:
    commands = _Commands(commands_connection)
    commands.start()
    _BatchServer(loaded, commands, events.send, loaded.max_batch).run()


class _CommandSource(Protocol):
    """Where a batch server's generations come from: the parent's pipe (``_Commands``), or the warm-up's script."""

    submitted: queue.SimpleQueue[list[Submit] | None]

    def is_cancelled(self, generation_id: int) -> bool: ...

    def forget(self, generation_id: int) -> None: ...


class _Script:
    """The warm-up's generations, as if submitted together; none is cancelled."""

    def __init__(self, submits: list[Submit]) -> None:
        self.submitted: queue.SimpleQueue[list[Submit] | None] = queue.SimpleQueue()
        self.submitted.put(submits)

    def is_cancelled(self, generation_id: int) -> bool:
        return False

    def forget(self, generation_id: int) -> None:
        pass


def warm_up(loaded: LoadedCheckpoint) -> WarmUpReport:
    """Runs ``pipeline.local.warmup``'s generations through a batch server like the one that then serves (its
    events thrown away, failures logged) and reports them."""
    started, started_cpu = time.monotonic(), time.process_time()
    counts = collections.Counter[str]()

    def tally(message: object) -> None:
        if isinstance(message, GenerationFailed):
            counts["failed"] += 1
            logger.error("a warm-up generation failed (its paths are not warmed): %s", message.message)
        elif isinstance(message, GenerationEventMessage):
            counts[type(message.event).__name__] += 1

    params = warm_up_params(loaded.base_params)
    groups = warm_up_generations(speaks=bool(getattr(loaded.model, "has_talker", False)))
    generation_ids = iter(range(-1, -1000, -1))  # never a parent's generation id (those count up from 1)
    for group in groups:
        script = _Script([Submit(next(generation_ids), request) for request in group])
        _BatchServer(loaded, script, tally, loaded.max_batch, base_params=params).run(until_idle=True)
    if loaded.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    report = WarmUpReport(
        turns=sum(len(group) for group in groups),
        failed=counts["failed"],
        audio_chunks=counts[AudioChunk.__name__],
        text_deltas=counts[TextDelta.__name__],
        ms=round((time.monotonic() - started) * 1000, 1),
        cpu_ms=round((time.process_time() - started_cpu) * 1000, 1),
    )
    logger.info("warmed up in %.0f ms (%.0f ms of CPU): %s", report.ms, report.cpu_ms, report)
    return report


@dataclass
class _ScoreInProgress:
    """An end-of-turn score of a prompt longer than a prefill chunk, computed a chunk at a time."""

    generation_id: int
    inputs: ThinkerInputs
    score: ChunkedMessageEndProbability

    @property
    def key(self) -> int:
        return self.generation_id

    def advance(self) -> bool:
        return self.score.advance()


class _BatchServer:
    """Decodes every admitted generation together, one ``DecodeBatch`` step at a time.

    Between steps: cancelled generations leave the batch (their ``GenerationDone`` says "cancelled"),
    then the waiting generations whose prompts fit a prefill chunk (512 positions) are prefilled
    together and join, and one chunk of one longer prompt's work is computed: its Thinker's prefill,
    its Talker's prefill, or its end-of-turn score (the long ones take turns, chunk by chunk). A
    generation joins the Thinker's rows when its Thinker's last chunk is in and the Talker's when its
    Talker's is, its text decoding meanwhile; a score is sent when its last chunk is in. The Talker's
    prompt holds the user parts of the whole conversation, so it is nearly as long as the Thinker's:
    prefilled whole, it would hold every other generation for as long as the Thinker's would. So a
    joining generation delays the decoding ones by one short prefill and one chunk, never by a whole
    long prompt or a whole answer; a short prompt is never padded to a long one's length; a cancel
    lands between chunks. The parent submits at most
    ``max_batch`` generations at a time; any beyond that wait here in FIFO order. A generation whose
    rendering or prefill fails fails alone; a failure inside a batched step cannot be
    blamed on one generation, so it fails every generation in the batch and the next ones start afresh.
    Events leave through ``send`` (the pipe's), held first to an emulated speed when the
    settings ask for one (``pipeline.local.emulation``).
    """

    def __init__(
        self,
        loaded: LoadedCheckpoint,
        commands: _CommandSource,
        send: Callable[[object], None],
        max_batch: int,
        *,
        base_params: GenerationParams | None = None,
    ) -> None:
        from pipeline.local.decode_batch import DecodeBatch

        self._loaded = loaded
        self._commands = commands
        self._send_message = send
        self._max_batch = max_batch
        self._base_params = loaded.base_params if base_params is None else base_params
        self._new_batch = lambda: DecodeBatch[int](loaded.model, loaded.tokenizer)  # noqa: E731
        self._batch = self._new_batch()
        self._waiting: collections.deque[Submit] = collections.deque()
        # Long prompts' work done a chunk at a time, the next to take a chunk first.
        self._chunking: collections.deque[_ChunkedWork] = collections.deque()
        self._emulated = EmulatedGenerations[int](self._send_now)
        self._closing = False

    def run(self, *, until_idle: bool = False) -> None:
        """Serve until the commands end (``until_idle``: until every generation submitted so far is over)."""
        while True:
            idle = not self._batch.keys and not self._waiting and not self._chunking
            # Asleep while idle, until a command comes or a held event is due.
            release_in = self._emulated.seconds_to_next()
            self._collect_commands(block=idle and not (until_idle and release_in is None), timeout=release_in)
            if until_idle and not self._batch.keys and not self._waiting and not self._chunking and self._emulated.seconds_to_next() is None:
                return
            if self._closing:
                for key in self._batch.keys:
                    self._emulated.cancel(key)
                    self._send_now(key, self._batch.cancel(key))
                for work in self._chunking:
                    self._end_unfinished(work)
                self._chunking.clear()
                for key in self._emulated.holds_done():
                    self._send_cancelled(key)
                return
            self._leave_cancelled()
            # Every waiting generation that fits joins in one batched prefill per gap between steps:
            # decoding generations wait for one prefill (four cost ~1.5 one), joining generations for none.
            joining: list[Submit] = []
            while self._waiting and self._in_flight() + len(joining) < self._max_batch:
                joining.append(self._waiting.popleft())
            if joining:
                self._admit(joining)
            if self._chunking:
                self._advance_chunked()
            if self._batch.keys:
                self._step()
            self._emulated.release_due()

    def _in_flight(self) -> int:
        """Generations admitted and not over: decoding, or with work in chunks (each counted once)."""
        return len(set(self._batch.keys) | {work.key for work in self._chunking})

    def _collect_commands(self, *, block: bool, timeout: float | None) -> None:
        """Take what was submitted; when ``block``, wait for it, at most ``timeout`` seconds."""
        submitted = self._commands.submitted
        try:
            command = submitted.get(timeout=timeout) if block else submitted.get_nowait()
        except queue.Empty:
            return
        while True:
            if command is None:
                self._closing = True
                return
            self._waiting.extend(command)
            try:
                command = submitted.get_nowait()
            except queue.Empty:
                return

    def _send(self, generation_id: int, event: GenerationEvent) -> None:
        """The event goes now, or when the emulated model would have produced it."""
        self._emulated.offer(generation_id, event)

    def _send_now(self, generation_id: int, event: GenerationEvent) -> None:
        self._send_message(GenerationEventMessage(generation_id, event))
        if isinstance(event, GenerationDone):
            self._commands.forget(generation_id)

    def _send_cancelled(self, generation_id: int) -> None:
        """A generation whose decoding is over but whose emulated time is not: its ``GenerationDone`` goes at once."""
        done = self._emulated.cancel(generation_id)
        if done is not None:
            self._send_now(generation_id, done)

    def _fail(self, generation_id: int, exc: Exception) -> None:
        code = exc.code if isinstance(exc, PromptTooLong) else "engine_error"
        self._emulated.cancel(generation_id)
        self._send_message(GenerationFailed(generation_id, f"{type(exc).__name__}: {exc}", code))
        self._commands.forget(generation_id)

    def _leave_cancelled(self) -> None:
        for key in self._batch.keys:
            if self._commands.is_cancelled(key):
                self._emulated.cancel(key)
                self._send_now(key, self._batch.cancel(key))
        for key in self._emulated.holds_done():
            if self._commands.is_cancelled(key):
                self._send_cancelled(key)
        for work in [work for work in self._chunking if self._commands.is_cancelled(work.key)]:
            self._chunking.remove(work)
            self._end_unfinished(work)
        for submit in [submit for submit in self._waiting if self._commands.is_cancelled(submit.generation_id)]:
            self._waiting.remove(submit)
            self._send_now(submit.generation_id, GenerationDone(text="", usage=Usage(0, 0, 0), finish_reason="cancelled"))

    def _end_unfinished(self, work: _ChunkedWork) -> None:
        """Chunked work left before its last chunk (cancelled, or the process stopping) ends as "cancelled"."""
        from pipeline.local.decode_batch import PrefillInProgress

        if isinstance(work, PrefillInProgress):
            self._emulated.cancel(work.key)
            self._send_now(work.key, self._batch.cancelled_before_start(work.turn.inputs))
        elif isinstance(work, _ScoreInProgress):
            self._send_now(work.key, GenerationDone(text="", usage=self._score_usage(work.inputs), finish_reason="cancelled"))
        # A Talker prefill's generation is in the batch: leaving the batch ended it.

    def _admit(self, submits: list[Submit]) -> None:
        """Prefill the generations whose prompts fit a chunk together; if that fails, one at a time,
        so a bad generation fails alone. Longer prompts begin their chunked prefill
        (``_advance_chunked``). End-of-turn scores never join the batch: one forward each, or
        chunk by chunk for a longer prompt."""
        for submit in [submit for submit in submits if submit.request.task == "end_of_turn"]:
            self._score_end_of_turn(submit)
        submits = [submit for submit in submits if submit.request.task != "end_of_turn"]
        for submit in submits:  # the emulated model's time starts here, with its rendering
            self._emulated.start(submit.generation_id, self._base_params.emulate)
        rendered: list[tuple[int, ThinkerInputs, GenerationParams]] = []
        for submit in submits:
            prepared = self._render(submit)
            if prepared is None:
                continue
            if not self._batch.chunked(prepared[1]):
                rendered.append(prepared)
                continue
            try:
                self._chunking.append(self._batch.begin_prefill(*prepared))
            except Exception as exc:
                logger.exception("generation %d failed", prepared[0])
                self._fail(prepared[0], exc)
        if not rendered:
            return
        if len(rendered) > 1:
            try:
                self._prefill(rendered)
            except Exception:
                logger.exception("a batched prefill of %d generations failed; prefilling them one at a time", len(rendered))
                for generation_id, _, _ in rendered:
                    if generation_id in self._batch.keys:
                        self._batch.cancel(generation_id)
            else:
                self._finish_decoded()
                return
        for prepared in rendered:
            try:
                self._prefill([prepared])
            except Exception as exc:
                logger.exception("generation %d failed", prepared[0])
                if prepared[0] in self._batch.keys:
                    self._batch.cancel(prepared[0])
                self._fail(prepared[0], exc)
        self._finish_decoded()

    def _advance_chunked(self) -> None:
        """One chunk of the next long prompt's work; when it was the last, the work's result (the
        generation joins the Thinker's or the Talker's rows, or the score is sent). The long prompts
        take turns: one session's cannot hold another's back by its length."""
        work = self._chunking.popleft()
        try:
            if not work.advance():
                self._chunking.append(work)
                return
            events = self._finish_chunked(work)
        except Exception as exc:
            logger.exception("generation %d failed", work.key)
            if work.key in self._batch.keys:
                self._batch.cancel(work.key)
            self._fail(work.key, exc)
            return
        for generation_id, event in events:
            self._send(generation_id, event)
        self._finish_decoded()

    def _finish_chunked(self, work: _ChunkedWork) -> list[tuple[int, GenerationEvent]]:
        """What work whose last chunk is in gives: a Thinker prefill's first token (and its Talker's
        prefill begins, chunked too when long), a Talker prefill's turn speaking, a score."""
        from pipeline.local.decode_batch import PrefillInProgress, TalkerPrefillInProgress

        if isinstance(work, PrefillInProgress):
            events = self._batch.join_prefilled(work)
            if self._batch.wants_talker(work.key):
                self._chunking.extend(self._batch.begin_talker_prefills([work.key]))
            return events
        if isinstance(work, TalkerPrefillInProgress):
            self._batch.join_talker_prefilled(work)
            return []
        done = GenerationDone(text="", usage=self._score_usage(work.inputs), finish_reason="stop",
                              end_of_turn_probability=work.score.probability())
        return [(work.key, done)]

    def _score_end_of_turn(self, submit: Submit) -> None:
        """One forward for a prompt that fits a prefill chunk; a longer one is scored a chunk at a time."""
        from pipeline.local.end_of_turn import ChunkedMessageEndProbability, message_end_probability

        renderer = self._loaded.renderer
        try:
            inputs = renderer.render_request(submit.request)
            if self._batch.chunked(inputs):
                score = ChunkedMessageEndProbability(self._loaded.model, inputs, renderer.message_end_id,
                                                     chunk=self._batch.prefill_chunk)
                self._chunking.append(_ScoreInProgress(submit.generation_id, inputs, score))
                return
            probability = message_end_probability(self._loaded.model, inputs, renderer.message_end_id)
        except Exception as exc:
            logger.exception("generation %d failed", submit.generation_id)
            self._fail(submit.generation_id, exc)
            return
        self._send(submit.generation_id, GenerationDone(text="", usage=self._score_usage(inputs), finish_reason="stop",
                                                        end_of_turn_probability=probability))

    @staticmethod
    def _score_usage(inputs: ThinkerInputs) -> Usage:
        return Usage(input_text_tokens=inputs.text_tokens, input_audio_tokens=0, output_text_tokens=0)

    def _render(self, submit: Submit) -> tuple[int, ThinkerInputs, GenerationParams] | None:
        """The generation's Thinker inputs and settings; None (and the generation failed) when it cannot start."""
        generation_id, request = submit.generation_id, submit.request
        params = dataclasses.replace(
            self._base_params,
            voice=request.voice,
            temperature=request.temperature,
            max_output_tokens=request.max_output_tokens,
            output_audio=request.output_audio,
        )
        try:
            if request.forced_reply is not None:
                params = dataclasses.replace(params, forced_tokens=forced_tokens(self._loaded.tokenizer, request.forced_reply))
            if params.output_audio and not self._loaded.model.has_talker:
                raise ValueError("this engine was started without audio output; ask for text only")
            inputs = self._loaded.renderer.render_request(request)
            length, limit = inputs.input_ids.shape[-1], self._loaded.max_prompt_tokens
            if length > limit:
                raise PromptTooLong(f"the prompt is {length} tokens; this engine takes at most {limit}")
            return generation_id, inputs, params
        except PromptTooLong as exc:
            logger.warning("generation %d refused: %s", generation_id, exc)
            self._fail(generation_id, exc)
            return None
        except Exception as exc:
            logger.exception("generation %d failed", generation_id)
            self._fail(generation_id, exc)
            return None

    def _prefill(self, rendered: list[tuple[int, ThinkerInputs, GenerationParams]]) -> None:
        """Both prefills (a Talker prompt longer than a chunk only begun: ``_advance_chunked``), then
        the first tokens' text (none is sent if either fails)."""
        events = self._batch.prefill_thinkers(rendered)
        speaking = [generation_id for generation_id, _, _ in rendered if self._batch.wants_talker(generation_id)]
        if speaking:
            self._chunking.extend(self._batch.begin_talker_prefills(speaking))
        for generation_id, event in events:
            self._send(generation_id, event)

    def _step(self) -> None:
        batch = self._batch
        try:
            for key, event in batch.step_thinker():
                self._send(key, event)
            batch.step_talker()
            if batch.chunks_due():
                for key, event in batch.decode_chunks():
                    self._send(key, event)
        except Exception as exc:
            logger.exception("a decoding step failed; failing the %d generation(s) in the batch", len(batch.keys))
            failed = batch.keys
            for key in failed:
                self._fail(key, exc)
            # Their Talker prefills in progress go with them.
            self._chunking = collections.deque(work for work in self._chunking if work.key not in failed)
            self._batch = self._new_batch()
            return
        self._finish_decoded()

    def _finish_decoded(self) -> None:
        for key in self._batch.finished_keys():
            self._send(key, self._batch.finish(key))
