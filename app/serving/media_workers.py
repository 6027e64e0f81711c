"""The front process's media workers: spawned, placed on, watched, restarted.

``omni-rtc serve --media-workers N`` (N > 1; by default one per usable core) keeps HTTP, the
page, auth, client secrets, signaling, the session count and the engine in this (front)
process, and runs every call in one of N worker processes (``app.serving.media_worker``). A new call goes to the live worker
that holds its client's other calls (so that one process keeps the client's share of the engine,
``app.realtime.shares.ClientShares``), else to the one with the fewest calls; its offer travels over IPC and the worker's SDP answer comes back, so the
peer's media then flows to that worker's own UDP sockets. A worker reports every 0.5 s (its
heartbeat); one silent for ``HEARTBEAT_TIMEOUT_S`` (stopped, or its loop stuck) gets no new
calls, shows ``ready: false`` in /healthz, and an offer it was given goes to the next worker.
The front remembers which worker holds each call (hang-up goes there) and serves the workers' engine turns from the one engine.
Each call placed on a worker is a :class:`RemoteCall` in the front's ``CallRegistry``, so
``--max-sessions`` counts it with the front's WebSocket sessions. A worker that dies loses its
calls (they leave the registry at once), is spawned again, and gets new calls once it reports. docs/ARCHITECTURE.md says why it is built this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from app.calls.registry import Admission, CallRegistry, OnClosed
from app.config import Settings
from app.metrics import FamilySamples
from app.realtime.session_config import SessionConfig
from app.serving.ipc import MessageTooLarge, post, receive
from app.serving.media_worker import STOP_SIGNALS, run_media_worker
from app.serving.worker_messages import (
    AskResources,
    AskTurns,
    CallClosed,
    CallConnected,
    CancelGeneration,
    FrontRequest,
    GenerationEnd,
    GenerationError,
    GenerationEventMessage,
    GenerationPromoted,
    HangUp,
    Hello,
    HungUp,
    Message,
    Offer,
    OfferAnswered,
    OfferFailed,
    OfferRefused,
    PromoteGeneration,
    Reply,
    ResourcesReport,
    Shutdown,
    StartGeneration,
    Status,
    ToWorker,
    TurnsReport,
)
from app.tracing import TracingEnvironment
from app.transports.webrtc.peer_call import OfferError
from pipeline.contract import Engine, EngineError, GenerationRequest

logger = logging.getLogger(__name__)

# A worker loads the VAD and the end-of-turn model (its modules are imported once, in the
# forkserver): ~0.3 s on this 2-core machine; the first start also imports them, ~1 s, and more
# on a loaded core.
WORKER_START_TIMEOUT_S = 60.0
# Answering an offer gathers loopback/host candidates: well under a second; a worker that takes
# this long is stuck, and the client gets a 503 rather than waiting forever.
OFFER_TIMEOUT_S = 30.0
# A worker measures its resources (or lists its turn timelines) in well under a millisecond; one
# silent this long is stuck (or stopped), and /debug/resources reports it not alive (/debug/turns
# leaves its sessions out) rather than hang.
RESOURCES_TIMEOUT_S = 5.0
# Asked to shut down, a worker closes its calls (each a few ms); past this it is killed.
WORKER_STOP_TIMEOUT_S = 10.0
# How often the front checks that every worker process still runs (a dead one is spawned again)
# and still answers.
SUPERVISE_INTERVAL_S = 0.5
# A worker reports every 0.5 s (app.serving.media_worker.STATUS_INTERVAL_S); four reports missed is
# not a busy loop (a VAD window costs well under a millisecond, a stalled frame tens of ms) but
# a stopped or stuck process: it gets no new calls, and offers waiting on it go elsewhere.
HEARTBEAT_TIMEOUT_S = 2.0
# A worker silent this long is killed and spawned again, its calls ended ("worker_unresponsive"):
# its calls have heard nothing for as long (a real-time call is lost after a second or two), and
# a loop stuck this long would otherwise hold their peers and session slots until ICE consent
# ran out. Ten heartbeats: no pause of a working loop comes near it.
WORKER_STUCK_TIMEOUT_S = 5.0
# A worker that died before it ever reported (a crash at start-up) is spawned again only after
# this long, so that a worker that cannot start does not spin.
START_RETRY_DELAY_S = 5.0


class WorkerUnavailable(Exception):
    """No live worker to place the call on, or the worker died while answering."""


@dataclass
class WorkerHandle:
    """What the front knows of one worker process."""

    index: int
    process: BaseProcess
    pid: int | None = None
    writer: asyncio.StreamWriter | None = None
    ready: bool = False  # reported once: its VAD is loaded
    last_heard: float = 0.0  # monotonic time of its last message
    silent: bool = False  # nothing heard for HEARTBEAT_TIMEOUT_S: takes no new calls
    killed_stuck: bool = False  # killed for being silent WORKER_STUCK_TIMEOUT_S; cleared when spawned again
    calls: set[str] = field(default_factory=set)
    reserved: int = 0  # offers sent, not yet answered
    reported_sessions: int = 0
    pacing: dict[str, Any] | None = None
    metrics: list[FamilySamples] = field(default_factory=list)
    pending: dict[int, asyncio.Future[Reply]] = field(default_factory=dict)
    turns: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    promotions: set[asyncio.Task[None]] = field(default_factory=set)  # PromoteGeneration being answered
    restarts: int = 0
    spawned_at: float = 0.0  # monotonic

    @property
    def load(self) -> int:
        return len(self.calls) + self.reserved

    @property
    def takes_calls(self) -> bool:
        return self.ready and not self.silent

    def send(self, message: ToWorker) -> None:
        if self.writer is None:
            raise WorkerUnavailable(f"media worker {self.index} is not connected")
        post(self.writer, message)


class RemoteCall:
    """A call that lives in a media worker, as the front's ``CallRegistry`` holds it."""

    transport = "webrtc"

    def __init__(self, call_id: str, pool: MediaWorkerPool, on_closed: OnClosed) -> None:
        self.id = call_id
        self._pool = pool
        self._on_closed: OnClosed | None = on_closed

    async def close(self, reason: str = "closed") -> None:
        """Ends the call in its worker (which then reports it closed). Safe twice."""
        with contextlib.suppress(WorkerUnavailable):
            await self._pool.hang_up(self.id)

    def released(self, reason: str) -> None:
        """The call is over (its worker said so, or died): it leaves the registry, once."""
        on_closed, self._on_closed = self._on_closed, None
        if on_closed is not None:
            on_closed(self, reason)


