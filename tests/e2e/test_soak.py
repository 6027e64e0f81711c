"""A reduced soak against the dev-model server: what it holds returns to where it started.

``tests/bench/soak.py`` is the full run (200 turns, 100 calls) and reports the figures; this
runs its phases small enough for CI (10 turns, two of them spoken, and 10 calls, ~2 min on 2
cores) and asserts that asyncio tasks, file descriptors and threads (but for the executor pool,
which may grow to its size) come back exactly to their baseline, and RSS within
``RSS_TOLERANCE_BYTES``.
"""

from __future__ import annotations

import os

import pytest

from tests.bench.soak import SoakResult, run_soak

pytestmark = pytest.mark.e2e

TURNS = 10
SPEECH_EVERY = 5
CYCLES = 10
# Python's allocator keeps freed arenas and glibc keeps fragments: RSS may settle a little above
# the baseline without a leak (the full soak measured +3 MB after 20 turns and 20 calls). A leak
# of one call's buffers (~1 MB of audio queues and aiortc state) per call would show as far more
# over 200 turns and 100 calls in the bench; here the bound only catches gross leaks.
RSS_TOLERANCE_BYTES = 64 * 2**20
# asyncio.to_thread's default executor starts a worker whenever none is idle, up to its size
# (ThreadPoolExecutor's default), and keeps it: a count that may rise without a leak.
EXECUTOR_THREADS = "asyncio"
EXECUTOR_MAX_WORKERS = min(32, (os.cpu_count() or 1) + 4)


@pytest.fixture(scope="module")
async def soak(server_url: str) -> SoakResult:
    return await run_soak(server_url, turns=TURNS, cycles=CYCLES, speech_every=SPEECH_EVERY)


def test_every_turn_is_answered(soak: SoakResult):
    assert soak.turns == TURNS
    # The dev model stops at the 8-token limit (incomplete) more often than by itself.
    assert set(soak.turn_statuses) <= {"completed", "incomplete"}, soak.turn_statuses


def test_every_call_connects(soak: SoakResult):
    assert soak.cycles == CYCLES


def test_no_session_is_left_open(soak: SoakResult):
    assert soak.snapshot("end").sessions == 0


@pytest.mark.parametrize("count", ["asyncio_tasks", "fds"])
def test_counts_return_to_their_start(soak: SoakResult, count: str):
    start, after_turns, end = (getattr(soak.snapshot(p), count) for p in ("start", "after_turns", "end"))
    assert (after_turns, end) == (start, start)


def worker_figures(soak: SoakResult, phase: str, figure: str) -> dict[str, object]:
    """Each media worker's ``figure`` at ``phase``, by worker and pid (a restarted worker differs)."""
    return {f"{worker['worker']}/{worker['pid']}": worker[figure] for worker in soak.snapshot(phase).workers}


@pytest.mark.parametrize("count", ["asyncio_tasks", "fds"])
def test_each_media_worker_returns_to_its_start(soak: SoakResult, count: str):
    """The calls lived in the media workers (the server runs one per core by default)."""
    start, after_turns, end = (worker_figures(soak, phase, count) for phase in ("start", "after_turns", "end"))
    assert (after_turns, end) == (start, start)


def test_each_media_workers_threads_return_to_their_start_but_the_executor_pool(soak: SoakResult):
    def named(phase: str) -> dict[str, object]:
        return {
            worker: {kind: n for kind, n in kinds.items() if kind != EXECUTOR_THREADS}
            for worker, kinds in worker_figures(soak, phase, "thread_kinds").items()
        }

    assert (named("after_turns"), named("end")) == (named("start"), named("start"))


def test_threads_return_to_their_start_but_the_executor_pool(soak: SoakResult):
    def named(phase: str) -> dict[str, int]:
        return {kind: n for kind, n in soak.snapshot(phase).thread_kinds.items() if kind != EXECUTOR_THREADS}

    assert (named("after_turns"), named("end")) == (named("start"), named("start"))
    assert soak.snapshot("end").thread_kinds.get(EXECUTOR_THREADS, 0) <= EXECUTOR_MAX_WORKERS


def test_server_rss_returns_within_tolerance(soak: SoakResult):
    assert soak.snapshot("end").rss_bytes - soak.snapshot("start").rss_bytes <= RSS_TOLERANCE_BYTES


def test_engine_and_worker_rss_return_within_tolerance(soak: SoakResult):
    growth = soak.snapshot("end").children_rss_bytes - soak.snapshot("start").children_rss_bytes
    assert growth <= RSS_TOLERANCE_BYTES
