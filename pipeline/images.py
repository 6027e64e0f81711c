"""Images for the Thinker: what one costs in prompt tokens, how it is checked, and how it is fitted
to a pixel budget before it is kept.

Qwen3-Omni's vision tower cuts an image into 16x16 patches and merges 2x2 of them into one
token, so one ``<|image_pad|>`` stands for 32x32 pixels. Its image processor
(``Qwen2VLImageProcessorPil``, Qwen's ``smart_resize``) first resizes the image so that both
sides are multiples of 32 and its area lies within ``[min_pixels, max_pixels]``, keeping the
aspect ratio. ``fitted_size`` is that rule (tests/pipeline/test_images.py checks it against
transformers' own ``smart_resize``): written here because importing transformers' image module
pulls in torch (seconds, hundreds of MB), which media workers and the session never load.

Images are kept already fitted (``fit``): an upload of 10 MB becomes a few hundred KB at its
pixel budget, so the history holds little, the engine process receives little, and the
processor's own resize there is the identity.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

# Qwen3-Omni's vision config (patch_size 16, spatial_merge_size 2): pixels per side of one token.
PIXELS_PER_TOKEN_SIDE = 32
# The checkpoint's preprocessor_config.json min_pixels (56 * 56): smaller images are enlarged.
MIN_PIXELS = 3_136
# What the image processor accepts (its "absolute aspect ratio must be smaller than 200").
MAX_ASPECT_RATIO = 200
# The most pixels an input image may have (a phone photo has 12-50 MP), read from its header.
MAX_SOURCE_PIXELS = 50_000_000
# The most memory ``fit`` decodes into at once: the pixels of a PNG at its full size, or of a
# JPEG at the scale ``draft`` decodes it (1/2, 1/4 or 1/8 when that still covers its budget: a
# 50 MP photo at "high" detail decodes 3 MP), with the full-size copy the resize works on.
# Pillow holds 4 bytes a pixel for RGB; RGB and grayscale are resized as decoded, any other mode
# (RGBA, palette, 1-bit, 16-bit) is converted to RGB first, a full-size copy, as it always was
# (the vision tower takes RGB; ``_WORKING_BYTES_PER_PIXEL``). 96 MiB
# takes a 12 MP RGBA PNG (a 4K screenshot is 8.3 MP), 24 MP of RGB. A 212 KB, 50 MP RGBA PNG
# decoded whole and converted costs +415 MB and 2.7 s, so it is refused from its header
# (tests/bench/abuse.py has the figures).
MAX_DECODE_BYTES = 96 * 1024 * 1024
_WORKING_BYTES_PER_PIXEL = {"L": 1, "RGB": 4, "RGBA": 8, "LA": 8, "P": 5, "1": 5, "I;16": 6}
_MOST_BYTES_PER_PIXEL = 8  # any other mode: 4 decoded, 4 as RGB
# Modes resized as decoded (per channel, so a grayscale image resized then made RGB is the RGB
# one resized); others are converted to RGB first.
_RESIZED_AS_DECODED = frozenset({"RGB", "L"})
# Formats taken as input: OpenAI's input_image takes PNG and JPEG data URLs.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg"}
# Images are re-encoded only when fitting shrinks them; JPEG at this quality is visually lossless
# for the vision tower (a 512x384 camera frame is ~40 KB instead of ~600 KB as RGB).
JPEG_QUALITY = 90


class ImageError(ValueError):
    """The bytes are not an image this server takes; the message says why, for the client."""


@dataclass(frozen=True)
class ImageInfo:
    format: str  # "PNG" or "JPEG"
    width: int
    height: int


def fitted_size(
    width: int, height: int, *, max_pixels: int, min_pixels: int = MIN_PIXELS, factor: int = PIXELS_PER_TOKEN_SIDE
) -> tuple[int, int]:
    """(width, height) the image processor resizes a ``width`` x ``height`` image to (Qwen's
    ``smart_resize``): both multiples of ``factor``, the area within the bounds, the aspect kept."""
    if width < 1 or height < 1:
        raise ValueError(f"an image has at least one pixel per side, got {width}x{height}")
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio over {MAX_ASPECT_RATIO}: {width}x{height}")
    fitted_h = round(height / factor) * factor
    fitted_w = round(width / factor) * factor
    if fitted_h * fitted_w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        fitted_h = max(factor, math.floor(height / beta / factor) * factor)
        fitted_w = max(factor, math.floor(width / beta / factor) * factor)
    elif fitted_h * fitted_w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        fitted_h = math.ceil(height * beta / factor) * factor
        fitted_w = math.ceil(width * beta / factor) * factor
    return fitted_w, fitted_h


def image_tokens(width: int, height: int, max_pixels: int) -> int:
    """``<|image_pad|>`` tokens a ``width`` x ``height`` image takes at the ``max_pixels`` budget."""
    fitted_w, fitted_h = fitted_size(width, height, max_pixels=max_pixels)
    return (fitted_w // PIXELS_PER_TOKEN_SIDE) * (fitted_h // PIXELS_PER_TOKEN_SIDE)


def probe(data: bytes) -> ImageInfo:
    """Format and size from the header only (no pixels decoded); ``ImageError`` when it is not a
    PNG or JPEG image."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            info = ImageInfo(image.format or "", image.width, image.height)
    except Image.DecompressionBombError as exc:
        raise ImageError(f"the image has more than {MAX_SOURCE_PIXELS:,} pixels") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:  # Pillow's plugins raise all four
        raise ImageError("the data is not a PNG or JPEG image") from exc
    if info.format not in FORMATS:
        raise ImageError(f"the image is {info.format or 'of an unknown format'}; PNG and JPEG are taken")
    if info.width * info.height > MAX_SOURCE_PIXELS:
        raise ImageError(f"the image is {info.width}x{info.height}: more than {MAX_SOURCE_PIXELS:,} pixels")
    if max(info.width, info.height) / min(info.width, info.height) > MAX_ASPECT_RATIO:
        raise ImageError(f"the image is {info.width}x{info.height}: sides differ more than {MAX_ASPECT_RATIO}-fold")
    return info


