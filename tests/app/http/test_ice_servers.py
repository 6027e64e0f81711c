"""``GET /v1/realtime/ice_servers``: the page's and the client's STUN/TURN servers, credentials fresh."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from app.config import Settings
from app.http.server import create_app
from app.transports.webrtc.ice import rest_api_credentials
from tests.app.http.test_server import offering_peer, serving
from tests.fakes import ScriptedEngine

API_KEY = "sk-ice"
TURN_URL = "turn:turn.example.org:3478?transport=udp"
STUN_URL = "stun:turn.example.org:3478"


def settings_for(tmp_path: Path, **values: object) -> Settings:
    return Settings(ice_loopback=True, cache_dir=tmp_path, media_workers=1, **values)


async def test_static_credentials_go_with_turn_urls_only(tmp_path):
    settings = settings_for(tmp_path, ice_servers=[STUN_URL, TURN_URL], ice_username="u", ice_credential="p")
    async with serving(settings, ScriptedEngine()) as http:
        response = await http.get("/v1/realtime/ice_servers")
    assert response.json() == {
        "ice_servers": [{"urls": STUN_URL}, {"urls": TURN_URL, "username": "u", "credential": "p"}],
        "expires_at": None,
    }
    assert response.headers["cache-control"] == "no-store"


async def test_an_ice_auth_secret_mints_credentials_per_request(tmp_path):
    settings = settings_for(tmp_path, ice_servers=[TURN_URL], ice_auth_secret="north", ice_credential_ttl_s=120)
    async with serving(settings, ScriptedEngine()) as http:
        before = int(time.time())
        body = (await http.get("/v1/realtime/ice_servers")).json()
        after = int(time.time())
    [server] = body["ice_servers"]
    assert before + 120 <= body["expires_at"] <= after + 120
    user = server["username"].partition(":")[2]
    assert user.startswith("open-")
    assert (server["username"], server["credential"]) == rest_api_credentials(
        "north", expires_at=body["expires_at"], user=user
    )


async def test_with_a_key_the_route_is_authorised_like_calls(tmp_path):
    async with serving(settings_for(tmp_path, api_key=API_KEY), ScriptedEngine()) as http:
        without = await http.get("/v1/realtime/ice_servers")
        with_key = await http.get("/v1/realtime/ice_servers", headers={"Authorization": f"Bearer {API_KEY}"})
        wrong = await http.get("/v1/realtime/ice_servers", headers={"Authorization": "Bearer sk-wrong"})
    assert without.status_code == 401
    assert with_key.status_code == 200
    assert wrong.status_code == 401


async def test_a_client_secret_fetches_ice_servers_and_still_opens_its_call(tmp_path):
    async with offering_peer() as pc, serving(settings_for(tmp_path, api_key=API_KEY), ScriptedEngine()) as http:
        minted = await http.post("/v1/realtime/client_secrets", json={}, headers={"Authorization": f"Bearer {API_KEY}"})
        secret = {"Authorization": f"Bearer {minted.json()['value']}"}
        servers = await http.get("/v1/realtime/ice_servers", headers=secret)
        call = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                               headers={**secret, "Content-Type": "application/sdp"})
        after_use = await http.get("/v1/realtime/ice_servers", headers=secret)
        await http.delete(call.headers["location"], headers={"Authorization": f"Bearer {API_KEY}"})
    assert servers.status_code == 200
    assert call.status_code == 201  # the secret was checked, not used up, by the ICE servers request
    assert after_use.status_code == 401


def turn_user(response: httpx.Response) -> str:
    [server] = response.json()["ice_servers"]
    return server["username"].partition(":")[2]


async def test_a_client_secret_fetches_its_turn_credentials_once_and_they_are_its_own(tmp_path):
    # One ek_ secret must not fetch fresh credentials, all of one user, for its whole 600 s.
    settings = settings_for(tmp_path, api_key=API_KEY, ice_servers=[TURN_URL], ice_auth_secret="north")
    key = {"Authorization": f"Bearer {API_KEY}"}
    async with offering_peer() as pc, serving(settings, ScriptedEngine()) as http:
        minted = [(await http.post("/v1/realtime/client_secrets", json={}, headers=key)).json()["value"]
                  for _ in range(2)]
        first, second = ({"Authorization": f"Bearer {value}"} for value in minted)
        fetched = await http.get("/v1/realtime/ice_servers", headers=first)
        again = await http.get("/v1/realtime/ice_servers", headers=first)
        other = await http.get("/v1/realtime/ice_servers", headers=second)
        by_key = [await http.get("/v1/realtime/ice_servers", headers=key) for _ in range(2)]
        call = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                               headers={**first, "Content-Type": "application/sdp"})
        await http.delete(call.headers["location"], headers=key)
    assert (fetched.status_code, again.status_code, other.status_code) == (200, 401, 200)
    assert "fetched its ICE servers already" in again.json()["error"]["message"]
    assert turn_user(fetched).startswith("ek-") and turn_user(fetched) != turn_user(other)
    assert minted[0] not in turn_user(fetched)  # a digest of it: coturn logs its users
    assert turn_user(by_key[0]).startswith("key-") and turn_user(by_key[0]) != turn_user(by_key[1])
    assert call.status_code == 201  # the one fetch did not use the secret up


@pytest.mark.parametrize(("values", "named"), [
    ({"ice_servers": [TURN_URL]}, "credentials"),                                       # browsers refuse it
    ({"ice_servers": [TURN_URL], "ice_auth_secret": "s", "ice_username": "u", "ice_credential": "p"}, "one kind"),
    ({"ice_servers": [STUN_URL], "ice_auth_secret": "s"}, "no turn:"),
    ({"ice_servers": [TURN_URL], "ice_username": "u"}, "go together"),
])
def test_turn_settings_that_cannot_work_are_refused_at_start(tmp_path, values, named):
    with pytest.raises(ValidationError, match=named):
        settings_for(tmp_path, **values)


def test_a_bad_ice_server_url_fails_at_start(tmp_path):
    with pytest.raises(ValueError, match="stun:"):
        create_app(settings_for(tmp_path, ice_servers=["http://turn.example.org"]), engine=ScriptedEngine())
