"""libopus through ctypes: the decoder calls a jitter buffer needs, and an encoder whose FEC follows loss.

PyAV (FFmpeg) wraps libopus too, but neither of its codecs reaches what a lossy network needs:
FFmpeg's Opus decoders have no way to decode a packet's in-band FEC (``opus_decode`` with
``decode_fec=1``) or to ask for packet loss concealment (``opus_decode`` with no packet), and its
encoder fixes the expected loss (``packet_loss``) when it is opened. Debian's ``libopus0``
(scripts/system-deps.sh) is the library; these are the few functions of its stable API
(opus_defines.h, opus.h of libopus 1.3) that the project calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

# opus_defines.h
OPUS_APPLICATION_VOIP = 2048
OPUS_SET_BITRATE_REQUEST = 4002
OPUS_SET_INBAND_FEC_REQUEST = 4012
OPUS_SET_PACKET_LOSS_PERC_REQUEST = 4014
# 120 ms at 48 kHz: the longest packet Opus allows; one decode never returns more.
MAX_FRAME_SAMPLES = 5760
# RFC 6716 s. 3.2.1: a packet is at most 1275 bytes per frame; 4000 is libopus' recommended buffer.
MAX_PACKET_BYTES = 4000


class OpusError(RuntimeError):
    """libopus returned an error code; ``code`` is it, the message is libopus' own (opus_strerror)."""

    def __init__(self, call: str, code: int) -> None:
        self.code = code
        super().__init__(f"{call}: {_lib().opus_strerror(code).decode()} ({code})")


class OpusDecoder:
    """One mono 48 kHz decoder state; feed it a stream's packets in order, gaps filled by the two
    concealment calls (``decode_fec`` from the next packet, else ``conceal``)."""

    def __init__(self, rate: int = 48_000) -> None:
        lib = _lib()
        error = ctypes.c_int()
        self._rate = rate
        self._state = lib.opus_decoder_create(rate, 1, ctypes.byref(error))
        if error.value != 0 or not self._state:
            raise OpusError("opus_decoder_create", error.value)
        self._pcm = np.zeros(MAX_FRAME_SAMPLES, dtype=np.int16)

    def decode(self, packet: bytes) -> np.ndarray:
        """The packet's audio, int16 mono (a stereo packet is downmixed by libopus)."""
        if not packet:
            raise ValueError("an empty packet has no audio; call conceal() for a missing one")
        return self._run(packet, MAX_FRAME_SAMPLES, fec=False)

    def decode_fec(self, next_packet: bytes, samples: int) -> np.ndarray:
        """The ``samples`` just before ``next_packet``, from its in-band FEC (LBRR) data.

        libopus conceals instead (as ``conceal``) when the packet carries none.
        """
        return self._run(next_packet, samples, fec=True)

    def conceal(self, samples: int) -> np.ndarray:
        """``samples`` of packet loss concealment following what was decoded last."""
        return self._run(None, samples, fec=False)

    def packet_samples(self, packet: bytes) -> int:
        """Samples per channel in ``packet`` at this decoder's rate; ``OpusError`` for a malformed one."""
        count = _lib().opus_packet_get_nb_samples(packet, len(packet), self._rate)
        if count < 0:
            raise OpusError("opus_packet_get_nb_samples", count)
        return int(count)

    def close(self) -> None:
        """Frees the state; safe twice."""
        if self._state:
            _lib().opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()

    def _run(self, packet: bytes | None, samples: int, *, fec: bool) -> np.ndarray:
        if not self._state:
            raise RuntimeError("the decoder is closed")
        if not 0 < samples <= MAX_FRAME_SAMPLES:
            raise ValueError(f"samples must be 1..{MAX_FRAME_SAMPLES}, got {samples}")
        pcm = self._pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_int16))
        count = _lib().opus_decode(self._state, packet, len(packet) if packet else 0, pcm, samples, int(fec))
        if count < 0:
            raise OpusError("opus_decode", count)
        return self._pcm[:count].copy()


