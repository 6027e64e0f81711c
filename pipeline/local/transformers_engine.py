"""Runs Qwen3-Omni generations with ``transformers`` in separate processes, decoding concurrent
generations together.

The model lives in a spawned engine process (:mod:`pipeline.local.engine_process`) so that the server's
event loop, which paces WebRTC audio every 20 ms, never waits on model compute for the GIL.
On this side nothing blocks the loop: a reader thread hands each message from the engine
process to the loop with ``call_soon_threadsafe`` and a writer thread sends (and pickles)
commands. Up to ``max_batch`` generations run at once in the engine process, decoded together
(one forward per stage per step for all of them); generations beyond that wait in one FIFO and
the next is submitted when the engine process reports a running one over (done, failed or
cancelled), so queue waits are real. If the engine process dies, its running generations fail
with ``EngineError`` and a new process is started for the generations still waiting.

Preemptible generations (``pipeline.contract``): one starts only while fewer than ``max_batch`` generations
are decoding or waiting, else it is refused (``no_spare_capacity``). An ordinary generation that finds
every slot taken while a preemptible generation holds one cancels the newest such generation
(``preempted``) and takes its slot at once: the cancel reaches the engine process before the
submit on the same pipe, and the engine process lets cancelled generations leave before it admits new
ones, so its batch never holds more than ``max_batch``.

A process is ready (``alive``, and given generations) only once it has loaded the model and run its
warm-up generations (``pipeline.local.warmup``), at the first start and at every restart alike: no user's
generation pays a cold model's first-call costs. ``describe()`` says which phase it is in
(``loading``, ``warming``, ``ready``) and what its warm-up ran.

``TransformersEnginePool`` runs one such engine per device (or N on CPU) and sends each generation to the
least loaded one.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.contract import (
    AudioChunk,
    EngineCapabilities,
    EngineError,
    EngineHealth,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    GenerationTimings,
    TextDelta,
)
from pipeline.local import engine_process
from pipeline.local.emulation import EmulatedSpeed
from pipeline.local.engine_messages import (
    DEFAULT_MAX_BATCH,
    Cancel,
    EngineProcessSpec,
    GenerationEventMessage,
    GenerationFailed,
    LoadFailed,
    Ready,
    Submit,
    WarmingUp,
)
from pipeline.pool import LeastLoadedPool

logger = logging.getLogger(__name__)

# A load can fail for passing reasons (a GPU briefly full); one that fails three times in a
# row will not succeed on its own.
_RESTART_ATTEMPTS = 3
# How long a stopping engine process gets to finish its current decoding step and exit
# before it is killed; one step of the real model takes well under a second.
_STOP_GRACE_S = 10.0


@dataclass(eq=False)
class _Generation:
    id: int
    request: GenerationRequest
    submitted: float
    inbox: asyncio.Queue[GenerationEvent | EngineError] = field(default_factory=asyncio.Queue)
    started: float | None = None
    first_text: float | None = None
    first_audio: float | None = None
    # The consumer went away: events are dropped, but the generation keeps its batch slot until
    # the engine process confirms it stopped.
    abandoned: bool = False
    preemptible: bool = False  # may be cancelled for an ordinary generation (until promoted)

    def timings(self, now: float) -> GenerationTimings:
        started = self.submitted if self.started is None else self.started
        return GenerationTimings(
            queue_wait=started - self.submitted,
            first_text=self.first_text,
            first_audio=self.first_audio,
            total=now - self.submitted,
        )


class _EngineProcess:
    """One spawned engine process and the two threads that talk to it."""

    def __init__(
        self,
        spec: EngineProcessSpec,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[_EngineProcess, object], None],
        on_exit: Callable[[_EngineProcess, int | None], None],
    ) -> None:
        context = multiprocessing.get_context("spawn")
        command_reader, self._commands = context.Pipe(duplex=False)
        self._events, event_writer = context.Pipe(duplex=False)
        self.process = context.Process(
            target=engine_process.main, args=(spec, command_reader, event_writer), name="omni-rtc-engine", daemon=True
        )
        self._child_ends = (command_reader, event_writer)
        self._loop = loop
        self._on_message = on_message
        self._on_exit = on_exit
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="engine-events", daemon=True)
        self._writer = threading.Thread(target=self._write, name="engine-commands", daemon=True)
        self.ready: asyncio.Future[Ready] = loop.create_future()
        self.warming = False  # loaded, running its warm-up generations

    def start(self) -> None:
        """Blocking (spawning starts an interpreter): call it in a thread."""
        self.process.start()
        # Our copies of the child's ends must go, or a dead child would never read as EOF.
        for end in self._child_ends:
            end.close()
        self._reader.start()
        self._writer.start()

    def send(self, command: Submit | Cancel) -> None:
        self._outbox.put(command)

    def stop(self) -> None:
        """Closing the command pipe tells the engine process to cancel its generation and exit."""
        self._outbox.put(None)

    @property
    def running(self) -> bool:
        """Started and not exited. Read from the process's sentinel, which reaps nothing: the
        reader thread alone waits for the process (two threads in ``Process.join`` race for its
        exit status, and the loser took a stopped process for one still running)."""
        return self.process.pid is not None and not multiprocessing.connection.wait([self.process.sentinel], 0)

    def join(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Blocking: stop the process (killed after ``grace_s``), wait for it and for the threads."""
        self.stop()
        if self.process.pid is None:  # never started
            return
        if not multiprocessing.connection.wait([self.process.sentinel], grace_s):
            if grace_s > 0:
                logger.warning("engine process %s did not stop within %.0f s; killing it", self.process.pid, grace_s)
            self.process.kill()
        if self._reader.ident is not None:
            self._reader.join()  # it reaps the process once its event pipe ends
        else:
            self.process.join()
        if self._writer.ident is not None:
            self._writer.join()

    def _write(self) -> None:
        try:
            while (command := self._outbox.get()) is not None:
                self._commands.send(command)
        except OSError as exc:
            # The process died; the reader reports that, and the generation fails there.
            logger.debug("engine command pipe broke: %s", exc)
        finally:
            self._commands.close()

    def _read(self) -> None:
        try:
            while True:
                message = self._events.recv()
                self._loop.call_soon_threadsafe(self._on_message, self, message)
        except (EOFError, OSError):
            pass
        finally:
            self._events.close()
        self.process.join()
        try:
            self._loop.call_soon_threadsafe(self._on_exit, self, self.process.exitcode)
        except RuntimeError:
            logger.debug("event loop closed before engine process %s exited", self.process.pid)


