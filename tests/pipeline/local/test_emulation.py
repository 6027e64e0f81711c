"""The emulated speed's schedule (``pipeline.local.emulation``), on a clock the test moves."""

import numpy as np
import pytest

from pipeline.contract import AudioChunk, GenerationDone, TextDelta, Usage
from pipeline.local.emulation import EmulatedGenerations, EmulatedSpeed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


def chunk(frames: int) -> AudioChunk:
    return AudioChunk(np.zeros(1920 * frames, dtype=np.float32), frames=frames)


DONE = GenerationDone(text="hi", usage=Usage(5, 0, 2, output_audio_tokens=12), finish_reason="stop")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sent() -> list:
    return []


def turns(clock: Clock, sent: list) -> EmulatedGenerations[int]:
    return EmulatedGenerations[int](lambda key, event: sent.append((key, event)), clock=clock)


def test_first_audio_waits_for_its_model_time_and_later_chunks_for_their_frames(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_audio_ms=400, frame_ms=30))
    clock.advance_ms(50)  # the dev model computes everything at once
    for event in (chunk(4), chunk(10), DONE):
        emulated.offer(1, event)
    assert sent == []
    clock.advance_ms(349)
    emulated.release_due()
    assert sent == []
    clock.advance_ms(1)  # 400 ms after the turn started
    emulated.release_due()
    assert [event.frames for _, event in sent] == [4]
    clock.advance_ms(299)
    emulated.release_due()
    assert len(sent) == 1
    clock.advance_ms(1)  # 10 frames more at 30 ms each
    emulated.release_due()
    assert [type(event) for _, event in sent] == [AudioChunk, AudioChunk, GenerationDone]


def test_text_waits_for_first_text_ms_and_events_keep_their_order(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_text_ms=200, first_audio_ms=100))
    emulated.offer(1, TextDelta("a"))
    emulated.offer(1, chunk(4))  # due at 100 ms, but after the text before it
    clock.advance_ms(150)
    emulated.release_due()
    assert sent == []
    clock.advance_ms(50)
    emulated.release_due()
    assert [type(event) for _, event in sent] == [TextDelta, AudioChunk]


def test_an_event_computed_after_its_emulated_time_goes_at_once(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_audio_ms=100))
    clock.advance_ms(250)
    emulated.offer(1, chunk(4))
    assert [type(event) for _, event in sent] == [AudioChunk]


def test_turns_decoded_together_keep_their_own_clocks(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_audio_ms=400))
    clock.advance_ms(300)
    emulated.start(2, EmulatedSpeed(first_audio_ms=400))
    emulated.offer(1, chunk(4))
    emulated.offer(2, chunk(4))
    clock.advance_ms(100)
    emulated.release_due()
    assert [key for key, _ in sent] == [1]
    assert emulated.seconds_to_next() == pytest.approx(0.3)
    clock.advance_ms(300)
    emulated.release_due()
    assert [key for key, _ in sent] == [1, 2]
    assert emulated.seconds_to_next() is None


def test_a_turn_without_a_speed_passes_through(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, None)
    emulated.offer(1, chunk(4))
    emulated.offer(1, DONE)
    assert [type(event) for _, event in sent] == [AudioChunk, GenerationDone]


def test_cancel_drops_what_is_held_and_returns_its_done_as_cancelled(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_audio_ms=10_000))
    emulated.offer(1, chunk(4))
    emulated.offer(1, DONE)
    assert emulated.holds_done() == [1]
    done = emulated.cancel(1)
    assert done is not None
    assert (done.finish_reason, done.usage) == ("cancelled", DONE.usage)
    clock.advance_ms(20_000)
    emulated.release_due()
    assert sent == []
    assert emulated.seconds_to_next() is None


def test_cancel_of_a_turn_still_decoding_holds_no_done(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_audio_ms=10_000))
    emulated.offer(1, chunk(4))
    assert emulated.cancel(1) is None
    assert emulated.holds_done() == []


def test_the_turn_is_forgotten_once_its_done_is_released(clock, sent):
    emulated = turns(clock, sent)
    emulated.start(1, EmulatedSpeed(first_audio_ms=10))
    emulated.offer(1, DONE)
    clock.advance_ms(10)
    emulated.release_due()
    assert emulated.cancel(1) is None
    emulated.offer(1, TextDelta("late"))  # a key not held any more passes through
    assert [type(event) for _, event in sent] == [GenerationDone, TextDelta]


@pytest.mark.parametrize("value", [{"first_audio": 400}, {"first_audio_ms": -1}, {"frame_ms": "fast"}, [400]])
def test_a_wrong_speed_is_refused_with_its_name(value):
    with pytest.raises(ValueError, match="emulate"):
        EmulatedSpeed.of(value)


def test_a_speed_describes_the_figures_set():
    assert EmulatedSpeed.of({"first_audio_ms": 400}).describe() == {"first_audio_ms": 400}