class OpusEncoder:
    """One mono 48 kHz VoIP encoder; in-band FEC on, its strength following ``set_expected_loss``.

    libopus adds FEC (SILK's low-bitrate redundancy of the previous frame) only while the expected
    loss is above 0 %, and spends more of the bitrate on it the higher the loss.
    """

    def __init__(self, *, bitrate: int, rate: int = 48_000) -> None:
        lib = _lib()
        error = ctypes.c_int()
        self._state = lib.opus_encoder_create(rate, 1, OPUS_APPLICATION_VOIP, ctypes.byref(error))
        if error.value != 0 or not self._state:
            raise OpusError("opus_encoder_create", error.value)
        self._packet = ctypes.create_string_buffer(MAX_PACKET_BYTES)
        self._ctl(OPUS_SET_BITRATE_REQUEST, bitrate)
        self._ctl(OPUS_SET_INBAND_FEC_REQUEST, 1)
        self.expected_loss_percent = 0

    def set_expected_loss(self, percent: int) -> None:
        """The share of packets the peer loses (its RTCP receiver reports), 0-100."""
        percent = min(max(int(percent), 0), 100)
        if percent != self.expected_loss_percent:
            self._ctl(OPUS_SET_PACKET_LOSS_PERC_REQUEST, percent)
            self.expected_loss_percent = percent

    def encode(self, pcm16: np.ndarray) -> bytes:
        """One packet from one frame of int16 mono samples (2.5-60 ms: 20 ms is 960 samples)."""
        if not self._state:
            raise RuntimeError("the encoder is closed")
        samples = np.ascontiguousarray(pcm16, dtype=np.int16)
        pcm = samples.ctypes.data_as(ctypes.POINTER(ctypes.c_int16))
        size = _lib().opus_encode(self._state, pcm, samples.size, self._packet, MAX_PACKET_BYTES)
        if size < 0:
            raise OpusError("opus_encode", size)
        return self._packet.raw[:size]

    def close(self) -> None:
        """Frees the state; safe twice."""
        if self._state:
            _lib().opus_encoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()

    def _ctl(self, request: int, value: int) -> None:
        # opus_encoder_ctl is variadic; every request used here takes one opus_int32.
        result = _lib().opus_encoder_ctl(ctypes.c_void_p(self._state), ctypes.c_int(request), ctypes.c_int32(value))
        if result != 0:
            raise OpusError(f"opus_encoder_ctl({request})", result)


def carries_fec(packet: bytes) -> bool:
    """Whether ``packet`` holds in-band FEC (LBRR) for the packet before it.

    Only SILK and hybrid packets can (TOC configurations 0-15, RFC 6716 s. 3.1). Their SILK layer
    starts with one range-coded bit per channel and 20 ms frame — its voice activity flags — then
    the LBRR flag (s. 4.2.3), each coded with probability 1/2, which makes them the leading bits
    of the range coder's first byte. Read for single-frame packets (code 0) only, as browsers
    send them; any other packet is said to carry none (it is then concealed, not recovered).
    """
    if len(packet) < 2:
        return False
    toc = packet[0]
    config = toc >> 3
    if config >= 16 or toc & 0x3 != 0:  # CELT-only, or several frames in the packet
        return False
    silk_frames = 1 if config >= 12 else (1, 1, 2, 3)[config & 0x3]  # hybrid is 10 or 20 ms; SILK 10-60 ms
    # Per channel: silk_frames VAD bits, then its LBRR bit; the mid channel comes first.
    return bool(packet[1] & (0x80 >> silk_frames))


@functools.cache
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("opus") or "libopus.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise OSError(
            f"libopus is missing ({exc}); install Debian's libopus0 (scripts/system-deps.sh does)"
        ) from exc
    c_int, c_int32, pointer = ctypes.c_int, ctypes.c_int32, ctypes.c_void_p
    lib.opus_strerror.argtypes, lib.opus_strerror.restype = [c_int], ctypes.c_char_p
    lib.opus_decoder_create.argtypes = [c_int32, c_int, ctypes.POINTER(c_int)]
    lib.opus_decoder_create.restype = pointer
    lib.opus_decoder_destroy.argtypes, lib.opus_decoder_destroy.restype = [pointer], None
    lib.opus_decode.argtypes = [pointer, ctypes.c_char_p, c_int32, ctypes.POINTER(ctypes.c_int16), c_int, c_int]
    lib.opus_decode.restype = c_int
    lib.opus_packet_get_nb_samples.argtypes = [ctypes.c_char_p, c_int32, c_int32]
    lib.opus_packet_get_nb_samples.restype = c_int
    lib.opus_encoder_create.argtypes = [c_int32, c_int, c_int, ctypes.POINTER(c_int)]
    lib.opus_encoder_create.restype = pointer
    lib.opus_encoder_destroy.argtypes, lib.opus_encoder_destroy.restype = [pointer], None
    lib.opus_encode.argtypes = [pointer, ctypes.POINTER(ctypes.c_int16), c_int, ctypes.c_char_p, c_int32]
    lib.opus_encode.restype = c_int32
    lib.opus_encoder_ctl.restype = c_int  # variadic: no argtypes
    return lib
