"""The server process's watchdog: a thread that ends the process when its event loop stops answering.

A task on the loop stamps the time every ``HEARTBEAT_S``; a thread looks at the stamp as often.
Once the next stamp is ``stuck_after_s`` overdue (``--loop-watchdog``) the loop is stuck (a call that
blocks it for good, a deadlock) and the thread calls ``on_stuck`` once. The server's is
:func:`end_stuck_process`: it logs where every thread is (``faulthandler``) and ends the process
with status 70 (EX_SOFTWARE) at once, so that its supervisor (systemd's ``Restart=on-failure``, a
container's restart policy) starts it afresh. Its media workers see their IPC end and exit, their
calls ending; the engine process sees its pipe close and exits. Without it a front stuck for good
holds every visitor's session and slot until each gives up, and the port stays taken.
The media workers have theirs in the front (``app.serving.media_workers``: a worker silent for 5 s
is killed and spawned again).
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
STUCK_EXIT_STATUS = 70  # EX_SOFTWARE (sysexits.h): an internal error; systemd's on-failure restarts it


def end_stuck_process(silent_s: float) -> None:
    """Logs the stuck loop and every thread's stack, then ends the process with ``STUCK_EXIT_STATUS``."""
    logger.critical("the event loop has not answered for %.1f s: ending the process (status %d) for its "
                    "supervisor to restart; every thread's stack follows on stderr", silent_s, STUCK_EXIT_STATUS)
    for handler in logging.getLogger().handlers:
        handler.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    # Not sys.exit: the stuck loop would have to run the shutdown, which is what cannot happen.
    os._exit(STUCK_EXIT_STATUS)


class LoopWatchdog:
    """Watches the running loop from a thread; ``start`` on the loop, ``close`` (safe twice) to stop."""

    def __init__(self, stuck_after_s: float, *, on_stuck: Callable[[float], None] = end_stuck_process,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``on_stuck(silent_s)`` runs in the watchdog's thread, once, when the loop's next stamp is
        ``stuck_after_s`` overdue."""
        self.stuck_after_s = stuck_after_s
        self._on_stuck = on_stuck
        self._clock = clock
        self._beat = clock()
        self._stopped = threading.Event()
        self._heartbeat: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """From the loop to watch: its heartbeat task and the watching thread."""
        self._beat = self._clock()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat_forever(), name="loop watchdog heartbeat")
        self._thread = threading.Thread(target=self._watch, name="loop watchdog", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        self._stopped.set()
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join)

    async def _beat_forever(self) -> None:
        while True:
            self._beat = self._clock()
            await asyncio.sleep(HEARTBEAT_S)

    def _watch(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            silent = self._clock() - self._beat - HEARTBEAT_S  # since the next stamp was due
            if silent >= self.stuck_after_s:
                self._on_stuck(silent)
                return
