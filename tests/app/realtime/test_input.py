"""Appended audio on its own: how far ahead of real time appends may run, and what each costs."""

from __future__ import annotations

import base64

import pytest

from app.realtime.input import AppendDecoder
from app.realtime.protocol import ProtocolError


def test_appends_may_run_ahead_by_the_bound_then_at_twice_real_time_and_no_faster():
    now = [0.0]
    decoder = AppendDecoder(clock=lambda: now[0], max_ahead_ms=2_000)
    second = base64.b64encode(bytes(2 * 24_000)).decode()
    decoder.decode(second, input_audio_format="audio/pcm")
    decoder.decode(second, input_audio_format="audio/pcm")
    with pytest.raises(ProtocolError) as refused:
        decoder.decode(second, input_audio_format="audio/pcm")
    assert refused.value.code == "input_audio_too_fast"
    now[0] = 1.0  # a second later, two seconds more
    decoder.decode(second, input_audio_format="audio/pcm")
    decoder.decode(second, input_audio_format="audio/pcm")
    with pytest.raises(ProtocolError):
        decoder.decode(second, input_audio_format="audio/pcm")


def test_each_append_costs_at_least_10_ms_so_tiny_appends_make_no_flood():
    decoder = AppendDecoder(clock=lambda: 0.0, max_ahead_ms=1_000)
    one_sample = base64.b64encode(bytes(2)).decode()  # 1/24 ms of audio
    for _ in range(100):  # 100 x 10 ms: the whole bound
        decoder.decode(one_sample, input_audio_format="audio/pcm")
    with pytest.raises(ProtocolError) as refused:
        decoder.decode(one_sample, input_audio_format="audio/pcm")
    assert refused.value.code == "input_audio_too_fast"


def test_an_append_that_fails_to_decode_costs_as_much_as_one_that_does():
    decoder = AppendDecoder(clock=lambda: 0.0, max_ahead_ms=1_000)
    codes = []
    for _ in range(101):  # "!" is no base64: each is refused as invalid, and charged its 10 ms
        with pytest.raises(ProtocolError) as refused:
            decoder.decode("!", input_audio_format="audio/pcm")
        codes.append(refused.value.code)
    assert set(codes[:100]) == {"invalid_value"}
    assert codes[100] == "input_audio_too_fast"


def test_an_append_is_charged_the_audio_its_base64_claims_before_decoding():
    decoder = AppendDecoder(clock=lambda: 0.0, max_ahead_ms=1_500)
    second = base64.b64encode(bytes(2 * 24_000)).decode()
    with pytest.raises(ProtocolError) as broken:
        decoder.decode("!" + second[1:], input_audio_format="audio/pcm")  # 1 s claimed, one bad character
    with pytest.raises(ProtocolError) as refused:
        decoder.decode(second, input_audio_format="audio/pcm")
    assert (broken.value.code, refused.value.code) == ("invalid_value", "input_audio_too_fast")
