from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import pytest
import soxr
from aiortc.mediastreams import MediaStreamError

from media.outbound import FRAME_SAMPLES, OutboundAudioTrack
from tests.clock import FakeClock


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_playback_started(self) -> None:
        self.calls.append("started")

    def on_playback_stopped(self) -> None:
        self.calls.append("stopped")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def track(clock: FakeClock) -> OutboundAudioTrack:
    return OutboundAudioTrack(clock=clock, sleep=clock.sleep)


def sine(seconds: float, frequency: float = 440.0, rate: int = 24_000) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * frequency * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


async def receive(track: OutboundAudioTrack, count: int) -> np.ndarray:
    """``count`` frames as one int16 array."""
    return np.concatenate([(await track.recv()).to_ndarray().reshape(-1) for _ in range(count)])


async def test_idle_track_sends_paced_silence_frames(track: OutboundAudioTrack, clock: FakeClock) -> None:
    frames = [await track.recv() for _ in range(5)]
    assert [frame.pts for frame in frames] == [0, 960, 1920, 2880, 3840]
    for frame in frames:
        assert (frame.samples, frame.sample_rate, frame.time_base) == (FRAME_SAMPLES, 48_000, Fraction(1, 48_000))
        assert (frame.format.name, frame.layout.name) == ("s16", "mono")
        assert not frame.to_ndarray().any()
    assert clock.sleeps == pytest.approx([0.02] * 4)
    assert track.played_samples == 0


async def test_small_lateness_is_caught_up_without_drift(track: OutboundAudioTrack, clock: FakeClock) -> None:
    start = clock.now
    await receive(track, 2)  # frame 1 due at +20 ms
    clock.now += 0.03  # the loop was busy: frame 2 (due +40 ms) is asked for at +50 ms
    await track.recv()
    assert clock.now == pytest.approx(start + 0.05)
    await receive(track, 3)  # frames 3..5 keep the original schedule
    assert clock.now == pytest.approx(start + 0.10)


async def test_a_stall_skips_its_slots_instead_of_bursting(track: OutboundAudioTrack, clock: FakeClock) -> None:
    await receive(track, 2)
    clock.now += 0.5  # the loop stalled for half a second: frame 2, due at +40 ms, goes at +520 ms
    late = await track.recv()
    clock.sleeps.clear()
    following = [await track.recv() for _ in range(3)]
    assert clock.sleeps == pytest.approx([0.02] * 3)  # no back-to-back frames after the stall
    # Stamped with when they go (24 slots skipped), so the peer sees them on time.
    assert [frame.pts for frame in [late, *following]] == [24960, 25920, 26880, 27840]


async def test_written_audio_is_sent_whole_and_counted(track: OutboundAudioTrack) -> None:
    track.write(sine(0.5))  # 12000 samples at 24 kHz → 24000 at 48 kHz = 25 frames
    sent = await receive(track, 30)
    assert np.count_nonzero(sent[: 25 * FRAME_SAMPLES]) > 0.95 * 25 * FRAME_SAMPLES
    assert not sent[25 * FRAME_SAMPLES :].any()
    assert track.played_samples == 12_000


async def test_odd_sized_writes_equal_resampling_in_one_piece(track: OutboundAudioTrack) -> None:
    audio = sine(0.4, frequency=1000)  # 9600 samples
    sizes = [1, 7, 333, 1000, 17, 2048, 999, 5195]
    assert sum(sizes) == audio.size
    position = 0
    for size in sizes:
        track.write(audio[position : position + size])
        position += size
    sent = (await receive(track, 20)).astype(np.float64) / 32767

    expected = soxr.resample(audio, 24_000, 48_000, quality="HQ")
    assert np.max(np.abs(sent - expected)) <= 1 / 32767  # equal up to 16-bit rounding
    # No click: inside the tone (its abrupt edges ring), a 0.5-amplitude 1 kHz sine moves
    # at most 0.5 * 2π * 1000 / 48000 per sample, plus 16-bit rounding.
    assert np.max(np.abs(np.diff(sent[200:-200]))) < 0.5 * 2 * np.pi * 1000 / 48_000 + 2 / 32767


async def test_writes_interleaved_with_playback_stay_seamless(track: OutboundAudioTrack) -> None:
    audio = sine(1.0, frequency=300)
    chunk = 4800  # 200 ms chunks arriving while earlier ones play, ahead of real time
    track.write(audio[:chunk])
    sent = []
    for start in range(chunk, audio.size, chunk):
        sent.append(await receive(track, 5))
        track.write(audio[start : start + chunk])
    sent.append(await receive(track, 55))
    played = np.concatenate(sent).astype(np.float64) / 32767
    expected = soxr.resample(audio, 24_000, 48_000, quality="HQ")
    assert np.max(np.abs(played[: expected.size] - expected)) <= 1 / 32767
    assert track.played_samples == audio.size


async def test_short_write_is_flushed_out_of_the_resampler(track: OutboundAudioTrack) -> None:
    track.write(sine(0.004))  # 96 samples: less than soxr's delay, all withheld until flushed
    await receive(track, 2)
    assert track.played_samples == 96


