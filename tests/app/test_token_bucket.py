"""The token bucket every rate bound of the server is made of."""

from __future__ import annotations

import pytest

from app.token_bucket import TokenBucket
from tests.clock import FakeClock


def test_a_bucket_starts_full_and_takes_what_it_holds():
    bucket = TokenBucket(3, 1, clock=FakeClock())
    assert bucket.full
    assert [bucket.take(1) for _ in range(4)] == [True, True, True, False]
    assert not bucket.full


def test_a_cost_it_does_not_hold_takes_nothing():
    bucket = TokenBucket(10, 1, clock=FakeClock())
    assert bucket.take(6)
    assert not bucket.take(6)
    assert bucket.tokens == 4  # the refused take spent nothing
    assert bucket.take(4)


def test_it_refills_at_its_rate_up_to_its_burst():
    clock = FakeClock()
    bucket = TokenBucket(10, 4, clock=clock)
    assert bucket.take(10)
    clock.now += 0.5
    assert bucket.tokens == 2
    clock.now += 100
    assert bucket.tokens == 10 and bucket.full


def test_a_charge_goes_below_zero_and_takes_wait_until_it_is_paid_off():
    clock = FakeClock()
    bucket = TokenBucket(10, 5, clock=clock)
    bucket.charge(25)
    assert bucket.tokens == -15
    assert not bucket.holds(1)
    clock.now += 3.0  # 15 refilled: back at zero
    assert bucket.tokens == 0 and not bucket.take(1)
    clock.now += 0.2
    assert bucket.take(1)


@pytest.mark.parametrize(("burst", "per_second"), [(0, 1), (-1, 1), (1, -1)])
def test_a_bucket_that_could_never_admit_anything_is_refused(burst: float, per_second: float):
    with pytest.raises(ValueError, match="positive burst"):
        TokenBucket(burst, per_second)
