"""API key and client secrets, through a FastAPI app that wires them like the server does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from pydantic import ValidationError

from app.config import Settings
from app.http.auth import (
    MAX_CLIENT_SECRET_SECONDS,
    Authenticator,
    CallGrant,
    ClientSecretStore,
    install_auth,
)
from app.http.errors import ApiError
from tests.clock import FakeClock

API_KEY = "sk-test-key"
MAX_BODY_BYTES = 4_096


async def resolve_session(session: dict[str, Any] | None) -> dict[str, Any]:
    """Stands in for the session config: rejects a bad voice, reflects the rest."""
    session = dict(session or {})
    if session.get("voice", "ethan") not in ("ethan", "chelsie", "aiden"):
        raise ValueError("voice must be one of ethan, chelsie, aiden")
    return {"type": "realtime", "voice": "ethan", **session}


def build_app(authenticator: Authenticator) -> FastAPI:
    app = FastAPI()
    install_auth(app, authenticator, resolve_session, max_body_bytes=MAX_BODY_BYTES)

    @app.post("/v1/realtime/calls")
    async def calls(grant: CallGrant = Depends(authenticator.authorize_call)) -> dict[str, Any]:
        return {"via": grant.via, "session": grant.session}

    return app


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)  # wall-clock seconds: secrets carry expires_at


@pytest.fixture
async def client(clock: FakeClock):
    app = build_app(Authenticator(API_KEY, ClientSecretStore(clock=clock)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def mint(client: httpx.AsyncClient, body: dict[str, Any] | None = None) -> httpx.Response:
    return await client.post("/v1/realtime/client_secrets", json=body or {}, headers=bearer(API_KEY))


async def test_call_without_credentials_is_401_with_openai_error_body(client):
    response = await client.post("/v1/realtime/calls", content="v=0")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["type"] == "authentication_error"
    assert error["code"] == "missing_credentials"
    assert "Authorization: Bearer" in error["message"]


async def test_call_with_wrong_key_is_401(client):
    response = await client.post("/v1/realtime/calls", headers=bearer("sk-wrong"))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


async def test_call_with_non_bearer_scheme_is_401(client):
    response = await client.post("/v1/realtime/calls", headers={"Authorization": f"Basic {API_KEY}"})
    assert response.status_code == 401


async def test_call_with_api_key_is_granted(client):
    response = await client.post("/v1/realtime/calls", headers=bearer(API_KEY))
    assert response.status_code == 200
    assert response.json() == {"via": "api_key", "session": None}


async def test_bearer_scheme_is_case_insensitive(client):
    response = await client.post("/v1/realtime/calls", headers={"Authorization": f"bearer {API_KEY}"})
    assert response.status_code == 200


async def test_minting_needs_the_api_key(client):
    response = await client.post("/v1/realtime/client_secrets", json={})
    assert response.status_code == 401


async def test_a_client_secret_cannot_mint_another(client):
    secret = (await mint(client)).json()["value"]
    response = await client.post("/v1/realtime/client_secrets", json={}, headers=bearer(secret))
    assert response.status_code == 401


async def test_minted_secret_has_openai_shape_and_ten_minute_default(client, clock):
    response = await mint(client)
    assert response.status_code == 200
    body = response.json()
    assert body["value"].startswith("ek_")
    assert body["expires_at"] == int(clock.now) + MAX_CLIENT_SECRET_SECONDS
    assert body["session"] == {"type": "realtime", "voice": "ethan"}


async def test_minted_secret_honours_requested_expiry(client, clock):
    body = (await mint(client, {"expires_after": {"anchor": "created_at", "seconds": 60}})).json()
    assert body["expires_at"] == int(clock.now) + 60


@pytest.mark.parametrize("seconds", [9, MAX_CLIENT_SECRET_SECONDS + 1, 7200])
async def test_expiry_outside_ten_seconds_to_ten_minutes_is_400(client, seconds):
    response = await mint(client, {"expires_after": {"anchor": "created_at", "seconds": seconds}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "expires_after.seconds"


async def test_unknown_expiry_anchor_is_400(client):
    response = await mint(client, {"expires_after": {"anchor": "last_used", "seconds": 60}})
    assert response.status_code == 400


async def test_non_json_mint_body_is_400(client):
    response = await client.post(
        "/v1/realtime/client_secrets", content=b"{not json", headers=bearer(API_KEY)
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_invalid_bound_session_is_400_and_mints_nothing(client):
    response = await mint(client, {"session": {"voice": "robot"}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "session"
    assert "voice" in response.json()["error"]["message"]


async def test_client_secret_opens_a_call_with_its_session(client):
    session = {"voice": "chelsie", "instructions": "Be brief."}
    secret = (await mint(client, {"session": session})).json()["value"]
    response = await client.post("/v1/realtime/calls", headers=bearer(secret))
    assert response.status_code == 200
    assert response.json() == {"via": "client_secret", "session": session}


async def test_client_secret_is_single_use(client):
    secret = (await mint(client)).json()["value"]
    assert (await client.post("/v1/realtime/calls", headers=bearer(secret))).status_code == 200
    response = await client.post("/v1/realtime/calls", headers=bearer(secret))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_client_secret"


async def test_expired_client_secret_is_401(client, clock):
    secret = (await mint(client, {"expires_after": {"seconds": 10}})).json()["value"]
    clock.now += 10
    response = await client.post("/v1/realtime/calls", headers=bearer(secret))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_client_secret"


async def test_made_up_client_secret_is_401(client):
    response = await client.post("/v1/realtime/calls", headers=bearer("ek_made_up"))
    assert response.status_code == 401


async def test_without_api_key_calls_are_open():
    app = build_app(Authenticator(None))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.post("/v1/realtime/calls")).json()["via"] == "open"


async def test_without_api_key_minting_explains_itself():
    app = build_app(Authenticator(None))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.post("/v1/realtime/client_secrets", json={})
    assert response.status_code == 400
    assert "OMNI_RTC_API_KEY" in response.json()["error"]["message"]


def test_store_forgets_expired_secrets_when_minting(clock):
    store = ClientSecretStore(clock=clock)
    store.mint(seconds=10)
    clock.now += 11
    store.mint(seconds=10)
    assert len(store) == 1


def test_store_refuses_past_capacity_with_429(clock):
    store = ClientSecretStore(clock=clock, capacity=2)
    store.mint(seconds=60)
    store.mint(seconds=60)
    with pytest.raises(ApiError) as raised:
        store.mint(seconds=60)
    assert raised.value.status_code == 429
    assert "Retry-After" in raised.value.headers


def test_public_bind_without_key_is_refused_naming_the_key():
    with pytest.raises(ValidationError, match="OMNI_RTC_API_KEY") as raised:
        Settings(host="0.0.0.0")
    assert "--allow-unauthenticated-public" in str(raised.value)


def test_public_bind_with_key_is_allowed():
    assert Settings(host="0.0.0.0", api_key="k").host == "0.0.0.0"


def test_public_bind_without_key_is_allowed_when_explicitly_asked():
    assert Settings(host="0.0.0.0", allow_unauthenticated_public=True).host == "0.0.0.0"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_bind_needs_no_key(host):
    assert Settings(host=host).host == host


def test_api_key_from_environment_is_secret(monkeypatch):
    monkeypatch.setenv("OMNI_RTC_API_KEY", API_KEY)
    settings = Settings()
    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == API_KEY
    assert API_KEY not in repr(settings)


def test_empty_api_key_is_refused():
    with pytest.raises(ValidationError, match="api_key is empty"):
        Settings(api_key="")


async def test_a_client_secret_request_past_the_bound_is_refused_before_it_is_read_whole(client):
    instructions = "x" * MAX_BODY_BYTES
    response = await mint(client, {"session": {"instructions": instructions}})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"

    async def endless():  # no Content-Length: refused while reading, not after
        while True:
            yield b" " * 1024

    response = await client.post("/v1/realtime/client_secrets", content=endless(), headers=bearer(API_KEY))
    assert response.status_code == 413
    assert (await mint(client, {"session": {"instructions": "Be brief."}})).status_code == 200  # the server goes on