async def test_listener_hears_started_then_stopped_once(track: OutboundAudioTrack) -> None:
    recorder = Recorder()
    track.set_listener(recorder)
    await receive(track, 2)
    assert recorder.calls == []
    track.write(sine(0.1))  # 5 frames
    await track.recv()
    assert recorder.calls == ["started"]
    await receive(track, 4)
    assert recorder.calls == ["started"]  # last audio frame sent; not yet known to be the last
    await track.recv()
    assert recorder.calls == ["started", "stopped"]
    await receive(track, 3)
    track.write(sine(0.1))
    await receive(track, 10)
    assert recorder.calls == ["started", "stopped", "started", "stopped"]


async def test_clear_drops_queued_audio_and_stops_playback(track: OutboundAudioTrack) -> None:
    recorder = Recorder()
    track.set_listener(recorder)
    track.write(sine(1.0))
    await receive(track, 3)
    track.clear()
    assert recorder.calls == ["started", "stopped"]
    assert not (await receive(track, 5)).any()
    assert track.played_samples == 3 * FRAME_SAMPLES // 2
    assert recorder.calls == ["started", "stopped"]


async def test_clear_when_idle_fires_nothing(track: OutboundAudioTrack) -> None:
    recorder = Recorder()
    track.set_listener(recorder)
    track.clear()
    track.write(sine(0.1))
    track.clear()  # written but never sent: nothing started, so nothing stops
    assert recorder.calls == []
    assert not (await receive(track, 3)).any()


async def test_audio_after_clear_plays_from_its_own_start(track: OutboundAudioTrack) -> None:
    track.write(sine(1.0, frequency=200))
    await receive(track, 2)
    track.clear()
    answer = sine(0.2, frequency=1000)
    track.write(answer)
    sent = (await receive(track, 12)).astype(np.float64) / 32767
    expected = soxr.resample(answer, 24_000, 48_000, quality="HQ")
    assert np.max(np.abs(sent[: expected.size] - expected)) <= 1 / 32767


async def test_stopped_track_ends(track: OutboundAudioTrack) -> None:
    recorder = Recorder()
    track.set_listener(recorder)
    track.write(sine(1.0))
    await track.recv()
    track.stop()
    assert recorder.calls == ["started", "stopped"]
    with pytest.raises(MediaStreamError):
        await track.recv()


@pytest.mark.parametrize(
    "pcm",
    [np.zeros(10, dtype=np.int16), np.zeros((2, 10), dtype=np.float32), np.array([0.0, np.nan], dtype=np.float32)],
    ids=["int16", "2-D", "NaN"],
)
async def test_bad_pcm_is_rejected_and_queued_audio_is_kept(track: OutboundAudioTrack, pcm: np.ndarray) -> None:
    track.write(sine(0.1))
    with pytest.raises(ValueError):
        track.write(pcm)
    await receive(track, 8)
    assert track.played_samples == 2400


async def test_real_clock_paces_by_default() -> None:
    track = OutboundAudioTrack()
    frames = [await track.recv() for _ in range(3)]
    assert [frame.pts for frame in frames] == [0, 960, 1920]


class HeldClock(FakeClock):
    """A fake clock whose next sleep, once ``hold()`` is called, lasts until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self._held: asyncio.Future[None] | None = None

    def hold(self) -> None:
        self._held = asyncio.get_running_loop().create_future()

    def release(self) -> None:
        assert self._held is not None
        self._held.set_result(None)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        held, self._held = self._held, None
        if held is not None:
            await held  # the time passes as the test says
        else:
            self.now += seconds


async def test_a_new_answers_first_frame_goes_at_once_and_the_schedule_moves_with_it() -> None:
    clock = HeldClock()
    track = OutboundAudioTrack(clock=clock, sleep=clock.sleep)
    await receive(track, 2)  # silence; the second frame went at +20 ms
    clock.hold()
    waiting = asyncio.ensure_future(track.recv())  # sleeps until +40 ms
    await asyncio.sleep(0)
    clock.now += 0.015  # 15 ms after the last frame, the answer arrives
    track.write(sine(0.1))
    frame = await asyncio.wait_for(waiting, 1.0)
    assert frame.pts == 1920 and frame.to_ndarray().any()  # its audio, now, at +35 ms
    assert clock.now == pytest.approx(1000.035)
    clock.sleeps.clear()
    following = [await track.recv() for _ in range(3)]
    assert clock.sleeps == pytest.approx([0.02] * 3)  # every later frame 20 ms after it
    assert [f.pts for f in following] == [2880, 3840, 4800]  # pts is still the samples sent


async def test_a_woken_frame_keeps_half_a_frame_after_the_last_one() -> None:
    clock = HeldClock()
    track = OutboundAudioTrack(clock=clock, sleep=clock.sleep)
    await receive(track, 2)
    clock.hold()
    waiting = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0)
    clock.now += 0.002  # the last silence frame went 2 ms ago
    track.write(sine(0.1))
    frame = await asyncio.wait_for(waiting, 1.0)
    assert frame.to_ndarray().any()
    assert clock.now == pytest.approx(1000.03)  # 10 ms after the last frame, not back to back
    assert clock.sleeps[-1] == pytest.approx(0.008)


async def test_audio_written_while_playing_leaves_the_schedule_alone(track: OutboundAudioTrack, clock: FakeClock) -> None:
    track.write(sine(0.1))
    await receive(track, 2)
    clock.sleeps.clear()
    for _ in range(5):
        track.write(sine(0.02))
        await track.recv()
    assert clock.sleeps == pytest.approx([0.02] * 5)
