"""The aiortc versions whose private parts omni-rtc's data-channel guard and video gate were read in.

``app.transports.webrtc.sctp_guard``, ``media.video_gate`` and ``media.receiver_tap`` stand in for private
parts of aiortc. Another version is refused with a message that names the part (and the way out,
where there is one), rather than poked blindly; pyproject.toml pins the same range.
"""

from __future__ import annotations

import aiortc

TESTED_AIORTC = ((1, 16), (1, 16))  # first and last minor versions read


class UnsupportedAiortc(RuntimeError):
    """This aiortc is not one the part was read against."""


def check_aiortc(part: str, version: str = aiortc.__version__, *, way_out: str | None = None) -> None:
    """Raises :class:`UnsupportedAiortc` naming ``part`` (the module that reads aiortc's private
    names), and ``way_out`` (a setting that does without it) when there is one, unless ``version``
    is one of ``TESTED_AIORTC``."""
    try:
        major_minor = tuple(int(piece) for piece in version.split(".")[:2])
    except ValueError:
        major_minor = ()
    if not TESTED_AIORTC[0] <= major_minor <= TESTED_AIORTC[1]:
        first, last = (".".join(map(str, v)) for v in TESTED_AIORTC)
        raise UnsupportedAiortc(
            f"aiortc {version} is installed; {part} stands in for private parts of aiortc read in "
            f"{first} to {last} only. Install one of those" + ("" if way_out is None else f", or {way_out}")
        )
