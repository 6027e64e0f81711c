from __future__ import annotations

import numpy as np
import pytest

from media.libopus import OpusDecoder, OpusEncoder, OpusError, carries_fec
from tests.media.test_jitter_buffer import speech_packets


def test_fec_is_sent_only_while_loss_is_expected() -> None:
    assert not any(carries_fec(packet) for packet in speech_packets(0))
    assert sum(carries_fec(packet) for packet in speech_packets(10)) > len(speech_packets(10)) // 2


def test_expected_loss_is_retuned_between_packets() -> None:
    encoder = OpusEncoder(bitrate=48_000)
    speech = (0.3 * 32767 * np.sin(2 * np.pi * 200 * np.arange(48_000) / 48_000)).astype(np.int16)
    frames = [speech[start : start + 960] for start in range(0, speech.size, 960)]
    before = [encoder.encode(frame) for frame in frames[:20]]
    encoder.set_expected_loss(20)
    after = [encoder.encode(frame) for frame in frames[20:]]
    assert encoder.expected_loss_percent == 20
    assert not any(map(carries_fec, before)) and any(map(carries_fec, after))


def test_a_decoder_reports_malformed_packets_as_opus_errors() -> None:
    decoder = OpusDecoder()
    with pytest.raises(OpusError, match="opus_decode"):
        decoder.decode(b"\xff\xff\xff")
    assert decoder.decode(speech_packets(0)[0]).size == 960  # and decodes the next packet as usual


def test_concealment_comes_in_the_size_asked() -> None:
    decoder = OpusDecoder()
    decoder.decode(speech_packets(0)[0])
    assert decoder.conceal(480).size == 480
    assert decoder.packet_samples(speech_packets(0)[1]) == 960


def test_close_is_safe_twice_and_a_closed_decoder_refuses_work() -> None:
    decoder = OpusDecoder()
    decoder.close()
    decoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        decoder.conceal(960)