def decode_bytes(data: bytes, info: ImageInfo, max_pixels: int) -> int:
    """The memory ``fit`` decodes this image into at ``max_pixels`` (from its header: a JPEG's
    ``draft`` scale is chosen without decoding)."""
    with Image.open(io.BytesIO(data)) as image:
        _draft(image, info, max_pixels)
        return _working_bytes(image)


def fit(data: bytes, info: ImageInfo, max_pixels: int) -> tuple[bytes, int, int]:
    """The image at the size the processor takes it to under ``max_pixels``: (encoded bytes, width,
    height). The bytes are kept as they are when the image is that size already or smaller (the
    processor enlarges small images itself: storing them larger gains no detail); else the image
    is resized (bicubic, as the processor does) and stored as JPEG. Always decodes the pixels, so
    that a truncated or corrupt file is refused here and not in the engine: call it off the event
    loop. One that would decode into more than ``MAX_DECODE_BYTES`` is refused unread."""
    width, height = fitted_size(info.width, info.height, max_pixels=max_pixels)
    shrink = width * height < info.width * info.height
    try:
        with Image.open(io.BytesIO(data)) as image:
            _draft(image, info, max_pixels)
            if _working_bytes(image) > MAX_DECODE_BYTES:
                raise ImageError(
                    f"the image is {info.width}x{info.height} ({image.mode}): decoding it takes more than "
                    f"{MAX_DECODE_BYTES // 2**20} MiB (a JPEG of it, or a smaller one, is taken)"
                )
            image.load()
            if not shrink:
                return data, info.width, info.height
            decoded = image if image.mode in _RESIZED_AS_DECODED else image.convert("RGB")
            rgb = decoded.resize((width, height), Image.Resampling.BICUBIC).convert("RGB")
    except ImageError:
        raise
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageError("the image could not be decoded") from exc
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue(), width, height


def _draft(image: Image.Image, info: ImageInfo, max_pixels: int) -> None:
    """A JPEG that shrinks is decoded at 1/2, 1/4 or 1/8 scale when that suffices (its size and
    mode change before a pixel is decoded)."""
    width, height = fitted_size(info.width, info.height, max_pixels=max_pixels)
    if image.format == "JPEG" and width * height < info.width * info.height:
        image.draft("RGB", (width, height))


def _working_bytes(image: Image.Image) -> int:
    return image.width * image.height * _WORKING_BYTES_PER_PIXEL.get(image.mode, _MOST_BYTES_PER_PIXEL)


def decode_rgb(data: bytes) -> Image.Image:
    """The image's pixels as RGB (the engine process, rendering a prompt)."""
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")