class MediaWorkerPool:
    """N media worker processes; each call placed on one is a :class:`RemoteCall` in ``calls``."""

    def __init__(
        self, settings: Settings, count: int, engine: Engine, calls: CallRegistry, *,
        tracing: TracingEnvironment | None = None,
    ) -> None:
        """``tracing``: the front's OpenTelemetry variables, each worker's too (None: no traces)."""
        self._settings = settings
        self._tracing = tracing
        self._engine = engine
        self._calls = calls
        # forkserver: each worker is forked from a clean single-threaded server process that has
        # imported the worker's modules once (~0.4 s of imports saved per worker start and
        # restart); never a fork of this process, which has threads and a running loop.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["app.serving.media_worker"])
        self._workers = [WorkerHandle(index, process=self._context.Process()) for index in range(count)]
        self._call_worker: dict[str, WorkerHandle] = {}
        self._offered_to: dict[str, WorkerHandle] = {}  # call id -> the worker its offer waits on
        self._remote: dict[str, RemoteCall] = {}  # offered or answered, until released
        self._call_client: dict[str, str] = {}  # call id -> its client key (Admission.client_key), until released
        self._requests = 0
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False
        self._ready = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def socket_path(self) -> str:
        assert self._directory is not None
        return str(Path(self._directory.name) / "workers.sock")

    async def start(self) -> None:
        self._directory = tempfile.TemporaryDirectory(prefix="omni-rtc-")  # mode 0700: this user only
        self._server = await asyncio.start_unix_server(self.serve_connection, path=self.socket_path)
        for worker in self._workers:
            self._spawn(worker)
        self._supervisor = asyncio.create_task(self._supervise(), name="media worker supervisor")
        async with asyncio.timeout(WORKER_START_TIMEOUT_S):
            while not all(worker.ready for worker in self._workers):
                self._ready.clear()
                await self._ready.wait()
        logger.info("%d media workers ready: pids %s", len(self._workers), [w.pid for w in self._workers])

    async def close(self) -> None:
        """Stops every worker (their calls end) and the IPC server. Safe twice."""
        if self._closing:
            return
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for worker in self._workers:
            if worker.writer is not None:
                worker.send(Shutdown())
        await asyncio.gather(*(asyncio.to_thread(self._stop, worker) for worker in self._workers))
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._directory is not None:
            self._directory.cleanup()

    # -- calls -----------------------------------------------------------------------------

    async def place_call(
        self, call_id: str, sdp: str, config: SessionConfig, *, admission: Admission | None = None
    ) -> str:
        """The SDP answer of the worker that holds the client's other calls, else of the least
        loaded worker that answers; raises CapacityError (--max-sessions), ClientLimitError or
        ConnectingLimitError (the client's bounds), OfferError or WorkerUnavailable (no worker answered)."""
        if not any(worker.takes_calls for worker in self._workers):
            raise WorkerUnavailable("no media worker is answering")
        remote = self._calls.admit(lambda on_closed: RemoteCall(call_id, self, on_closed), admission=admission)
        self._remote[call_id] = remote
        client = admission.client_key if admission is not None else None
        if client is not None:
            self._call_client[call_id] = client
        tried: set[int] = set()
        try:
            while candidates := [w for w in self._workers if w.takes_calls and w.index not in tried]:
                worker = self._placement(candidates, client)
                tried.add(worker.index)
                try:
                    reply = await self._offer(worker, call_id, sdp, config, client)
                except WorkerUnavailable as exc:  # stopped, stuck or died while answering: the next one
                    logger.warning("call %s: %s; placing it on another worker", call_id, exc)
                    continue
                match reply:
                    case OfferRefused(error=error):
                        raise OfferError(error)
                    case OfferAnswered(sdp=answer):
                        return answer  # the call joined its worker when the answer arrived (_handle)
                    case _:
                        logger.warning("call %s: media worker %d could not answer the offer", call_id, worker.index)
            raise WorkerUnavailable(f"no media worker answered (tried {len(tried)})")
        except BaseException as exc:
            self._release(call_id, "bad_offer" if isinstance(exc, OfferError) else "signaling_failed")
            raise

    def _placement(self, candidates: list[WorkerHandle], client: str | None) -> WorkerHandle:
        """Of the workers that take calls: the one holding (or being offered) the most of the
        client's calls, so that one process keeps its share of the engine; else the least loaded."""
        held: dict[int, int] = {}
        if client is not None:
            for call_id, key in self._call_client.items():
                worker = self._call_worker.get(call_id) or self._offered_to.get(call_id)
                if key == client and worker is not None:
                    held[worker.index] = held.get(worker.index, 0) + 1
        return min(candidates, key=lambda w: (-held.get(w.index, 0), w.load, w.index))

    async def _offer(
        self, worker: WorkerHandle, call_id: str, sdp: str, config: SessionConfig, client: str | None
    ) -> Reply:
        worker.reserved += 1
        self._offered_to[call_id] = worker
        try:
            return await self._ask(
                worker, lambda request: Offer(request=request, call_id=call_id, sdp=sdp, config=config, client=client)
            )
        finally:
            worker.reserved -= 1
            self._offered_to.pop(call_id, None)

    async def hang_up(self, call_id: str) -> bool:
        """Ends the call in its worker; False when no worker holds it."""
        worker = self._call_worker.get(call_id)
        if worker is None:
            return False
        reply = await self._ask(worker, lambda request: HangUp(request=request, call_id=call_id))
        return isinstance(reply, HungUp) and reply.found

    def worker_of(self, call_id: str) -> int | None:
        worker = self._call_worker.get(call_id)
        return None if worker is None else worker.index

    # -- health and metrics ------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "worker": str(worker.index),
                "pid": worker.pid,
                "alive": worker.ready and worker.process.is_alive(),
                "ready": worker.takes_calls,  # answers its heartbeat: new calls go here
                "sessions": len(worker.calls),
                "restarts": worker.restarts,
                "overloaded": bool(worker.pacing and worker.pacing["overloaded"]),
                "late_frames": worker.pacing["late_frames"] if worker.pacing else 0,
                "skipped_frames": worker.pacing["skipped_frames"] if worker.pacing else 0,
            }
            for worker in self._workers
        ]

    async def resources(self) -> list[dict[str, Any]]:
        """Each worker's ``process_resources()``, asked over IPC; a worker not running says only that."""

        async def one(worker: WorkerHandle) -> dict[str, Any]:
            entry: dict[str, Any] = {"worker": str(worker.index), "pid": worker.pid, "alive": False}
            if not worker.takes_calls:  # not running, or not answering
                return entry
            try:
                reply = await self._ask(worker, AskResources, timeout_s=RESOURCES_TIMEOUT_S)
            except WorkerUnavailable:
                return entry
            if not isinstance(reply, ResourcesReport):
                raise TypeError(f"media worker {worker.index} replied to AskResources with a {type(reply).__name__}")
            return {**entry, "alive": True, **reply.resources}

        return list(await asyncio.gather(*(one(worker) for worker in self._workers)))

    async def turns(self) -> list[dict[str, Any]]:
        """Every running worker's recent sessions' timelines (``app.turn_timelines``), asked over
        IPC, each session with its ``worker``; a worker not running or not answering adds none."""

        async def one(worker: WorkerHandle) -> list[dict[str, Any]]:
            if not worker.takes_calls:
                return []
            try:
                reply = await self._ask(worker, AskTurns, timeout_s=RESOURCES_TIMEOUT_S)
            except WorkerUnavailable:
                return []
            if not isinstance(reply, TurnsReport):
                raise TypeError(f"media worker {worker.index} replied to AskTurns with a {type(reply).__name__}")
            return [{**session, "worker": str(worker.index)} for session in reply.sessions]

        return [session for sessions in await asyncio.gather(*(one(w) for w in self._workers)) for session in sessions]

    def metric_samples(self) -> list[list[FamilySamples]]:
        return [worker.metrics for worker in self._workers if worker.ready and worker.metrics]

    # -- processes and their connections ------------------------------------------------------

    def _spawn(self, worker: WorkerHandle) -> None:
        worker.process = self._context.Process(
            target=run_media_worker,
            args=(worker.index, self.socket_path, self._settings, self._engine.name, self._engine.capabilities,
                  self._tracing),
            name=f"omni-rtc media worker {worker.index}",
            # Stopped by the front at its exit; a front killed outright closes the IPC socket,
            # and a worker whose connection ends closes its calls and exits.
            daemon=True,
        )
        with stop_signals_held():
            worker.process.start()
        worker.pid = worker.process.pid
        worker.spawned_at = time.monotonic()
        worker.killed_stuck = False

    def _stop(self, worker: WorkerHandle) -> None:
        """Blocking: waits for the process to exit, then kills it (in a thread)."""
        process = worker.process
        if process.pid is None:
            return
        process.join(WORKER_STOP_TIMEOUT_S)
        if process.is_alive():
            logger.warning("media worker %d (pid %s) did not stop; killing it", worker.index, process.pid)
            process.kill()
            process.join()
        elif process.exitcode != 0:
            # 255 is also what multiprocessing reports when the forkserver died before the worker.
            logger.warning("media worker %d (pid %s) exited with code %s", worker.index, process.pid, process.exitcode)

    def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A worker connected to the pool's socket (``start`` listens for them): served, in a task
        the pool holds, until the connection ends."""
        task = asyncio.create_task(self._serve_worker(reader, writer), name="media worker connection")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve_worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await receive(reader)
        if not isinstance(hello, Hello) or not 0 <= hello.worker < len(self._workers):
            logger.error("a process connected to the media worker socket without a valid hello: %r", hello)
            writer.close()
            return
        worker = self._workers[hello.worker]
        worker.writer, worker.pid = writer, hello.pid
        worker.last_heard, worker.silent = time.monotonic(), False
        try:
            while (message := await receive(reader)) is not None:
                worker.last_heard = time.monotonic()
                if worker.silent:
                    worker.silent = False
                    logger.warning("media worker %d (pid %s) answers again; it takes calls", worker.index, worker.pid)
                self._handle(worker, message)
        except ValueError as exc:  # senders check sizes (app.serving.ipc): this worker is broken
            logger.error("media worker %d broke the IPC protocol (%s); dropping its connection", worker.index, exc)
        finally:
            await self._lost(worker, writer)

    def _handle(self, worker: WorkerHandle, message: Message) -> None:
        match message:
            case Status():
                worker.reported_sessions = message.sessions
                worker.pacing, worker.metrics = message.pacing, message.metrics
                if not worker.ready:  # the first report: the VAD is loaded, calls can come
                    worker.ready = True
                    self._ready.set()
            case OfferAnswered():
                future = worker.pending.pop(message.request, None)
                if future is None:  # answered after the client was given up on: end the call
                    worker.send(HangUp(request=0, call_id=message.call_id))
                    return
                # Registered here, before any later message of this worker is read: its
                # CallClosed may be next in the stream, and must find the call.
                worker.calls.add(message.call_id)
                self._call_worker[message.call_id] = worker
                self._settle(future, message)
            case OfferRefused() | OfferFailed() | HungUp() | ResourcesReport() | TurnsReport():
                self._settle(worker.pending.pop(message.request, None), message)
            case CallConnected():
                if message.call_id in worker.calls:
                    self._calls.connected(message.call_id)
            case CallClosed():
                self._forget_call(worker, message.call_id, message.reason)
            case StartGeneration():
                turn = message.generation
                task = asyncio.create_task(self._serve_turn(worker, turn, message.request), name=f"turn {turn}")
                worker.turns[turn] = task
                task.add_done_callback(lambda _: worker.turns.pop(turn, None))
            case CancelGeneration():
                turn_task = worker.turns.get(message.generation)
                if turn_task is not None:
                    turn_task.cancel()
            case PromoteGeneration():
                promotion = asyncio.create_task(self._promote(worker, message), name=f"promote {message.promotion}")
                worker.promotions.add(promotion)
                promotion.add_done_callback(worker.promotions.discard)
            case _:
                # A Hello after the first, or a message only the front sends.
                logger.error("media worker %d sent a %s out of place", worker.index, type(message).__name__)

    @staticmethod
    def _settle(future: asyncio.Future[Reply] | None, reply: Reply) -> None:
        """The reply to whoever still waits for it (a request given up on waits no more)."""
        if future is not None and not future.done():
            future.set_result(reply)

    async def _ask(
        self, worker: WorkerHandle, ask: Callable[[int], FrontRequest], timeout_s: float = OFFER_TIMEOUT_S
    ) -> Reply:
        """Sends ``ask(request)``, a request numbered for its reply, and waits for that reply."""
        if worker.silent:
            raise WorkerUnavailable(f"media worker {worker.index} is not answering")
        self._requests += 1
        request = self._requests
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        worker.pending[request] = future
        try:
            worker.send(ask(request))
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise WorkerUnavailable(f"media worker {worker.index} did not answer in {timeout_s:g} s") from None
        finally:
            worker.pending.pop(request, None)

    async def _serve_turn(self, worker: WorkerHandle, turn: int, request: GenerationRequest) -> None:
        error: GenerationError | None = None
        try:
            async with contextlib.aclosing(self._engine.run_generation(request)) as events:
                async for event in events:
                    worker.send(GenerationEventMessage(generation=turn, event=event))
        except EngineError as exc:
            error = GenerationError(code=exc.code, message=str(exc))
        except WorkerUnavailable:
            return  # the worker is gone: nobody to tell
        except MessageTooLarge as exc:  # one event too large to send: this turn fails, nothing else
            logger.error("media worker %d: turn %d failed: %s", worker.index, turn, exc)
            error = GenerationError(code="turn_event_too_large", message="A turn event was too large to send.")
        except Exception as exc:
            logger.exception("media worker %d: a turn failed in the front", worker.index)
            error = GenerationError(code="engine_error", message=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(WorkerUnavailable):
            worker.send(GenerationEnd(generation=turn, error=error))

    async def _promote(self, worker: WorkerHandle, message: PromoteGeneration) -> None:
        """A worker's session uses its speculative turn: made ordinary in the engine (``Engine.promote``)."""
        promoted = await self._engine.promote(message.preemptible_id)
        with contextlib.suppress(WorkerUnavailable):
            worker.send(GenerationPromoted(promotion=message.promotion, promoted=promoted))

    def _forget_call(self, worker: WorkerHandle, call_id: str, reason: str) -> None:
        if call_id in worker.calls:
            worker.calls.discard(call_id)
            self._call_worker.pop(call_id, None)
            self._release(call_id, reason)

    def _release(self, call_id: str, reason: str) -> None:
        self._call_client.pop(call_id, None)
        remote = self._remote.pop(call_id, None)
        if remote is not None:
            remote.released(reason)

    def _mark_silent(self) -> None:
        """Workers not heard from for ``HEARTBEAT_TIMEOUT_S`` take no new calls, and the offers and
        questions waiting on them fail now (an offer then goes to the next worker)."""
        now = time.monotonic()
        for worker in self._workers:
            if worker.silent and not worker.killed_stuck and now - worker.last_heard >= WORKER_STUCK_TIMEOUT_S:
                self._kill_stuck(worker, now - worker.last_heard)
            if not worker.ready or worker.silent or now - worker.last_heard < HEARTBEAT_TIMEOUT_S:
                continue
            worker.silent = True
            logger.warning(
                "media worker %d (pid %s) has not answered for %.1f s: it gets no new calls until it does",
                worker.index, worker.pid, now - worker.last_heard,
            )
            for future in worker.pending.values():
                if not future.done():
                    future.set_exception(WorkerUnavailable(f"media worker {worker.index} stopped answering"))

    def _kill_stuck(self, worker: WorkerHandle, silent_s: float) -> None:
        """A worker whose loop has not answered for ``WORKER_STUCK_TIMEOUT_S``: killed; its
        connection's end then ends its calls and the supervisor spawns it again."""
        worker.killed_stuck = True
        logger.error("media worker %d (pid %s) has not answered for %.1f s: killed, its %d calls ended",
                     worker.index, worker.pid, silent_s, len(worker.calls))
        if worker.process.pid is not None and worker.process.is_alive():
            worker.process.kill()

    async def _lost(self, worker: WorkerHandle, writer: asyncio.StreamWriter) -> None:
        """The worker's connection ended: it exited or died. Its calls are gone; the supervisor spawns it again."""
        was_ready, lost_calls = worker.ready, len(worker.calls)
        worker.ready, worker.silent, worker.writer, worker.pacing, worker.metrics = False, False, None, None, []
        for call_id in list(worker.calls):
            reason = "server_shutdown" if self._closing else "worker_unresponsive" if worker.killed_stuck else "worker_died"
            self._forget_call(worker, call_id, reason)
        for future in worker.pending.values():
            if not future.done():
                future.set_exception(WorkerUnavailable(f"media worker {worker.index} ended"))
        worker.pending.clear()
        for task in [*worker.turns.values(), *worker.promotions]:
            task.cancel()
        await asyncio.gather(*worker.turns.values(), *worker.promotions, return_exceptions=True)
        writer.close()
        if not self._closing:
            logger.error(
                "media worker %d (pid %s) ended unexpectedly (%s); %d calls lost; it will be started again",
                worker.index, worker.pid, "was serving" if was_ready else "during start-up", lost_calls,
            )

    async def _supervise(self) -> None:
        """Spawns again every worker whose process has exited (its connection, if any, cleaned up),
        and marks silent every worker whose heartbeat stopped."""
        while True:
            asleep_at = time.monotonic()
            await asyncio.sleep(SUPERVISE_INTERVAL_S)
            # This loop itself stalled: the workers' reports may be waiting unread, so judge no one.
            if time.monotonic() - asleep_at < 2 * SUPERVISE_INTERVAL_S:
                self._mark_silent()
            for worker in self._workers:
                if worker.writer is not None or worker.process.is_alive():
                    continue  # running, or its connection is still being cleaned up
                if not worker.ready and time.monotonic() - worker.spawned_at < START_RETRY_DELAY_S:
                    continue
                worker.restarts += 1
                self._spawn(worker)
                logger.info("media worker %d started again as pid %s", worker.index, worker.pid)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Holds the group's stop signals in this thread while it starts a worker, and so the
    forkserver that the first start launches (it keeps the mask it was started with).

    The forkserver ignores SIGINT but not SIGTERM: killed by the group's SIGTERM, it took with
    it the exit status of every worker still shutting down, so the front read them as gone
    (multiprocessing's exit code 255) and stopped the engine while they were still closing their
    calls. Held, the signal stays pending in the forkserver until it exits with the front; one
    that reaches the front meanwhile is delivered when the mask is lifted, or to another thread."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
