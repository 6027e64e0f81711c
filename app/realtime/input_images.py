"""``input_image`` parts (a PNG or JPEG data URL) and pushed camera frames read into conversation images.

OpenAI's Realtime API takes images as ``input_image`` content parts whose ``image_url`` is a
data URL. Reading one decodes the base64, checks the header (``pipeline.images.probe``),
decodes the pixels and fits the image to the pixel budget its ``detail`` asks for
(``DETAIL_MAX_PIXELS``): tens of milliseconds for a large photo, so
:func:`read_item_images` does it in a worker thread. Every problem is a ``ProtocolError``
naming the part; the session answers it with an ``error`` event and goes on. A pushed camera
frame (DashScope's ``input_image_buffer.append``: base64 bytes, no data URL) is read the same way
by :func:`read_frame`, to the session's ``video.max_pixels``.

What decoding may cost is bounded twice (issue 34): one image decodes into at most
``pipeline.images.MAX_DECODE_BYTES`` (checked from its header), and a session's images together
into at most ``DECODE_BYTES_PER_SECOND`` a second (``DecodeBudget``, bursts of four of the
largest): a message whose images would pass it is refused ``rate_limit_exceeded`` before any is
decoded. A session's events are handled one at a time, so it decodes one image at a time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Callable, Sequence

from app.realtime.protocol import ClientContentPart, ImageDetail, ProtocolError
from app.realtime.session_config import DETAIL_MAX_PIXELS
from pipeline.conversation import UserImage
from pipeline.images import FORMATS, MAX_DECODE_BYTES, ImageError, ImageInfo, decode_bytes, fit, probe

# Images in one message: each costs up to 980 prompt tokens at "high" detail, so eight are a
# prompt of ~8,000 tokens before a word is said.
MAX_IMAGES_PER_ITEM = 8
IMAGE_TOO_LARGE = "image_too_large"
_MIME_TYPES = frozenset(FORMATS.values()) | {"image/jpg"}  # a common misspelling of image/jpeg
# A session's image decoding: the largest image's worth every 6 s (a 4K RGBA screenshot every 4 s;
# a 12 MP photo at "high" decodes 3 MP, 12 MB), bursts of four of the largest. On the loaded dev
# box the largest takes 0.4-1.3 s of a core to decode and fit (tests/bench/abuse.py), so a session
# held to this uses at most a fifth of one.
DECODE_BYTES_PER_SECOND = 16 * 1024 * 1024
DECODE_BURST_BYTES = 4 * MAX_DECODE_BYTES


class DecodeBudget:
    """A token bucket of decoding (bytes of pixels decoded), one per session."""

    def __init__(
        self, *, per_second: float = DECODE_BYTES_PER_SECOND, burst: int = DECODE_BURST_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._available = float(burst)
        self._refilled_at = clock()

    def take(self, cost: int) -> bool:
        """Whether ``cost`` may be decoded now (then it is spent)."""
        now = self._clock()
        self._available = min(self.burst, self._available + (now - self._refilled_at) * self.per_second)
        self._refilled_at = now
        if cost > self._available:
            return False
        self._available -= cost
        return True


async def read_item_images(
    content: Sequence[ClientContentPart], *, max_bytes: int, budget: DecodeBudget
) -> dict[int, UserImage]:
    """The images of a user message's ``content``, by part index; decoded in a worker thread,
    once their headers say ``budget`` holds what decoding them takes."""
    indexed = [(index, part) for index, part in enumerate(content) if part.type == "input_image"]
    if not indexed:
        return {}
    if len(indexed) > MAX_IMAGES_PER_ITEM:
        raise ProtocolError(
            "invalid_value", f"A message takes at most {MAX_IMAGES_PER_ITEM} images.", param="item.content"
        )
    return await asyncio.to_thread(_read_all, indexed, max_bytes, budget)


def _read_all(indexed: list[tuple[int, ClientContentPart]], max_bytes: int, budget: DecodeBudget) -> dict[int, UserImage]:
    checked = [(index, *check_image(part.image_url, part.detail, max_bytes=max_bytes, param=f"item.content[{index}]"))
               for index, part in indexed]
    cost = sum(cost for *_, cost in checked)
    if not budget.take(cost):
        raise ProtocolError(
            "rate_limit_exceeded",
            f"This message's images take {cost / 2**20:.0f} MiB to decode; a session decodes at most "
            f"{budget.per_second / 2**20:.0f} MiB a second (bursts of {budget.burst / 2**20:.0f}): it was dropped.",
            param="item.content",
        )
    return {index: fitted(data, info, max_pixels, param=f"item.content[{index}].image_url")
            for index, data, info, max_pixels, _ in checked}


def read_frame(image: str, *, max_bytes: int, max_pixels: int, budget: DecodeBudget, param: str = "image") -> UserImage:
    """A camera frame a client pushed (``input_image_buffer.append``): base64 JPEG or PNG bytes, no
    data URL; checked, decoded and fitted to ``max_pixels`` (the session's ``video`` budget) when
    ``budget`` holds its decoding. Blocking."""
    if len(image) // 4 * 3 > max_bytes + 2:  # checked before decoding anything
        raise ProtocolError(IMAGE_TOO_LARGE, f"{param} holds more than {max_bytes} bytes of image.", param=param)
    try:
        data = base64.b64decode(image, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_value", f"{param} is not valid base64.", param=param) from None
    info, cost = _probed(data, max_pixels, max_bytes=max_bytes, param=param)
    if not budget.take(cost):
        raise ProtocolError(
            "rate_limit_exceeded",
            f"This frame takes {cost / 2**20:.0f} MiB to decode; a session decodes at most "
            f"{budget.per_second / 2**20:.0f} MiB a second (bursts of {budget.burst / 2**20:.0f}): it was dropped.",
            param=param,
        )
    return fitted(data, info, max_pixels, param=param)


def check_image(
    url: str | None, detail: ImageDetail | None, *, max_bytes: int, param: str
) -> tuple[bytes, ImageInfo, int, int]:
    """One ``input_image`` checked from its data URL and header, nothing decoded: its bytes, its
    header's facts, its ``detail``'s pixel budget and the memory decoding it takes. Blocking (base64)."""
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
    max_pixels = DETAIL_MAX_PIXELS[detail or "auto"]
    info, cost = _probed(data, max_pixels, max_bytes=max_bytes, param=url_param)
    return data, info, max_pixels, cost


def _probed(data: bytes, max_pixels: int, *, max_bytes: int, param: str) -> tuple[ImageInfo, int]:
    """An image's header facts and the memory decoding it to ``max_pixels`` takes, nothing decoded."""
    if len(data) > max_bytes:
        raise ProtocolError(IMAGE_TOO_LARGE, f"{param} holds more than {max_bytes} bytes of image.", param=param)
    try:
        info = probe(data)
        cost = decode_bytes(data, info, max_pixels)
    except ImageError as exc:
        raise ProtocolError("invalid_value", f"{param}: {exc}.", param=param) from None
    if cost > MAX_DECODE_BYTES:
        why = f"decoding it takes more than {MAX_DECODE_BYTES // 2**20} MiB (a JPEG of it, or a smaller one, is taken)"
        raise ProtocolError("invalid_value", f"{param}: the image is {info.width}x{info.height}; {why}.", param=param)
    return info, cost


def fitted(data: bytes, info: ImageInfo, max_pixels: int, *, param: str) -> UserImage:
    """A checked image decoded and fitted to ``max_pixels`` (``param`` names it in errors). Blocking."""
    try:
        fitted_data, width, height = fit(data, info, max_pixels)
    except ImageError as exc:
        raise ProtocolError("invalid_value", f"{param}: {exc}.", param=param) from None
    return UserImage(fitted_data, width, height, max_pixels)
