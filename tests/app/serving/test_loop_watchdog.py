"""The server's loop watchdog: a loop blocked past its bound ends the process; a loop that answers never does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

from app.serving.loop_watchdog import STUCK_EXIT_STATUS, LoopWatchdog


async def test_a_loop_blocked_past_the_bound_is_reported_once_from_the_thread() -> None:
    reports: list[float] = []
    watchdog = LoopWatchdog(0.5, on_stuck=reports.append)
    watchdog.start()
    try:
        await asyncio.sleep(0.6)  # answering: its heartbeat goes on
        assert reports == []
        time.sleep(1.6)  # blocked: nothing on the loop runs
        assert len(reports) == 1 and reports[0] >= 0.5
    finally:
        await watchdog.close()
        await watchdog.close()  # safe twice
    assert reports[0] < 1.6


async def test_a_busy_loop_that_answers_and_a_closed_watchdog_report_nothing() -> None:
    reports: list[float] = []
    watchdog = LoopWatchdog(0.5, on_stuck=reports.append)
    watchdog.start()
    for _ in range(20):  # busy in short pieces: 20 x 0.1 s, each followed by an await
        time.sleep(0.1)
        await asyncio.sleep(0)
    await watchdog.close()
    time.sleep(1.0)  # blocked after close: nobody watches any more
    assert reports == []


def test_a_stuck_loop_ends_the_process_with_its_status_and_every_threads_stack() -> None:
    script = textwrap.dedent("""
        import asyncio, logging, time
        from app.serving.loop_watchdog import LoopWatchdog

        async def main():
            LoopWatchdog(0.5).start()
            await asyncio.sleep(0.1)
            time.sleep(30)  # stuck for good

        logging.basicConfig(level=logging.INFO)
        asyncio.run(main())
    """)
    started = time.monotonic()
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert ended.returncode == STUCK_EXIT_STATUS
    assert time.monotonic() - started < 25  # not the sleep's end
    assert "the event loop has not answered" in ended.stderr
    assert "in main" in ended.stderr  # the stack of the thread that holds the loop
