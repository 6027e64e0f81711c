"""A media worker process: the calls placed on it, whole (peer, data channel, session, VAD, track).

The front process (``app.serving.media_workers``) spawns it and hands it offers over IPC (``app.serving.ipc``);
the worker answers with the SDP and from then on the call lives here: aiortc's peer and its
UDP sockets, the session, the VAD and the paced outbound track all run on this process's own
event loop and GIL, so a busy worker never delays another's audio. The engine stays in the
front process: sessions here get an :class:`EngineProxy` that streams each turn over the
same connection. The worker reports its calls' ends, its session count, its pacing and its
metrics; when the front goes away the worker closes its calls and exits.

The messages both ways are ``app.serving.worker_messages``'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import signal
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from app.calls.registry import CallRegistry, OpenSession
from app.config import Settings, dev_replies_file, load_dev_replies
from app.metrics import Metrics
from app.realtime.shares import ClientShares
from app.recording import Recordings
from app.resources import process_resources
from app.serving.call_factory import load_end_of_turn_model, new_call, session_factory
from app.serving.engines import for_session
from app.serving.ipc import MessageTooLarge, post, receive
from app.serving.worker_messages import (
    AskResources,
    AskTurns,
    CallClosed,
    CallConnected,
    CancelGeneration,
    GenerationEnd,
    GenerationEventMessage,
    GenerationPromoted,
    HangUp,
    Hello,
    HungUp,
    Offer,
    OfferAnswered,
    OfferFailed,
    OfferRefused,
    PromoteGeneration,
    ResourcesReport,
    Shutdown,
    StartGeneration,
    Status,
    ToFront,
    TurnsReport,
)
from app.tracing import Tracing, TracingEnvironment
from app.transports.webrtc.peer_call import Call, OfferError
from app.turn_timelines import TurnTimelines
from media.end_of_turn_model import EndOfTurnModel
from media.vad import SileroVad
from pipeline.contract import EngineCapabilities, EngineError, EngineHealth, GenerationEvent, GenerationRequest

logger = logging.getLogger(__name__)

# How often a worker reports its sessions, pacing and metrics: /healthz and /metrics in the
# front are at most this old.
STATUS_INTERVAL_S = 0.5
# The front enforces --max-sessions across workers; a worker admits whatever it is given.
_UNLIMITED = 1_000_000
TURN_TOO_LARGE_MESSAGE = "The conversation is too large to send to the engine."
# Ctrl-C in a terminal, and a service manager's stop (systemd's default KillMode=control-group,
# GNU timeout): both reach every process of the group, not only the front.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class EngineProxy:
    """The front process's engine, as sessions in a worker get it: each turn streamed over IPC.

    Closing a turn's iterator before it ended cancels the turn in the front (``CancelGeneration``).
    An ``EngineError`` in the front is raised here with its code (``preempted`` and
    ``no_spare_capacity`` included). ``promote`` asks the front's engine and waits for its answer.
    ``name`` and ``capabilities`` are the front's engine's, given when the worker was spawned.
    """

    def __init__(self, name: str, capabilities: EngineCapabilities, send: Callable[[ToFront], None]) -> None:
        self.name = name
        self.capabilities = capabilities
        self._send = send
        self._turns: dict[int, asyncio.Queue[GenerationEventMessage | GenerationEnd]] = {}
        self._ids = itertools.count(1)
        self._promotions: dict[int, asyncio.Future[bool]] = {}

    async def start(self) -> None:
        """The engine is the front process's."""

    async def close(self) -> None:
        """The engine is the front process's."""

    def health(self) -> EngineHealth:
        """Alive: the engine's own health is the front's to report (``/healthz``); a worker asks
        nothing of it, and serves its calls while its connection to the front stands."""
        return EngineHealth(alive=True)

    async def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        turn = next(self._ids)
        queue: asyncio.Queue[GenerationEventMessage | GenerationEnd] = asyncio.Queue()
        self._turns[turn] = queue
        ended = False
        try:
            try:
                self._send(StartGeneration(generation=turn, request=request))
            except MessageTooLarge as exc:
                ended = True  # never reached the front: nothing to cancel there
                logger.error("turn %d not sent to the engine: %s", turn, exc)
                raise EngineError(TURN_TOO_LARGE_MESSAGE, code="turn_too_large") from None
            while True:
                message = await queue.get()
                if isinstance(message, GenerationEventMessage):
                    yield message.event
                    continue
                ended = True
                if message.error is not None:
                    raise EngineError(message.error.message, code=message.error.code)
                return
        finally:
            del self._turns[turn]
            if not ended:
                self._send(CancelGeneration(generation=turn))

    def deliver(self, message: GenerationEventMessage | GenerationEnd) -> None:
        """A turn's event or end from the front; a cancelled turn's late events are dropped."""
        queue = self._turns.get(message.generation)
        if queue is not None:
            queue.put_nowait(message)

    async def promote(self, preemptible_id: str) -> bool:
        promotion = next(self._ids)
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._promotions[promotion] = answer
        try:
            self._send(PromoteGeneration(promotion=promotion, preemptible_id=preemptible_id))
            return await answer
        finally:
            del self._promotions[promotion]

    def promoted(self, message: GenerationPromoted) -> None:
        """The front's answer to a ``PromoteGeneration``; one nobody waits for any more is dropped."""
        answer = self._promotions.get(message.promotion)
        if answer is not None and not answer.done():
            answer.set_result(message.promoted)