class TransformersEngine:
    """``pipeline.contract.Engine`` backed by ``Qwen3OmniMoeForConditionalGeneration`` in its own process.

    ``model`` is a checkpoint directory or a Hugging Face id. ``device`` "auto" picks CUDA when
    present; ``dtype`` "auto" is bfloat16 on GPU, float32 on CPU. ``seed`` makes every generation
    reproducible. ``generation`` sets ``pipeline.local.params.GenerationParams`` fields for every
    generation (chunking, ``force_output_tokens``); the request sets voice, temperature and length.
    ``threads`` bounds torch's CPU threads in the engine process (None: torch's default, or on a
    CPU this engine's share of the usable cores when ``cpu_share`` engines run on it).
    ``max_batch`` generations are decoded together at most; later ones wait FIFO (1: one generation at a
    time).
    ``attn_implementation`` goes to ``from_pretrained`` (None: transformers' default, sdpa).
    ``audio_output`` True refuses a checkpoint without a Talker at start; False loads no Talker
    and serves text-only generations. A generation whose prompt renders to more than ``max_prompt_tokens``
    fails alone (``EngineError`` code ``prompt_too_long``) before it joins the batch.
    """

    # The whole model is here: the Thinker's tool calls are read from its tokens
    # (``pipeline.local.tool_calls``), "end_of_turn" is one forward pass of it
    # (``engine_process``), images go through its vision encoder (``pipeline.local.prompt``), and
    # preemptible generations are the batch's own rules (the module docstring).
    capabilities = EngineCapabilities(function_calls=True, forced_function_calls=True, end_of_turn_scores=True,
                                      images=True, preemptible_generations=True)

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        seed: int | None = None,
        generation: dict[str, Any] | None = None,
        threads: int | None = None,
        cpu_share: int = 1,
        max_batch: int = DEFAULT_MAX_BATCH,
        attn_implementation: str | None = None,
        audio_output: bool = True,
        max_prompt_tokens: int = EngineProcessSpec.max_prompt_tokens,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        path = Path(model)
        # Checked here too, so that a wrong emulated speed fails at construction, not in the process.
        emulate = (generation or {}).get("emulate")
        self.emulated_speed = None if emulate is None else EmulatedSpeed.of(emulate)
        self.max_batch = max_batch
        self.requested_device = device
        self.name = path.name if path.is_dir() else str(model)
        self._spec = EngineProcessSpec(
            model=str(model),
            device=device,
            dtype=dtype,
            seed=seed,
            generation=dict(generation or {}),
            threads=threads,
            cpu_share=cpu_share,
            log_level=logging.getLogger().getEffectiveLevel(),
            max_batch=max_batch,
            attn_implementation=attn_implementation,
            audio_output=audio_output,
            max_prompt_tokens=max_prompt_tokens,
        )
        self._process: _EngineProcess | None = None
        self._ready: Ready | None = None
        self._waiting: collections.deque[_Generation] = collections.deque()
        self._running: dict[int, _Generation] = {}
        # Preempted generations the engine process has not yet confirmed stopped: their slots are
        # already another generation's (see the module docstring).
        self._preempting: dict[int, _Generation] = {}
        self._generation_ids = itertools.count(1)
        self._restart_task: asyncio.Task[None] | None = None
        self._closed = False
        self.restarts = 0

    @property
    def alive(self) -> bool:
        """True while an engine process is loaded and running."""
        return self._ready is not None and self._process is not None and self._process.running

    @property
    def queue_depth(self) -> int:
        """Generations waiting for a batch slot, not counting the ones being decoded."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Generations being decoded now (at most ``max_batch``)."""
        return len(self._running)

    @property
    def load(self) -> int:
        """Ordinary generations this engine holds, decoding and waiting: what a new ordinary generation would
        wait behind (preemptible ones give their slots up to it)."""
        return sum(not generation.preemptible for generation in self._running.values()) + len(self._waiting)

    @property
    def spare(self) -> int:
        """Free batch slots now: how many preemptible generations it would take (0 while not loaded)."""
        if self._ready is None or self._process is None:
            return 0
        return max(0, self.max_batch - len(self._running) - len(self._waiting))

    async def promote(self, preemptible_id: str) -> bool:
        """The running preemptible generation ``preemptible_id`` becomes ordinary (``pipeline.contract``)."""
        for generation in self._running.values():
            if generation.preemptible and generation.request.preemptible_id == preemptible_id:
                generation.preemptible = False
                return True
        return False

    @property
    def state(self) -> str:
        """``loading`` (the process starts and loads the model), ``warming`` (its warm-up generations),
        ``ready`` (it takes generations), or ``stopped`` (not started, closed, or given up on)."""
        if self._ready is not None:
            return "ready"
        if self._process is not None:
            return "warming" if self._process.warming else "loading"
        restarting = self._restart_task is not None and not self._restart_task.done()
        return "loading" if restarting else "stopped"

    def health(self) -> EngineHealth:
        """Alive while its process is loaded and running; its process's restarts; turns waiting."""
        return EngineHealth(alive=self.alive, restarts=self.restarts, queue_depth=self.queue_depth)

    def describe(self) -> dict[str, Any]:
        """This engine's state for health reports (as a pool's member)."""
        described: dict[str, Any] = {
            "device": self.device or self.requested_device,
            "alive": self.alive,
            "state": self.state,
            "pid": self.pid,
            "threads": self._ready.threads if self._ready is not None else None,
            "restarts": self.restarts,
            "running": self.running,
            "preemptible": sum(generation.preemptible for generation in self._running.values()),
            "queue_depth": self.queue_depth,
            "max_batch": self.max_batch,
            "warm_up": None if self._ready is None or self._ready.warm_up is None else self._ready.warm_up.describe(),
        }
        if self.emulated_speed is not None:  # a benchmark's server says it is one
            described["emulated_speed"] = self.emulated_speed.describe()
        return described

    @property
    def pid(self) -> int | None:
        """The engine process's id while it is loaded."""
        return self._ready.pid if self._ready is not None else None

    @property
    def device(self) -> str | None:
        return self._ready.device if self._ready is not None else None

    async def start(self) -> None:
        """Spawn the engine process and wait until the model is loaded (raises ``EngineError`` if it fails)."""
        if self._closed:
            raise EngineError("the engine is closed")
        if self._process is not None:
            return
        await self._spawn()

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._run_generation(request)

    async def _run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        if self._closed:
            raise EngineError("the engine was closed")
        restarting = self._restart_task is not None and not self._restart_task.done()
        if self._process is None and not restarting:
            raise EngineError("the engine is not running", code="engine_unavailable")
        generation = _Generation(id=next(self._generation_ids), request=request, submitted=time.monotonic(),
                     preemptible=request.preemptible_id is not None)
        if generation.preemptible and self.spare == 0:
            raise EngineError("The engine has no spare capacity for a preemptible generation.", code="no_spare_capacity")
        self._waiting.append(generation)
        self._submit_next()
        finished = False
        try:
            while True:
                item = await generation.inbox.get()
                if isinstance(item, EngineError):
                    finished = True
                    raise item
                if isinstance(item, GenerationDone):
                    finished = True
                    yield item
                    return
                yield item
        finally:
            if not finished:
                self._abandon(generation)

    async def close(self) -> None:
        """Fail waiting generations, stop the engine process and its threads; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._restart_task is not None:
            self._restart_task.cancel()
            try:
                await self._restart_task
            except asyncio.CancelledError:
                pass
        closed = EngineError("the engine was closed")
        for generation in self._waiting:
            generation.inbox.put_nowait(closed)
        self._waiting.clear()
        for generation in self._running.values():
            generation.inbox.put_nowait(closed)
        self._running.clear()
        self._preempting.clear()
        process, was_ready = self._process, self._ready
        self._process = self._ready = None
        if process is not None:
            # A process still loading its model only notices the closed pipe once loaded.
            await asyncio.to_thread(process.join, _STOP_GRACE_S if was_ready else 0.0)

    async def _spawn(self) -> None:
        process = _EngineProcess(self._spec, asyncio.get_running_loop(), self._on_message, self._on_exit)
        self._process = process
        logger.info("starting the engine process for %s", self._spec.model)
        started = time.monotonic()
        try:
            await asyncio.to_thread(process.start)
            if self._process is not process:
                raise EngineError("the engine was closed while starting")
            ready = await process.ready
        except BaseException as exc:
            if self._process is process:
                self._process = None
            # Nobody awaits this process's readiness any more: its exit must not set an
            # exception there that nobody retrieves.
            process.ready.cancel()
            # After a load failure the process exits by itself; when start() is cancelled it
            # may be deep in loading weights, which it would not interrupt for a closed pipe.
            await asyncio.to_thread(process.join, _STOP_GRACE_S if isinstance(exc, EngineError) else 0.0)
            raise
        self._ready = ready
        logger.info(
            "engine process %d ready on %s (%s) after %.1f s (warm-up %s ms)",
            ready.pid,
            ready.device,
            ready.dtype,
            time.monotonic() - started,
            None if ready.warm_up is None else ready.warm_up.ms,
        )
        self._submit_next()

    def _submit_next(self) -> None:
        while self._waiting and self._ready is not None and self._process is not None:
            if len(self._running) >= self.max_batch and not self._preempt_for(self._waiting[0]):
                return
            generation = self._waiting.popleft()
            generation.started = time.monotonic()
            self._running[generation.id] = generation
            self._process.send(Submit(generation.id, generation.request))

    def _preempt_for(self, generation: _Generation) -> bool:
        """Frees a slot for ordinary ``generation`` by cancelling the newest preemptible generation; False: none."""
        if generation.preemptible:
            return False
        victim = next((running for running in reversed(self._running.values()) if running.preemptible), None)
        if victim is None or self._process is None:
            return False
        del self._running[victim.id]
        self._preempting[victim.id] = victim
        self._process.send(Cancel(victim.id))
        if not victim.abandoned:
            victim.inbox.put_nowait(EngineError("An ordinary generation needed this generation's slot.", code="preempted"))
        victim.abandoned = True
        return True

    def _abandon(self, generation: _Generation) -> None:
        if self._preempting.get(generation.id) is generation:
            return  # cancelled already
        if self._running.get(generation.id) is generation:
            generation.abandoned = True
            if self._process is not None:
                self._process.send(Cancel(generation.id))
        elif generation in self._waiting:
            self._waiting.remove(generation)

    def _on_message(self, process: _EngineProcess, message: object) -> None:
        if isinstance(message, WarmingUp):
            process.warming = True
            return
        if isinstance(message, Ready):
            if not process.ready.done():
                process.ready.set_result(message)
            return
        if isinstance(message, LoadFailed):
            if not process.ready.done():
                process.ready.set_exception(EngineError(message.message, code="engine_load_failed"))
            return
        if process is not self._process:
            logger.debug("dropping a message from a stopped engine process: %r", message)
            return
        generation_id = getattr(message, "generation_id", None)
        if isinstance(generation_id, int) and generation_id in self._preempting:
            if isinstance(message, GenerationFailed) or (
                isinstance(message, GenerationEventMessage) and isinstance(message.event, GenerationDone)
            ):
                del self._preempting[generation_id]  # stopped: its slot was handed on when it was preempted
            return
        generation = self._running.get(generation_id) if isinstance(generation_id, int) else None
        if generation is None:
            logger.error("dropping an engine message for no running generation: %r", message)
            return
        now = time.monotonic()
        if isinstance(message, GenerationFailed):
            self._finish(generation, EngineError(message.message, code=message.code))
            return
        if not isinstance(message, GenerationEventMessage):
            logger.error("dropping an unknown engine message: %r", message)
            return
        event = message.event
        if isinstance(event, TextDelta) and generation.first_text is None:
            generation.first_text = now - generation.submitted
        elif isinstance(event, AudioChunk) and generation.first_audio is None:
            generation.first_audio = now - generation.submitted
        if isinstance(event, GenerationDone):
            self._finish(generation, dataclasses.replace(event, timings=generation.timings(now)))
        elif not generation.abandoned:
            generation.inbox.put_nowait(event)

    def _finish(self, generation: _Generation, last: GenerationDone | EngineError) -> None:
        self._running.pop(generation.id, None)
        if not generation.abandoned:
            generation.inbox.put_nowait(last)
        self._submit_next()

    def _on_exit(self, process: _EngineProcess, exitcode: int | None) -> None:
        error = EngineError(f"the engine process exited with code {exitcode}", code="engine_died")
        if not process.ready.done():  # it died loading, or close() stopped it while loading
            process.ready.set_exception(error)
        if process is not self._process:
            return
        self._process, was_ready, self._ready = None, self._ready, None
        self._preempting.clear()
        for generation in list(self._running.values()):
            self._finish(generation, error)
        if self._closed or was_ready is None:
            return
        logger.error("engine process %s exited with code %s; restarting it", process.process.pid, exitcode)
        self._restart_task = asyncio.create_task(self._restart(process), name="engine-restart")

    async def _restart(self, dead: _EngineProcess) -> None:
        await asyncio.to_thread(dead.join)
        self.restarts += 1
        for attempt in range(1, _RESTART_ATTEMPTS + 1):
            try:
                await self._spawn()
                return
            except Exception as exc:
                logger.exception("restarting the engine process failed (attempt %d of %d)", attempt, _RESTART_ATTEMPTS)
                error = exc if isinstance(exc, EngineError) else EngineError(f"restarting the engine failed: {exc}")
        # Generations submitted from now on fail at once with "engine_unavailable".
        for generation in self._waiting:
            generation.inbox.put_nowait(error)
        self._waiting.clear()


class TransformersEnginePool(LeastLoadedPool[TransformersEngine]):
    """``pipeline.contract.Engine`` over one ``TransformersEngine`` per device; each generation goes to
    the least loaded one (fewest generations decoding or waiting; ties to the first).

    ``devices`` lists one device per engine process: ``["cuda:0", "cuda:1"]``, or
    ``["cpu"] * n`` for n engines on CPU. The other keyword arguments go to every engine.
    Each engine restarts its own dead process, so a crash fails only that engine's generations.
    """

    def __init__(self, model: str | Path, *, devices: list[str], **engine_options: Any) -> None:
        if not devices:
            raise ValueError("an engine pool needs at least one device")
        super().__init__(
            [TransformersEngine(model, device=device, cpu_share=len(devices), **engine_options) for device in devices]
        )

    async def start(self) -> None:
        """Start every engine at once; if one fails, stop the others and raise its error."""
        results = await asyncio.gather(*(engine.start() for engine in self.engines), return_exceptions=True)
        failure = next((result for result in results if isinstance(result, BaseException)), None)
        if failure is not None:
            await self.close()
            raise failure
