"""G.711 µ-law and A-law against the standard library's reference codec (``audioop``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from media import g711

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # deprecated, and still the reference on 3.11/3.12
    audioop = pytest.importorskip("audioop", reason="audioop left the standard library in Python 3.13")

CODECS = {
    "audio/pcmu": (audioop.lin2ulaw, audioop.ulaw2lin),
    "audio/pcma": (audioop.lin2alaw, audioop.alaw2lin),
}


@pytest.mark.parametrize("format_type", sorted(CODECS))
def test_encoding_every_16_bit_sample_matches_audioop(format_type):
    encode_reference, _ = CODECS[format_type]
    samples = np.arange(-32_768, 32_768, dtype=np.int16)
    ours = g711.encode(samples.astype(np.float32) / 32_768, format_type)
    assert ours == encode_reference(samples.tobytes(), 2)


@pytest.mark.parametrize("format_type", sorted(CODECS))
def test_decoding_every_code_matches_audioop(format_type):
    _, decode_reference = CODECS[format_type]
    codes = bytes(range(256))
    reference = np.frombuffer(decode_reference(codes, 2), dtype=np.int16)
    assert np.array_equal(g711.decode(codes, format_type) * 32_768, reference.astype(np.float32))


@pytest.mark.parametrize("format_type", sorted(CODECS))
def test_a_tone_survives_the_round_trip(format_type):
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(8_000) / g711.G711_RATE).astype(np.float32)
    decoded = g711.decode(g711.encode(tone, format_type), format_type)
    snr_db = 10 * np.log10(np.sum(tone**2) / np.sum((tone - decoded) ** 2))
    assert snr_db > 30  # G.711's companding keeps ~38 dB for a loud tone
