"""The aiortc versions whose private parts omni-rtc's data-channel guard and video gate were read in.

``app.webrtc.sctp_guard`` and ``media.video_gate`` stand in for private parts of aiortc (as
``media.receiver_tap`` does, with its own check and its own way out). Another version is refused
with a message that names the part, rather than poked blindly; pyproject.toml pins the same range.
"""

from __future__ import annotations

import aiortc

TESTED_AIORTC = ((1, 16), (1, 16))  # first and last minor versions read


class UnsupportedAiortc(RuntimeError):
    """This aiortc is not one the part was read against."""


def check_aiortc(part: str, version: str = aiortc.__version__) -> None:
    """Raises :class:`UnsupportedAiortc` naming ``part`` (the module that reads aiortc's private
    names) unless ``version`` is one of ``TESTED_AIORTC``."""
    try:
        major_minor = tuple(int(piece) for piece in version.split(".")[:2])
    except ValueError:
        major_minor = ()
    if not TESTED_AIORTC[0] <= major_minor <= TESTED_AIORTC[1]:
        first, last = (".".join(map(str, v)) for v in TESTED_AIORTC)
        raise UnsupportedAiortc(
            f"aiortc {version} is installed; {part} stands in for private parts of aiortc read in "
            f"{first} to {last} only. Install one of those"
        )
