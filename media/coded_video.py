"""What a coded video frame says before it is decoded: whether it is a key frame, and its size.

A decoder allocates whatever size the stream declares (VP8 up to 16383x16383, H.264 more), and
the size can change only at a key frame; reading it from the frame's first bytes lets the
receiver refuse a huge frame before any pixel exists (``media.video_gate``). Read from:

- VP8 (RFC 6386 §9.1): the 3-byte frame tag (bit 0 clear: a key frame), then for a key frame the
  start code ``9d 01 2a`` and two 16-bit little-endian fields whose low 14 bits are the width and
  the height (the top 2 bits are a display upscaling hint, not decoded pixels).
- H.264 (ITU-T H.264 §7.3.2.1.1): aiortc hands an Annex B byte stream (start codes before each
  NAL unit). A key frame holds an IDR slice (NAL type 5); the size is in the sequence parameter
  set (NAL type 7): macroblocks across and down, the field flag, and the frame cropping. A
  cropping of a macroblock or more, which no encoder's alignment needs, is not believed: the
  decoder allocates the coded size, so that is the size then (a small picture cropped out of a
  huge one would otherwise pass).

Malformed headers raise nothing: they read as a key frame of unknown size (refused by the gate),
or, for H.264, as no parameter set.
"""

from __future__ import annotations

from dataclasses import dataclass

VP8_START_CODE = b"\x9d\x01\x2a"
H264_IDR = 5
H264_SPS = 7
# profile_idc values whose SPS carries chroma format, bit depths and scaling matrices (§7.3.2.1.1).
_H264_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
_MACROBLOCK = 16
_MAX_EXP_GOLOMB_ZEROS = 31  # a ue(v) field of a well-formed SPS fits in 32 bits


@dataclass(frozen=True)
class CodedFrame:
    """What a coded frame declares: ``key`` (it starts a picture anew); ``size`` (width, height) as
    declared by it: for VP8 a key frame's header, for H.264 the largest SPS it carries; None when
    it declares none (or it could not be read)."""

    key: bool
    size: tuple[int, int] | None


def read_coded_frame(codec: str, data: bytes) -> CodedFrame:
    """``data`` (one depacketized frame of ``codec``, "VP8" or "H264") read without decoding it."""
    if codec.upper() == "VP8":
        return _vp8(data)
    if codec.upper() == "H264":
        return _h264(data)
    raise ValueError(f"no header reader for {codec}")


def _vp8(data: bytes) -> CodedFrame:
    if not data:
        return CodedFrame(key=False, size=None)
    if data[0] & 0x01:
        return CodedFrame(key=False, size=None)  # an inter frame: the size of the last key frame
    if len(data) < 10 or data[3:6] != VP8_START_CODE:
        return CodedFrame(key=True, size=None)
    width = int.from_bytes(data[6:8], "little") & 0x3FFF
    height = int.from_bytes(data[8:10], "little") & 0x3FFF
    return CodedFrame(key=True, size=(width, height))


def _h264(data: bytes) -> CodedFrame:
    key = False
    sizes: list[tuple[int, int]] = []
    for nal in nal_units(data):
        kind = nal[0] & 0x1F
        if kind == H264_IDR:
            key = True
        elif kind == H264_SPS:
            try:
                sizes.append(h264_sps_size(nal))
            except ValueError:
                return CodedFrame(key=True, size=None)  # a parameter set no size can be read from
    if not sizes:
        return CodedFrame(key=key, size=None)
    return CodedFrame(key=key, size=max(sizes, key=lambda size: size[0] * size[1]))


