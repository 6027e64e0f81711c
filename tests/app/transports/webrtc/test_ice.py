"""ICE servers and TURN credentials (``app/transports/webrtc/ice.py``)."""

from __future__ import annotations

import pytest
from aiortc import RTCConfiguration, RTCIceServer

from app.transports.webrtc.ice import IceServer, candidate_types, missing_relay, rest_api_credentials, rtc_configuration

HOST_CANDIDATE = "a=candidate:1 1 udp 2130706431 10.0.2.2 40000 typ host\r\n"
RELAY_CANDIDATE = "a=candidate:2 1 udp 16777215 10.0.0.1 49160 typ relay raddr 10.0.2.2 rport 40000\r\n"


def test_rest_api_credentials_are_coturns():
    """coturn's TURN REST API: username "<expiry>:<user>", password base64(HMAC-SHA1(secret, username)).

    The expected password was computed apart from this code, with OpenSSL:
    printf '%s' '1700000000:omni-rtc' | openssl dgst -sha1 -hmac 'north' -binary | base64
    """
    assert rest_api_credentials("north", expires_at=1_700_000_000, user="omni-rtc") == (
        "1700000000:omni-rtc", "PyXhBAT9HzSrzTcQhwbKcAamdGk="
    )


def test_an_ice_server_is_webrtcs_dictionary():
    assert IceServer("stun:stun.example.org:3478").to_json() == {"urls": "stun:stun.example.org:3478"}
    assert IceServer("turn:turn.example.org:3478", "u", "p").to_json() == {
        "urls": "turn:turn.example.org:3478", "username": "u", "credential": "p"
    }


def test_ice_servers_read_from_json_take_url_lists():
    servers = IceServer.from_json({"urls": ["turn:a.example:3478", "turns:a.example:5349"], "username": "u",
                                   "credential": "p"})
    assert servers == [IceServer("turn:a.example:3478", "u", "p"), IceServer("turns:a.example:5349", "u", "p")]


@pytest.mark.parametrize("entry", [{"urls": "http://a.example"}, {"urls": 3}, {}])
def test_malformed_ice_servers_are_refused(entry):
    with pytest.raises(ValueError):
        IceServer.from_json(entry)


def test_the_configuration_has_exactly_the_servers_given():
    configuration = rtc_configuration([IceServer("turn:a.example:3478", "u", "p")])
    assert configuration.iceServers == [RTCIceServer(urls="turn:a.example:3478", username="u", credential="p")]
    assert rtc_configuration([]).iceServers == []  # never aiortc's default public STUN server


def test_candidate_types_are_read_from_the_sdp():
    assert candidate_types("v=0\r\n" + HOST_CANDIDATE + RELAY_CANDIDATE) == {"host", "relay"}


def test_a_turn_server_that_gave_no_relay_candidate_is_named():
    configuration = RTCConfiguration(iceServers=[RTCIceServer(urls="turn:a.example:3478", username="u", credential="p")])
    assert missing_relay(configuration, HOST_CANDIDATE) == ["turn:a.example:3478"]
    assert missing_relay(configuration, HOST_CANDIDATE + RELAY_CANDIDATE) == []
    assert missing_relay(RTCConfiguration(iceServers=[RTCIceServer(urls="stun:a.example")]), HOST_CANDIDATE) == []
