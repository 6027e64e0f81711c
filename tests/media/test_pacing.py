"""Outbound pacing lateness: counted per frame, judged per window, warned about once per window."""

from __future__ import annotations

import logging

import pytest

from media.pacing import LATENESS_BUCKETS_S, OVERLOAD_WINDOW_S, FramePacer, PacingStats
from tests.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def frames(pacer: FramePacer, count: int) -> None:
    for _ in range(count):
        await pacer.wait_until_due()
        pacer.pts += 960


async def test_on_time_frames_count_in_the_first_bucket_and_nothing_is_late(clock: FakeClock) -> None:
    stats = PacingStats(clock=clock)
    await frames(FramePacer(clock=clock, sleep=clock.sleep, stats=stats), 51)
    snapshot = stats.snapshot()
    assert snapshot["frames"] == 50  # the first frame starts the clock
    assert snapshot["bucket_counts"][0] == 50
    assert (snapshot["late_frames"], snapshot["skipped_frames"], snapshot["overloaded"]) == (0, 0, False)


async def test_a_frame_a_whole_period_late_is_late_and_a_stall_skips_slots(clock: FakeClock) -> None:
    stats = PacingStats(clock=clock)
    pacer = FramePacer(clock=clock, sleep=clock.sleep, stats=stats)
    await frames(pacer, 2)
    clock.now += 0.045  # due at +20 ms, asked for at +45 ms: 25 ms late, caught up
    await frames(pacer, 1)
    assert (stats.late_frames, stats.skipped_frames) == (1, 0)
    clock.now += 0.1  # a 100 ms stall: 5 slots skipped
    await frames(pacer, 1)
    assert stats.skipped_frames == 5
    assert stats.late_frames == 2
    lateness_bounds = [bound for bound, count in zip(LATENESS_BUCKETS_S, stats.bucket_counts, strict=False) if count]
    assert max(lateness_bounds) == 0.2  # the stall's frame: in the (100 ms, 200 ms] bucket


async def test_overload_is_reported_warned_once_per_window_and_forgotten_when_idle(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    stats = PacingStats(clock=clock)
    pacer = FramePacer(clock=clock, sleep=clock.sleep, stats=stats)
    await frames(pacer, 10)
    clock.now += 0.5
    await frames(pacer, 1)
    assert stats.overloaded  # already this window: 25 slots lost for 10 sent
    with caplog.at_level(logging.WARNING, logger="media.pacing"):
        await frames(pacer, int(2 * OVERLOAD_WINDOW_S / 0.02))  # two windows on time
    warnings = [record for record in caplog.records if "falling behind" in record.getMessage()]
    assert len(warnings) == 1  # only the window with the stall
    assert not stats.overloaded  # the last full window was on time
    clock.now += 3 * OVERLOAD_WINDOW_S
    assert not stats.overloaded


async def test_a_stall_moves_the_timeline_over_the_slots_it_skipped(clock: FakeClock) -> None:
    """The frame after a stall is stamped with its time: the peer sees a gap, not every later packet late."""
    pacer = FramePacer(clock=clock, sleep=clock.sleep)
    await frames(pacer, 3)  # frames 0-2, the last sent at +40 ms
    started = clock.now - 0.04
    clock.now += 0.3  # the loop stalled: frame 3 was due at +60 ms and goes at +340 ms
    await pacer.wait_until_due()
    assert pacer.pts == 17 * 960  # 14 slots skipped: stamped +340 ms
    assert pacer.pts / 48_000 == pytest.approx(clock.now - started)
    pacer.pts += 960
    await frames(pacer, 3)  # back on the clock, 20 ms apart
    assert clock.sleeps[-3:] == pytest.approx([0.02] * 3)
    assert pacer.pts / 48_000 == pytest.approx(clock.now - started + 0.02)
