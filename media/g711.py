"""G.711 µ-law and A-law (ITU-T G.711): OpenAI's ``audio/pcmu`` and ``audio/pcma``, 8 kHz.

Our own numpy code rather than a library: the standard library's ``audioop`` is deprecated
(removed in Python 3.13) and ``audioop-lts``, its backport, installs only on 3.13+; no other
maintained package does just this. The codec is two table lookups: decoding indexes a
256-entry table, encoding indexes a 65,536-entry table by the 16-bit sample (64 KiB each,
built once from the G.711 segment rules). The tests check both against ``audioop``.
"""

from __future__ import annotations

import numpy as np

G711_RATE = 8_000  # G.711 is narrowband telephony audio

_MULAW_BIAS = 0x84  # 132: shifts the µ-law segments so that each starts at a power of two
_MULAW_CLIP = 8_159


def _mulaw_decode_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + _MULAW_BIAS) << exponent) - _MULAW_BIAS
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


def _mulaw_encode_table() -> np.ndarray:
    # On 14-bit samples, as G.711's reference code (and audioop) does: bias 33, clip 8159.
    samples = np.arange(-32_768, 32_768, dtype=np.int32) >> 2
    mask = np.where(samples < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(samples), _MULAW_CLIP) + (_MULAW_BIAS >> 2)
    segment = np.floor(np.log2(magnitude)).astype(np.int32) - 5  # 0..8; magnitude is 33..8192
    mantissa = (magnitude >> (segment + 1)) & 0x0F
    codes = np.where(segment > 7, 0x7F, (segment << 4) | mantissa)  # past the last segment: its top
    return (codes ^ mask).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    samples = np.arange(-32_768, 32_768, dtype=np.int32)
    sign = np.where(samples >= 0, 0x80, 0)
    magnitude = np.where(samples >= 0, samples, -samples - 1) >> 3  # 13-bit magnitude
    exponent = np.clip(np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 4, 0, 7)
    mantissa = np.where(exponent == 0, magnitude >> 1, magnitude >> exponent) & 0x0F
    return ((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8)


_DECODE = {"audio/pcmu": _mulaw_decode_table(), "audio/pcma": _alaw_decode_table()}
_ENCODE = {"audio/pcmu": _mulaw_encode_table(), "audio/pcma": _alaw_encode_table()}
G711_FORMATS = frozenset(_DECODE)


def decode(data: bytes, format_type: str) -> np.ndarray:
    """G.711 bytes (one sample each) → float32 in [-1, 1) at 8 kHz; ``format_type`` is
    ``audio/pcmu`` or ``audio/pcma``."""
    codes = np.frombuffer(data, dtype=np.uint8)
    return _DECODE[format_type][codes].astype(np.float32) / 32_768.0


def encode(pcm: np.ndarray, format_type: str) -> bytes:
    """float32 8 kHz PCM (clipped to [-1, 1]) → G.711 bytes."""
    samples = np.clip(np.round(np.asarray(pcm, dtype=np.float32) * 32_768.0), -32_768, 32_767).astype(np.int32)
    return _ENCODE[format_type][samples + 32_768].tobytes()
