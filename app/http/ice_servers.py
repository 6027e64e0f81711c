"""``GET /v1/realtime/ice_servers`` (an omni-rtc extension): the STUN/TURN servers a client builds its
peer connection with, TURN ones with credentials (coturn REST credentials minted for this request
when ``--ice-auth-secret`` is set).

OpenAI's Realtime API has no such route: its clients bring their own ICE servers. A browser on a
network that blocks UDP, or behind a symmetric NAT, reaches the server only through a TURN relay,
and only the server knows which relay and credentials belong with it. The page and
``omni-rtc call`` ask here before they build their peer connection; a client that gets 404 (another
server) keeps its own. Authorised like a call, except that an ``ek_`` client secret is checked and
not used up (the offer that follows uses it); it fetches once. Minted credentials name whose they
are (the secret's, or a user of their own for the API key), so that coturn's ``user-quota`` bounds
what one holder can allocate (docs/DEPLOY.md).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.config import Settings
from app.http.auth import Authenticator
from app.serving.call_factory import ice_servers

ICE_SERVERS_PATH = "/v1/realtime/ice_servers"


def ice_servers_router(settings: Settings, authenticator: Authenticator) -> APIRouter:
    router = APIRouter()

    @router.get(ICE_SERVERS_PATH)
    async def get_ice_servers(request: Request) -> JSONResponse:
        user = await authenticator.authorize_ice_servers(request)
        servers, expires_at = ice_servers(settings, user=user)
        return JSONResponse(
            {"ice_servers": [server.to_json() for server in servers], "expires_at": expires_at},
            headers={"Cache-Control": "no-store"},  # credentials: never from a cache
        )

    return router
