from __future__ import annotations

from app.transports.webrtc.sdp import with_opus_inband_fec

AIORTC_AUDIO = (
    "m=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\n"
    "a=rtpmap:111 opus/48000/2\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
)


def test_an_fmtp_line_is_added_after_the_opus_rtpmap() -> None:
    assert with_opus_inband_fec(AIORTC_AUDIO) == (
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\n"
        "a=rtpmap:111 opus/48000/2\r\n"
        "a=fmtp:111 useinbandfec=1\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
    )


def test_an_existing_fmtp_line_is_extended_once() -> None:
    offer = "a=rtpmap:109 opus/48000/2\r\na=fmtp:109 minptime=10\r\n"
    once = with_opus_inband_fec(offer)
    assert once == "a=rtpmap:109 opus/48000/2\r\na=fmtp:109 minptime=10;useinbandfec=1\r\n"
    assert with_opus_inband_fec(once) == once


def test_sdp_without_opus_is_left_alone() -> None:
    assert with_opus_inband_fec("a=rtpmap:0 PCMU/8000\n") == "a=rtpmap:0 PCMU/8000\n"
