"""SDP text edits aiortc has no option for.

``useinbandfec=1`` on Opus (RFC 7587 s. 6.1) tells the peer's encoder that this side decodes
in-band FEC, so it should send it (browsers then add it as their measured loss grows). aiortc
writes no fmtp line for Opus; its own parser ignores the parameter, so adding it to the SDP text
that goes to the peer changes nothing on this side.
"""

from __future__ import annotations

import re

_OPUS_RTPMAP = re.compile(r"^a=rtpmap:(\d+) opus/48000\b.*$", re.IGNORECASE | re.MULTILINE)


def with_opus_inband_fec(sdp: str) -> str:
    """``sdp`` with ``useinbandfec=1`` on every Opus payload type (an fmtp line added or extended)."""
    newline = "\r\n" if "\r\n" in sdp else "\n"
    for payload_type in dict.fromkeys(_OPUS_RTPMAP.findall(sdp)):
        fmtp = re.compile(rf"^a=fmtp:{payload_type} (.*?)(\r?)$", re.MULTILINE)
        existing = fmtp.search(sdp)
        if existing is None:
            rtpmap = re.compile(rf"^a=rtpmap:{payload_type} opus/48000\b.*?(?=\r?$)", re.IGNORECASE | re.MULTILINE)
            sdp = rtpmap.sub(lambda line: f"{line.group(0)}{newline}a=fmtp:{payload_type} useinbandfec=1", sdp, 1)
        elif "useinbandfec=" not in existing.group(1).replace(" ", ""):
            sdp = fmtp.sub(lambda line: f"a=fmtp:{payload_type} {line.group(1)};useinbandfec=1{line.group(2)}", sdp, 1)
    return sdp
