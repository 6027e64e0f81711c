"""PlaybackLedger: what was heard of each assistant item, on the output's played-sample clock."""

from app.realtime.history import PlaybackLedger


def test_item_is_heard_as_far_as_the_clock_went():
    ledger = PlaybackLedger()
    ledger.write("a", "r", 1000, played_samples=0)

    assert ledger.get("a").heard(400) == 400
    assert ledger.get("a").heard(5000) == 1000


def test_a_drained_output_has_played_everything_even_if_its_count_is_short():
    ledger = PlaybackLedger()
    ledger.write("a", "r", 1000, played_samples=0)
    ledger.complete("a")

    ledger.drained(played_samples=999)  # resampling rounded one sample away

    (finished,) = ledger.pop_finished(999)
    assert finished.heard(999) == finished.written == 1000


def test_audio_after_a_gap_continues_on_the_clock():
    ledger = PlaybackLedger()
    ledger.write("a", "r", 1000, played_samples=0)
    ledger.drained(played_samples=1000)  # the engine fell behind; the output ran dry
    ledger.write("a", "r", 500, played_samples=1000)

    assert ledger.get("a").heard(1200) == 1200
    assert ledger.pop_finished(1500) == []  # not complete yet
    ledger.complete("a")
    assert [p.item_id for p in ledger.pop_finished(1500)] == ["a"]


def test_second_item_queues_after_the_first():
    ledger = PlaybackLedger()
    ledger.write("a", "r1", 1000, played_samples=0)
    ledger.complete("a")
    ledger.write("b", "r2", 1000, played_samples=300)

    assert ledger.get("b").heard(1500) == 500
    assert [p.item_id for p in ledger.pop_finished(1000)] == ["a"]


def test_cut_keeps_what_was_heard_and_closes_everything():
    ledger = PlaybackLedger()
    ledger.write("a", "r1", 1000, played_samples=0)
    ledger.write("b", "r2", 1000, played_samples=0)

    cut = ledger.cut(played_samples=1250)

    assert [(p.item_id, p.heard(10_000)) for p in cut] == [("a", 1000), ("b", 250)]
    assert len(ledger) == 0
    ledger.write("c", "r3", 100, played_samples=1250)
    assert ledger.get("c").heard(1300) == 50
