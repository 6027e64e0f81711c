"""``input_image`` parts (a PNG or JPEG data URL) and pushed camera frames read into conversation images.

OpenAI's Realtime API takes images as ``input_image`` content parts whose ``image_url`` is a
data URL. Reading one decodes the base64, checks the header (``pipeline.images.probe``),
decodes the pixels and fits the image to the pixel budget its ``detail`` asks for
(``DETAIL_MAX_PIXELS``): tens of milliseconds for a large photo, so
:func:`read_item_images` does it in a worker thread. Every problem is a ``ProtocolError``
naming the part; the session answers it with an ``error`` event and goes on. A pushed camera
frame (DashScope's ``input_image_buffer.append``: base64 bytes, no data URL) is read the same way
by :func:`read_frame`, to the session's ``video.max_pixels``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence

from app.realtime.protocol import ClientContentPart, ImageDetail, ProtocolError
from app.realtime.session_config import DETAIL_MAX_PIXELS
from pipeline.conversation import UserImage
from pipeline.images import FORMATS, ImageError, fit, probe

# Images in one message: each costs up to 980 prompt tokens at "high" detail, so eight are a
# prompt of ~8,000 tokens before a word is said.
MAX_IMAGES_PER_ITEM = 8
IMAGE_TOO_LARGE = "image_too_large"
_MIME_TYPES = frozenset(FORMATS.values()) | {"image/jpg"}  # a common misspelling of image/jpeg


async def read_item_images(content: Sequence[ClientContentPart], *, max_bytes: int) -> dict[int, UserImage]:
    """The images of a user message's ``content``, by part index; decoded in a worker thread."""
    indexed = [(index, part) for index, part in enumerate(content) if part.type == "input_image"]
    if not indexed:
        return {}
    if len(indexed) > MAX_IMAGES_PER_ITEM:
        raise ProtocolError(
            "invalid_value", f"A message takes at most {MAX_IMAGES_PER_ITEM} images.", param="item.content"
        )
    return await asyncio.to_thread(_read_all, indexed, max_bytes)


def _read_all(indexed: list[tuple[int, ClientContentPart]], max_bytes: int) -> dict[int, UserImage]:
    return {
        index: read_image(part.image_url, part.detail, max_bytes=max_bytes, param=f"item.content[{index}]")
        for index, part in indexed
    }


def read_frame(image: str, *, max_bytes: int, max_pixels: int, param: str = "image") -> UserImage:
    """A camera frame a client pushed (``input_image_buffer.append``): base64 JPEG or PNG bytes, no
    data URL; checked, decoded and fitted to ``max_pixels`` (the session's ``video`` budget). Blocking."""
    if len(image) // 4 * 3 > max_bytes + 2:  # checked before decoding anything
        raise ProtocolError(IMAGE_TOO_LARGE, f"{param} holds more than {max_bytes} bytes of image.", param=param)
    try:
        data = base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    return _fitted(data, max_pixels, max_bytes=max_bytes, param=param)


def read_image(url: str | None, detail: ImageDetail | None, *, max_bytes: int, param: str) -> UserImage:
    """One ``input_image``: checked, decoded and fitted to its ``detail``'s budget. Blocking."""
    url_param = f"{param}.image_url"
    if url is None:
        raise ProtocolError("missing_required_parameter", f"{url_param} is required.", param=url_param)
    header, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma:
        raise ProtocolError(
            "invalid_value",
            f"{url_param} must be a data URL (data:image/png;base64,... or data:image/jpeg;base64,...); "
            "this server fetches no URLs.",
            param=url_param,
        )
    mime, *parameters = header.removeprefix("data:").split(";")
    if mime.lower() not in _MIME_TYPES or "base64" not in parameters:
        raise ProtocolError(
            "invalid_value",
            f"{url_param} is a data URL of {mime or 'no type'!r}; base64 PNG and JPEG images are taken.",
            param=url_param,
        )
    if len(payload) // 4 * 3 > max_bytes + 2:  # checked before decoding anything
        raise ProtocolError(IMAGE_TOO_LARGE, f"{url_param} holds more than {max_bytes} bytes of image.",
                            param=url_param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{url_param} is not valid base64.", param=url_param) from None
    return _fitted(data, DETAIL_MAX_PIXELS[detail or "auto"], max_bytes=max_bytes, param=url_param)


def _fitted(data: bytes, max_pixels: int, *, max_bytes: int, param: str) -> UserImage:
    if len(data) > max_bytes:
        raise ProtocolError(IMAGE_TOO_LARGE, f"{param} holds more than {max_bytes} bytes of image.", param=param)
    try:
        info = probe(data)
        fitted, width, height = fit(data, info, max_pixels)
    except ImageError as exc:
        raise ProtocolError("invalid_value", f"{param}: {exc}.", param=param) from None
    return UserImage(fitted, width, height, max_pixels)
