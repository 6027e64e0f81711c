"""The interruption judge: speech over the answer pauses it, proves itself or lets it play on."""

from __future__ import annotations

from app.realtime.interruption import (
    Backchannel,
    Confirmed,
    InterruptionJudge,
    InterruptionRules,
    JudgedSpeech,
    Paused,
    Resumed,
)
from media.vad import WINDOW_SAMPLES

RULES = InterruptionRules.from_ms(700, 250)
MS = 16  # samples a millisecond


def hear(judge: InterruptionJudge, heard_until: int | None, position: int, *, in_speech: bool = True) -> list:
    return judge.hear(speech_heard_until=heard_until, position=position, in_speech=in_speech, rules=RULES)


def test_the_first_speech_window_pauses_the_answer():
    judge = InterruptionJudge()
    assert hear(judge, None, 1000) == []
    assert hear(judge, 1000 + WINDOW_SAMPLES, 1000 + WINDOW_SAMPLES, in_speech=False) == [Paused()]
    assert judge.state is JudgedSpeech.PAUSED
    assert hear(judge, 1000 + 2 * WINDOW_SAMPLES, 1000 + 2 * WINDOW_SAMPLES) == []  # paused once


def test_speech_going_on_past_the_minimum_since_the_pause_is_an_interruption():
    judge = InterruptionJudge()
    start = 10_000
    hear(judge, start + WINDOW_SAMPLES, start + WINDOW_SAMPLES)
    almost = start + 699 * MS
    assert hear(judge, almost, almost) == []
    assert hear(judge, start + 700 * MS, start + 700 * MS) == [Confirmed()]
    assert judge.state is JudgedSpeech.CONFIRMED
    assert hear(judge, start + 900 * MS, start + 900 * MS) == []


def test_an_interruption_needs_the_detector_to_hold_it_as_speech():
    judge = InterruptionJudge()
    hear(judge, WINDOW_SAMPLES, WINDOW_SAMPLES, in_speech=False)
    assert hear(judge, 800 * MS, 800 * MS, in_speech=False) == []  # still pending at the detector
    assert hear(judge, 820 * MS, 820 * MS, in_speech=True) == [Confirmed()]


def test_quiet_before_the_minimum_resumes_and_more_speech_pauses_again():
    judge = InterruptionJudge()
    hear(judge, WINDOW_SAMPLES, WINDOW_SAMPLES)
    heard = 300 * MS
    assert hear(judge, heard, heard + 249 * MS) == []
    assert hear(judge, heard, heard + 250 * MS) == [Resumed()]
    assert judge.judging and not judge.paused
    assert hear(judge, heard, heard + 400 * MS) == []
    window_start = heard + 420 * MS
    again = window_start + WINDOW_SAMPLES
    assert hear(judge, again, again) == [Paused()]  # the same utterance goes on: judged from this pause
    assert hear(judge, window_start + 699 * MS, window_start + 699 * MS) == []
    assert hear(judge, window_start + 700 * MS, window_start + 700 * MS) == [Confirmed()]


def test_an_utterance_that_ends_unconfirmed_is_a_backchannel():
    judge = InterruptionJudge()
    hear(judge, WINDOW_SAMPLES, WINDOW_SAMPLES)
    assert judge.utterance_over() == [Resumed(), Backchannel()]
    assert judge.state is JudgedSpeech.NONE

    hear(judge, 2 * WINDOW_SAMPLES, 2 * WINDOW_SAMPLES)
    hear(judge, 2 * WINDOW_SAMPLES, 2 * WINDOW_SAMPLES + 300 * MS)  # resumed already
    assert judge.utterance_over() == [Backchannel()]


def test_a_sound_the_detector_drops_resumes_without_a_backchannel():
    judge = InterruptionJudge()
    hear(judge, WINDOW_SAMPLES, WINDOW_SAMPLES, in_speech=False)  # a cough's first window
    assert hear(judge, None, 4 * WINDOW_SAMPLES, in_speech=False) == [Resumed()]
    assert judge.state is JudgedSpeech.NONE
    assert judge.utterance_over() == []
