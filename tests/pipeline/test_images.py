"""Images before the Thinker: token counts as Qwen's processor sizes them, checks, fitting."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from pipeline.images import MAX_DECODE_BYTES, ImageError, decode_bytes, fit, fitted_size, image_tokens, probe
from tests.hostile import flat_png
from tests.pictures import encoded

DETAIL_HIGH = 1_003_520


@given(
    width=st.integers(1, 5000),
    height=st.integers(1, 5000),
    max_pixels=st.sampled_from([3_136, 50_176, 200_704, 1_003_520, 12_845_056]),
)
def test_fitted_size_is_qwens_smart_resize(width, height, max_pixels):
    if max(width, height) / min(width, height) > 200:
        with pytest.raises(ValueError):
            fitted_size(width, height, max_pixels=max_pixels)
        return
    fitted_h, fitted_w = smart_resize(height, width, factor=32, min_pixels=3_136, max_pixels=max_pixels)
    assert fitted_size(width, height, max_pixels=max_pixels) == (fitted_w, fitted_h)


def test_a_224_pixel_square_is_49_tokens():
    assert image_tokens(224, 224, max_pixels=1_003_520) == 49


def test_probe_reads_format_and_size_from_the_header():
    info = probe(encoded(64, 48, format="PNG"))
    assert (info.format, info.width, info.height) == ("PNG", 64, 48)


@pytest.mark.parametrize(
    "data, why",
    [
        (b"hello, world", "not a PNG or JPEG"),
        (encoded(32, 32, format="GIF"), "GIF"),
        (encoded(1, 300, format="PNG"), "differ more than 200-fold"),
    ],
)
def test_probe_refuses_what_is_not_a_png_or_jpeg_image(data, why):
    with pytest.raises(ImageError, match=why):
        probe(data)


def test_fit_shrinks_a_large_image_to_its_budget_as_jpeg():
    data = encoded(1600, 1200, format="PNG")
    fitted, width, height = fit(data, probe(data), max_pixels=200_704)
    assert (width, height) == fitted_size(1600, 1200, max_pixels=200_704) == (512, 384)
    info = probe(fitted)
    assert (info.format, info.width, info.height) == ("JPEG", 512, 384)


def test_fit_keeps_an_image_within_its_budget_as_it_was_sent():
    data = encoded(320, 240)
    assert fit(data, probe(data), max_pixels=200_704) == (data, 320, 240)


def test_fit_refuses_a_truncated_image():
    data = encoded(320, 240, format="PNG")
    with pytest.raises(ImageError, match="could not be decoded"):
        fit(data[: len(data) // 2], probe(data), max_pixels=200_704)


def test_a_50_mp_rgba_png_is_refused_from_its_header_before_a_pixel_is_decoded():
    # A 194 KB PNG that decodes to 200 MB (+415 MB and 2.7 s converted whole) is refused from its header.
    data = flat_png(7071, 7071)
    info = probe(data)  # within the header's 50 MP
    assert decode_bytes(data, info, DETAIL_HIGH) > MAX_DECODE_BYTES
    with pytest.raises(ImageError, match="decoding it takes more than 96 MiB"):
        fit(data, info, max_pixels=DETAIL_HIGH)


def test_a_large_jpeg_is_charged_at_the_scale_it_is_decoded():
    photo = io.BytesIO()
    Image.new("RGB", (4000, 3000), (90, 120, 150)).save(photo, format="JPEG")
    data = photo.getvalue()
    info = probe(data)
    assert decode_bytes(data, info, 100_352) == 500 * 375 * 4  # drafted to 1/8 for "low"
    assert decode_bytes(data, info, DETAIL_HIGH) == 2000 * 1500 * 4  # 1/2 for "high" (1,152 x 864)
    assert fit(data, info, max_pixels=DETAIL_HIGH)[1:] == fitted_size(4000, 3000, max_pixels=DETAIL_HIGH)


def test_an_rgba_png_within_the_bound_is_fitted_as_rgb():
    data = flat_png(1200, 900)
    fitted, width, height = fit(data, probe(data), max_pixels=100_352)
    assert probe(fitted).format == "JPEG" and (width, height) == fitted_size(1200, 900, max_pixels=100_352)
    assert decode_bytes(data, probe(data), 100_352) == 1200 * 900 * 8  # decoded RGBA and its RGB copy
