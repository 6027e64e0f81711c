"""Key frames and their sizes read from coded frames as libvpx and libx264 make them, undecoded."""

from __future__ import annotations

import pytest

from media.coded_video import CodedFrame, h264_sps_size, nal_units, read_coded_frame
from tests import hostile_video


@pytest.mark.parametrize(("width", "height"), [(64, 48), (1921, 1081)])
def test_a_vp8_key_frame_declares_its_size_and_inter_frames_none(width: int, height: int):
    key, *inter = hostile_video.coded_frames("libvpx", width, height, count=3)
    assert read_coded_frame("VP8", key) == CodedFrame(key=True, size=(width, height))
    assert [read_coded_frame("VP8", frame) for frame in inter] == [CodedFrame(key=False, size=None)] * len(inter)


@pytest.mark.parametrize(
    ("width", "height", "x264"),
    [
        (1920, 1080, {}),  # coded as 1920x1088, cropped
        (176, 144, {"profile": "baseline"}),
        (1080, 1920, {"cqm": "jvt"}),  # high profile with scaling matrices in the SPS
        (320, 240, {"x264-params": "interlaced=1"}),  # field coding: map units of two macroblock rows
    ],
)
def test_an_h264_idr_frame_declares_the_size_of_its_sequence_parameter_set(
    width: int, height: int, x264: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(hostile_video._FAST, "libx264", {"preset": "ultrafast", **x264})
    key, *inter = hostile_video.coded_frames.__wrapped__("libx264", width, height, 3)
    assert read_coded_frame("H264", key) == CodedFrame(key=True, size=(width, height))
    assert {read_coded_frame("H264", frame).key for frame in inter} == {False}


def test_a_picture_cropped_out_of_a_larger_one_declares_the_larger(monkeypatch: pytest.MonkeyPatch):
    """FFmpeg decodes this as 320x320 but allocates 1920x1920: the bound is on what it allocates."""
    monkeypatch.setitem(hostile_video._FAST, "libx264", {"preset": "ultrafast", "x264-params": "crop-rect=0,0,1600,1600"})
    key = hostile_video.coded_frames.__wrapped__("libx264", 1920, 1920, 1)[0]
    assert read_coded_frame("H264", key).size == (1920, 1920)


def test_a_vp8_key_frame_without_its_start_code_is_a_key_frame_of_no_size():
    key = hostile_video.coded_frames("libvpx", 64, 48)[0]
    assert read_coded_frame("VP8", key[:3] + b"\x00\x00\x00" + key[6:]) == CodedFrame(key=True, size=None)
    assert read_coded_frame("VP8", key[:8]) == CodedFrame(key=True, size=None)


def test_a_truncated_sequence_parameter_set_is_a_key_frame_of_no_size():
    key = hostile_video.coded_frames("libx264", 176, 144)[0]
    sps = next(unit for unit in nal_units(key) if unit[0] & 0x1F == 7)
    assert read_coded_frame("H264", b"\x00\x00\x00\x01" + sps[:5]) == CodedFrame(key=True, size=None)
    with pytest.raises(ValueError):
        h264_sps_size(sps[:5])


def test_nal_units_are_split_at_three_and_four_byte_start_codes():
    assert nal_units(b"\x00\x00\x00\x01\x67\xaa\x00\x00\x01\x68\xbb\x00\x00\x00\x01\x65\xcc") == [
        b"\x67\xaa", b"\x68\xbb", b"\x65\xcc",
    ]
