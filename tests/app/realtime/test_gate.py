"""The event gate on its own: event size and rate, audio appends aside; how refusals are answered."""

from __future__ import annotations

from app.realtime.gate import (
    FLOOD_REFUSALS,
    FLOOD_WINDOW_S,
    REPLY_BURST,
    EventGate,
    EventRate,
    Refusal,
    RefusalReplies,
)
from app.token_bucket import TokenBucket
from tests.clock import FakeClock


def refused_at(replies: RefusalReplies, clock: FakeClock, now: float) -> Refusal:
    clock.now = now
    return replies.refused()


def test_gate_admits_small_events():
    gate = EventGate(max_bytes=100, per_second=10, burst=5, clock=FakeClock())
    assert gate.admit('{"type": "response.create"}') is None


def test_gate_rejects_oversized_event_by_bytes_not_characters():
    gate = EventGate(max_bytes=10, per_second=10, burst=5, clock=FakeClock())
    rejection = gate.admit("é" * 6)  # 6 characters, 12 bytes
    assert rejection is not None
    assert rejection.code == "event_too_large"


def test_gate_rejects_past_the_burst_then_recovers_with_time():
    clock = FakeClock()
    gate = EventGate(max_bytes=100, per_second=10, burst=3, clock=clock)
    assert [gate.admit("{}") for _ in range(3)] == [None, None, None]
    rejection = gate.admit("{}")
    assert rejection is not None
    assert rejection.code == "rate_limit_exceeded"
    clock.now += 0.15  # one and a half tokens at 10 per second
    assert gate.admit("{}") is None
    assert gate.admit("{}") is not None


def test_gate_charges_every_event_by_its_size_the_refused_too():
    gate = EventGate(max_bytes=10, per_second=10, burst=5, max_image_event_bytes=30, clock=FakeClock())
    refused = gate.admit("x" * 1_000)  # past the largest event: pays as the largest (3), unread
    assert refused is not None and refused.code == "event_too_large"
    assert gate.admit("{}") is None and gate.admit("{}") is None  # the 2 tokens left
    refused = gate.admit("{}")
    assert refused is not None and refused.code == "rate_limit_exceeded"


def test_gate_does_not_count_audio_appends_wherever_their_type_stands():
    gate = EventGate(max_bytes=1_000, per_second=10, burst=2, clock=FakeClock())
    appends = ['{"type": "input_audio_buffer.append", "audio": "AAAA"}',
               '{"audio": "AAAA", "type": "input_audio_buffer.append"}']  # openai-python's field order
    for _ in range(10):
        for append in appends:
            assert gate.admit(append) is None
            assert gate.admit_parsed(append, audio_chars=4) is None
    assert gate.admit("{}") is None  # the burst is still whole


def test_gate_charges_an_event_that_only_looked_like_an_append_once_parsed():
    gate = EventGate(max_bytes=1_000, per_second=10, burst=2, clock=FakeClock())
    lookalike = '{"type": "conversation.item.create", "item": {"text": "input_audio_buffer.append"}}'
    answers = []
    for _ in range(3):
        assert gate.admit(lookalike) is None
        answers.append(gate.admit_parsed(lookalike, audio_chars=None))
    assert answers[:2] == [None, None]
    assert answers[2] is not None and answers[2].code == "rate_limit_exceeded"


def test_gate_charges_an_append_larger_than_any_append_before_parsing():
    gate = EventGate(max_bytes=100, per_second=10, burst=5, max_image_event_bytes=1_000, clock=FakeClock())
    large = '{"type": "input_audio_buffer.append", "audio": "' + "A" * 400 + '"}'  # 5 events' worth
    assert gate.admit(large) is None  # charged all 5 tokens; refused once parsed (no image)
    refused = gate.admit("{}")
    assert refused is not None and refused.code == "rate_limit_exceeded"


def test_gate_refuses_an_append_padded_beyond_its_audio_and_charges_it():
    gate = EventGate(max_bytes=300_000, per_second=10, burst=2, clock=FakeClock())
    padded = '{"type": "input_audio_buffer.append", "audio": "AAAA", "pad": "' + "x" * 240_000 + '"}'
    first = gate.admit(padded)
    refused = gate.admit_parsed(padded, audio_chars=4)

    assert first is None
    assert refused is not None and refused.code == "invalid_value" and "beside the audio" in refused.message
    gate.admit_parsed(padded, audio_chars=4)
    assert gate.admit("{}") is not None  # the padded appends paid the event rate: 240 KB each


def test_gate_lets_an_append_with_its_usual_envelope_through_uncharged():
    gate = EventGate(max_bytes=1_000, per_second=10, burst=1, clock=FakeClock())
    append = '{"type": "input_audio_buffer.append", "audio": "AAAA", "event_id": "evt_' + "1" * 40 + '"}'
    for _ in range(5):
        assert gate.admit(append) is None and gate.admit_parsed(append, audio_chars=4) is None
    assert gate.admit("{}") is None


def test_refusals_are_answered_up_to_a_rate_and_the_next_answer_counts_the_rest():
    clock = FakeClock(0.0)
    replies = RefusalReplies(clock=clock)
    answered = [replies.refused().reply for _ in range(REPLY_BURST + 30)]
    assert answered == [True] * REPLY_BURST + [False] * 30
    clock.now = 1.0
    later = replies.refused()  # REPLIES_PER_SECOND refilled: answered, naming what was not
    assert later.reply and later.unanswered == 30 and not later.flooding


def test_a_thousand_refusals_within_ten_seconds_are_a_flood_and_fewer_are_not():
    clock = FakeClock(0.0)
    steady = RefusalReplies(clock=clock)
    # Just under the flood's pace for a minute: refused, never a flood.
    interval = FLOOD_WINDOW_S / (FLOOD_REFUSALS - 10)
    assert not any(refused_at(steady, clock, step * interval).flooding for step in range(int(60 / interval)))
    clock.now = 0.0
    flood = RefusalReplies(clock=clock)
    outcomes = [refused_at(flood, clock, step * 0.001) for step in range(FLOOD_REFUSALS)]
    assert not any(outcome.flooding for outcome in outcomes[:-1]) and outcomes[-1].flooding
    assert outcomes[-1].reply  # the flood is told why the session ends


def test_gates_of_one_client_share_its_bucket_and_another_clients_is_unaffected():
    clock = FakeClock()
    refusals: list[str] = []

    def gate_of(client: TokenBucket) -> EventGate:
        return EventGate(max_bytes=100, per_second=10, burst=3, client=client, on_refused=refusals.append, clock=clock)

    one_client, another_client = EventRate(15, 4).bucket(clock=clock), EventRate(15, 4).bucket(clock=clock)
    first, second, other = gate_of(one_client), gate_of(one_client), gate_of(another_client)
    assert [first.admit("{}") for _ in range(3)] == [None, None, None]  # each within its own burst of 3
    assert second.admit("{}") is None  # the client's fourth
    refused = second.admit("{}")
    assert refused is not None and refused.code == "rate_limit_exceeded"
    assert "(the client limit)" in refused.message and "15 events per second (bursts of 4)" in refused.message
    assert [other.admit("{}") for _ in range(3)] == [None, None, None]  # another client's bucket is whole
    refused = first.admit("{}")
    assert refused is not None and "(the session limit)" in refused.message  # its own first
    assert refusals == ["client", "session"]
    clock.now += 0.1  # one token each: the session's at 10 a second, the client's at 15
    assert second.admit("{}") is None and first.admit("{}") is not None  # the client's is spent again


def test_a_clients_bucket_is_twice_a_sessions():
    assert EventRate(50, 100).for_client() == EventRate(100, 200)