def nal_units(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte stream (each after a ``00 00 01`` or ``00 00 00 01``)."""
    starts: list[int] = []
    at = data.find(b"\x00\x00\x01")
    while at >= 0:
        starts.append(at + 3)
        at = data.find(b"\x00\x00\x01", at + 3)
    units = []
    for n, start in enumerate(starts):
        end = starts[n + 1] - 3 if n + 1 < len(starts) else len(data)
        unit = data[start:end].rstrip(b"\x00") if n + 1 < len(starts) else data[start:end]
        if unit:
            units.append(unit)
    return units


class _Bits:
    """An RBSP read bit by bit, MSB first; past its end raises ``ValueError``."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def bit(self) -> int:
        byte, offset = divmod(self._at, 8)
        if byte >= len(self._data):
            raise ValueError("the parameter set ends early")
        self._at += 1
        return (self._data[byte] >> (7 - offset)) & 1

    def bits(self, count: int) -> int:
        value = 0
        for _ in range(count):
            value = value << 1 | self.bit()
        return value

    def ue(self) -> int:
        zeros = 0
        while not self.bit():
            zeros += 1
            if zeros > _MAX_EXP_GOLOMB_ZEROS:
                raise ValueError("an Exp-Golomb field longer than 32 bits")
        return (1 << zeros) - 1 + self.bits(zeros)

    def se(self) -> int:
        code = self.ue()
        return (code + 1) // 2 if code % 2 else -(code // 2)


def _rbsp(nal: bytes) -> bytes:
    """The NAL unit's payload without its header byte and its emulation prevention bytes (§7.4.1)."""
    out = bytearray()
    zeros = 0
    for byte in nal[1:]:
        if zeros >= 2 and byte == 0x03:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def h264_sps_size(nal: bytes) -> tuple[int, int]:
    """The picture size a sequence parameter set NAL unit declares (see the module docstring)."""
    bits = _Bits(_rbsp(nal))
    profile = bits.bits(8)
    bits.bits(16)  # constraint flags, level
    bits.ue()  # seq_parameter_set_id
    chroma_format = 1
    separate_planes = 0
    if profile in _H264_HIGH_PROFILES:
        chroma_format = bits.ue()
        if chroma_format == 3:
            separate_planes = bits.bit()
        bits.ue()  # bit_depth_luma_minus8
        bits.ue()  # bit_depth_chroma_minus8
        bits.bit()  # qpprime_y_zero_transform_bypass_flag
        if bits.bit():  # seq_scaling_matrix_present_flag
            for index in range(8 if chroma_format != 3 else 12):
                if bits.bit():
                    _skip_scaling_list(bits, 16 if index < 6 else 64)
    bits.ue()  # log2_max_frame_num_minus4
    order_type = bits.ue()
    if order_type == 0:
        bits.ue()  # log2_max_pic_order_cnt_lsb_minus4
    elif order_type == 1:
        bits.bit()  # delta_pic_order_always_zero_flag
        bits.se()  # offset_for_non_ref_pic
        bits.se()  # offset_for_top_to_bottom_field
        for _ in range(bits.ue()):  # num_ref_frames_in_pic_order_cnt_cycle
            bits.se()
    bits.ue()  # max_num_ref_frames
    bits.bit()  # gaps_in_frame_num_value_allowed_flag
    width_mbs = bits.ue() + 1
    height_units = bits.ue() + 1
    frame_mbs_only = bits.bit()
    if not frame_mbs_only:
        bits.bit()  # mb_adaptive_frame_field_flag
    bits.bit()  # direct_8x8_inference_flag
    width = width_mbs * _MACROBLOCK
    height = (2 - frame_mbs_only) * height_units * _MACROBLOCK
    if bits.bit():  # frame_cropping_flag
        left, right, top, bottom = bits.ue(), bits.ue(), bits.ue(), bits.ue()
        if separate_planes or chroma_format == 0:
            unit_x, unit_y = 1, 2 - frame_mbs_only
        else:
            unit_x = 2 if chroma_format in (1, 2) else 1
            unit_y = (2 if chroma_format == 1 else 1) * (2 - frame_mbs_only)
        crop_x, crop_y = (left + right) * unit_x, (top + bottom) * unit_y
        if crop_x < _MACROBLOCK and crop_y < _MACROBLOCK * (2 - frame_mbs_only):
            width, height = width - crop_x, height - crop_y
    return width, height


def _skip_scaling_list(bits: _Bits, size: int) -> None:
    last = following = 8
    for _ in range(size):
        if following:
            following = (last + bits.se() + 256) % 256
        last = following or last