class MediaWorker:
    """One worker's loop: the connection to the front, its calls, its status reports."""

    def __init__(
        self, index: int, settings: Settings, engine_name: str, capabilities: EngineCapabilities,
        tracing: TracingEnvironment | None = None,
    ) -> None:
        self.index = index
        self._tracing_environment = tracing
        self._settings = settings
        self._engine_name = engine_name
        self._capabilities = capabilities
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._dev_replies: tuple[str, ...] = ()
        self._timelines = TurnTimelines()  # this worker's recent sessions, for the front's /debug/turns
        # The engine share and the event rate of each client of this worker's calls.
        self._client_shares = ClientShares(settings.engine_share_size.for_client(), settings.event_rate.for_client())

    async def serve(self, socket_path: str) -> None:
        reader, writer = await asyncio.open_unix_connection(socket_path)
        self._writer = writer
        self._send(Hello(worker=self.index, pid=os.getpid()))
        vad = await asyncio.to_thread(SileroVad.load)
        end_of_turn = await asyncio.to_thread(load_end_of_turn_model, self._settings)
        self._dev_replies = await asyncio.to_thread(load_dev_replies, dev_replies_file(self._settings))
        metrics = Metrics(worker=str(self.index))
        tracing = Tracing.start(self._tracing_environment, process=f"media-worker-{self.index}")
        recordings = Recordings.of(self._settings)
        engine = EngineProxy(self._engine_name, self._capabilities, self._send)
        # The front counts every worker's sessions and their ends (omni_rtc_sessions_open,
        # omni_rtc_calls): this registry only tells it when a call ends.
        calls = CallRegistry(_UNLIMITED, on_closed=self._closed)
        reporter = asyncio.create_task(self._report(calls, metrics), name="worker status")
        try:
            while (message := await receive(reader)) is not None:
                match message:
                    case GenerationEventMessage() | GenerationEnd():
                        engine.deliver(message)
                    case GenerationPromoted():
                        engine.promoted(message)
                    case Offer():
                        answer = self._answer(message, calls, engine, vad, end_of_turn, metrics, tracing, recordings)
                        self._start(answer, f"offer {message.call_id}")
                    case HangUp():
                        self._start(self._hang_up(message, calls), f"hangup {message.call_id}")
                    case AskResources():  # psutil reads /proc: well under a millisecond
                        self._send(ResourcesReport(request=message.request, resources=process_resources()))
                    case AskTurns():  # at most RECENT_SESSIONS sessions of MAX_TURNS turns each
                        self._send(TurnsReport(request=message.request, sessions=self._timelines.to_json()))
                    case Shutdown():
                        break
                    case _:
                        logger.error("media worker %d: a %s from the front, which it never sends",
                                     self.index, type(message).__name__)
        finally:
            reporter.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(reporter, *self._tasks, return_exceptions=True)
            await calls.close_all()
            if tracing is not None:  # its sessions' spans, sent before the process goes
                await asyncio.to_thread(tracing.shutdown)
            if recordings is not None:  # its sessions' recordings, written whole
                await asyncio.to_thread(recordings.close)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _send(self, message: ToFront) -> None:
        assert self._writer is not None
        post(self._writer, message)

    def _start(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("media worker %d: %s failed", self.index, task.get_name(), exc_info=task.exception())

    def _connected(self, call: Call) -> None:
        self._send(CallConnected(call_id=call.id))

    def _closed(self, call: OpenSession, reason: str) -> None:
        self._send(CallClosed(call_id=call.id, reason=reason))

    async def _answer(
        self,
        message: Offer,
        calls: CallRegistry,
        engine: EngineProxy,
        vad: SileroVad,
        end_of_turn: EndOfTurnModel | None,
        metrics: Metrics,
        tracing: Tracing | None,
        recordings: Recordings | None,
    ) -> None:
        make_session = session_factory(
            self._settings, metrics, message.config, session_engine=lambda: for_session(engine, self._dev_replies),
            shared_engine=engine, vad=vad, end_of_turn=end_of_turn, tracing=tracing, recordings=recordings,
            transport=Call.transport, timelines=self._timelines, client_shares=self._client_shares,
            client=message.client,
        )

        call = calls.admit(
            lambda on_closed: new_call(
                self._settings, make_session, metrics, on_closed, on_connected=self._connected, call_id=message.call_id
            )
        )
        try:
            sdp = await call.answer(message.sdp)
        except OfferError as exc:
            await call.close("bad_offer")
            logger.info("call %s: offer refused: %s (%s)", call.id, exc, exc.__cause__)
            self._send(OfferRefused(request=message.request, call_id=call.id, error=str(exc)))
            return
        except BaseException:
            await call.close("signaling_failed")
            self._send(OfferFailed(request=message.request, call_id=call.id))
            raise
        self._send(OfferAnswered(request=message.request, call_id=call.id, sdp=sdp))

    async def _hang_up(self, message: HangUp, calls: CallRegistry) -> None:
        call = calls.get(message.call_id)
        if call is not None:
            await call.close("hangup")
        self._send(HungUp(request=message.request, found=call is not None))

    async def _report(self, calls: CallRegistry, metrics: Metrics) -> None:
        """The worker's heartbeat: the front counts a worker silent for 2 s as not answering."""
        while True:
            status = Status(sessions=len(calls), pacing=metrics.pacing.snapshot(), metrics=metrics.samples())
            try:
                self._send(status)
            except MessageTooLarge as exc:  # the metrics outgrew a message: report without them
                logger.error("media worker %d: %s; reporting without metrics", self.index, exc)
                self._send(dataclasses.replace(status, metrics=[]))
            await asyncio.sleep(STATUS_INTERVAL_S)


def run_media_worker(
    index: int, socket_path: str, settings: Settings, engine_name: str, capabilities: EngineCapabilities,
    tracing: TracingEnvironment | None = None,
) -> None:
    """The worker process's entry point (``multiprocessing`` spawns it); ``tracing``: the front's
    OpenTelemetry variables, made this process's own before anything reads them."""
    if tracing is not None:
        tracing.apply_to(os.environ)
    # Ctrl-C (SIGINT) and a service manager's stop (SIGTERM to the whole control group: systemd's
    # default KillMode) reach the workers too. Dying of them, a worker dropped its calls unclosed and
    # the front, not yet told to stop, logged it as a crash and began a restart. The front stops its
    # workers after closing their calls; a worker whose front is gone sees its connection end.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    # Forked from a forkserver started with them held (media_workers.stop_signals_held): ignored
    # now, so they are let through again for whatever this process starts.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    logging.basicConfig(
        level=settings.log_level.upper(), format=f"%(asctime)s %(levelname)s worker-{index} %(name)s: %(message)s"
    )
    asyncio.run(MediaWorker(index, settings, engine_name, capabilities, tracing).serve(socket_path))
