"""Signaling, health, metrics and CORS of the FastAPI app, in-process over ASGI.

The engine is a small fake (no model); the session, VAD, tracks and aiortc are real. Offers
come from real aiortc peers gathering on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from pydantic import SecretStr

from app.config import Settings
from app.http.server import create_app
from app.transports.webrtc.ice import loopback_candidates, rtc_configuration
from pipeline.contract import (
    AudioChunk,
    Engine,
    EngineHealth,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    Usage,
)
from pipeline.local.devices import usable_cores
from tests.fakes import FULL_CAPABILITIES, ScriptedEngine


class FakeEngine:
    """Answers every turn with one word and 0.1 s of quiet tone."""

    name = "fake-engine"
    capabilities = FULL_CAPABILITIES

    async def start(self) -> None:
        pass

    def health(self) -> EngineHealth:
        return EngineHealth(alive=True)

    async def close(self) -> None:
        pass

    async def run_generation(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        yield TextDelta("hello")
        yield AudioChunk(np.full(2400, 0.1, dtype=np.float32))
        yield GenerationDone(text="hello", usage=Usage(10, 0, 1), finish_reason="stop")


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(ice_loopback=True, cache_dir=tmp_path, cors_origins=["https://page.example"])


@contextlib.asynccontextmanager
async def serving(settings: Settings, engine: Engine | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The app started (``engine``, by default a ``FakeEngine``), and a client of it over ASGI."""
    app = create_app(settings, engine=engine if engine is not None else FakeEngine())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            yield http


@contextlib.asynccontextmanager
async def offering_peer(*, audio: bool = True, data_channel: bool = True) -> AsyncIterator[RTCPeerConnection]:
    """A real aiortc peer with a local offer set, as a browser would post it."""
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        if data_channel:
            pc.createDataChannel("oai-events")
        if audio:
            pc.addTransceiver("audio", direction="sendrecv")
        with loopback_candidates():
            await pc.setLocalDescription(await pc.createOffer())
        yield pc
    finally:
        await pc.close()


async def post_offer(http: httpx.AsyncClient, sdp: str) -> httpx.Response:
    return await http.post("/v1/realtime/calls", content=sdp, headers={"Content-Type": "application/sdp"})


async def open_sessions(http: httpx.AsyncClient) -> int:
    return (await http.get("/healthz")).json()["sessions"]


async def test_healthz_reports_status_model_and_no_sessions(settings):
    async with serving(settings) as http:
        response = await http.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["model"] == "fake-engine"
    assert body["sessions"] == 0
    assert body["engine"] == {"alive": True, "restarts": 0, "queue_depth": 0}


async def test_one_media_worker_is_this_process_and_the_default_one_per_core(settings):
    one = settings.model_copy(update={"media_workers": 1})
    async with serving(one) as http, offering_peer() as pc:
        assert (await post_offer(http, pc.localDescription.sdp)).status_code == 201
        [worker] = (await http.get("/healthz")).json()["workers"]
        resources = (await http.get("/debug/resources")).json()
    # --media-workers 1: the call lives in the server process itself, which has no worker processes.
    assert (worker["worker"], worker["pid"], worker["sessions"]) == ("0", os.getpid(), 1)
    assert "workers" not in resources

    assert settings.media_workers == usable_cores()  # the fixture gives none: the default
    async with serving(settings) as http:
        workers = (await http.get("/healthz")).json()["workers"]
    assert len(workers) == usable_cores()
    assert os.getpid() not in {worker["pid"] for worker in workers} or usable_cores() == 1


async def test_garbage_offer_is_400_with_a_json_message(settings):
    async with serving(settings) as http:
        response = await post_offer(http, "this is not SDP")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_sdp"
    assert "SDP" in response.json()["error"]["message"]


async def test_offer_without_audio_is_400_and_leaves_no_session(settings):
    async with serving(settings) as http, offering_peer(audio=False) as pc:
        response = await post_offer(http, pc.localDescription.sdp)
        assert response.status_code == 400
        assert "audio" in response.json()["error"]["message"]
        assert await open_sessions(http) == 0


async def test_offer_is_answered_201_with_location_and_complete_candidates(settings):
    async with serving(settings) as http, offering_peer() as pc:
        response = await post_offer(http, pc.localDescription.sdp)
        assert response.status_code == 201
        assert response.headers["content-type"].startswith("application/sdp")
        assert re.fullmatch(r"/v1/realtime/calls/rtc_[0-9a-f]+", response.headers["location"])
        answer = response.text
        assert re.search(r"^a=candidate:\S+ 1 udp \d+ 127\.0\.0\.1 \d+ typ host", answer, re.MULTILINE)
        assert "a=end-of-candidates" in answer
        assert await open_sessions(http) == 1


async def test_offer_without_candidates_is_answered(settings):
    async with serving(settings) as http, offering_peer() as pc:
        offer = re.sub(r"^a=(candidate|end-of-candidates).*\r\n", "", pc.localDescription.sdp, flags=re.MULTILINE)
        assert "a=candidate" not in offer
        response = await post_offer(http, offer)
    assert response.status_code == 201
    assert "a=candidate" in response.text


async def test_multipart_offer_with_session_is_answered(settings):
    async with serving(settings) as http, offering_peer() as pc:
        response = await http.post(
            "/v1/realtime/calls",
            files={
                "sdp": (None, pc.localDescription.sdp),
                "session": (None, json.dumps({"type": "realtime", "instructions": "Be brief."})),
            },
        )
    assert response.status_code == 201
    assert response.headers["location"].startswith("/v1/realtime/calls/rtc_")


async def test_multipart_offer_with_invalid_session_is_400(settings):
    async with serving(settings) as http, offering_peer() as pc:
        response = await http.post(
            "/v1/realtime/calls",
            files={"sdp": (None, pc.localDescription.sdp), "session": (None, json.dumps({"temperature": "hot"}))},
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"].startswith("session")
        assert await open_sessions(http) == 0


async def test_session_beyond_the_limit_is_429_with_retry_after(settings):
    settings = settings.model_copy(update={"max_sessions": 1})
    async with serving(settings) as http, offering_peer() as first, offering_peer() as second:
        assert (await post_offer(http, first.localDescription.sdp)).status_code == 201
        response = await post_offer(http, second.localDescription.sdp)
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) > 0
    assert response.json()["error"]["code"] == "too_many_sessions"


async def test_delete_hangs_up_the_call(settings):
    async with serving(settings) as http, offering_peer() as pc:
        location = (await post_offer(http, pc.localDescription.sdp)).headers["location"]
        response = await http.delete(location)
        assert response.status_code == 204
        assert await open_sessions(http) == 0
        assert (await http.delete(location)).status_code == 404


async def test_openai_hangup_route_hangs_up_the_call(settings):
    async with serving(settings) as http, offering_peer() as pc:
        location = (await post_offer(http, pc.localDescription.sdp)).headers["location"]
        response = await http.post(f"{location}/hangup")
        assert response.status_code == 204
        assert await open_sessions(http) == 0


async def test_cors_preflight_allows_authorization_and_custom_headers(settings):
    async with serving(settings) as http:
        response = await http.options(
            "/v1/realtime/calls",
            headers={
                "Origin": "https://page.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-client-version",
            },
        )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://page.example"
    allowed = {h.strip().lower() for h in response.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-client-version"} <= allowed


async def test_cors_exposes_location_to_an_allowed_origin(settings):
    async with serving(settings) as http, offering_peer() as pc:
        response = await http.post(
            "/v1/realtime/calls",
            content=pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp", "Origin": "https://page.example"},
        )
    assert response.status_code == 201
    assert "location" in response.headers["access-control-expose-headers"].lower()


async def test_cors_refuses_an_unlisted_origin(settings):
    async with serving(settings) as http:
        response = await http.options(
            "/v1/realtime/calls",
            headers={"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"},
        )
    assert "access-control-allow-origin" not in response.headers


async def test_metrics_count_open_sessions(settings):
    async with serving(settings) as http, offering_peer() as pc:
        await post_offer(http, pc.localDescription.sdp)
        body = (await http.get("/metrics")).text
    assert 'omni_rtc_sessions_open{transport="webrtc"} 1.0' in body
    assert 'omni_rtc_sessions_open{transport="websocket"} 0.0' in body
    assert "omni_rtc_time_to_first_audio_seconds_bucket" in body


async def test_shutdown_closes_every_call(settings):
    app = create_app(settings, engine=FakeEngine())
    async with offering_peer() as pc:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
                assert (await post_offer(http, pc.localDescription.sdp)).status_code == 201
            calls = app.state.runtime.calls
            assert len(calls) == 1
        assert len(calls) == 0


async def test_page_is_served_at_the_root(settings):
    async with serving(settings) as http:
        response = await http.get("/")
    assert response.status_code == 200
    assert "text/html" in response.headers["content-type"]


async def test_with_an_api_key_an_offer_needs_it(settings):
    settings = settings.model_copy(update={"api_key": SecretStr("sk-test")})
    async with serving(settings) as http, offering_peer() as pc:
        refused = await post_offer(http, pc.localDescription.sdp)
        accepted = await http.post(
            "/v1/realtime/calls",
            content=pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp", "Authorization": "Bearer sk-test"},
        )
    assert refused.status_code == 401
    assert accepted.status_code == 201


async def test_a_client_secret_places_one_call_with_its_session(settings):
    settings = settings.model_copy(update={"api_key": SecretStr("sk-test")})
    async with serving(settings) as http, offering_peer() as pc:
        minted = await http.post(
            "/v1/realtime/client_secrets",
            json={"session": {"type": "realtime", "instructions": "Be brief."}},
            headers={"Authorization": "Bearer sk-test"},
        )
        assert minted.status_code == 200
        assert minted.json()["session"]["instructions"] == "Be brief."
        secret = minted.json()["value"]
        headers = {"Content-Type": "application/sdp", "Authorization": f"Bearer {secret}"}
        first = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp, headers=headers)
        again = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp, headers=headers)
    assert first.status_code == 201
    assert again.status_code == 401


async def test_turn_text_judge_engine_is_refused_at_start_when_the_engine_scores_no_end_of_turn(settings):
    engine = ScriptedEngine(capabilities=dataclasses.replace(FULL_CAPABILITIES, end_of_turn_scores=False))
    app = create_app(settings.model_copy(update={"turn_text_judge": "engine"}), engine=engine)
    with pytest.raises(ValueError, match="turn_text_judge 'engine': this server's engine does not score"):
        async with app.router.lifespan_context(app):
            pass


async def test_turn_text_judge_engine_with_engine_urls_is_refused_at_start(tmp_path):
    # Refused before the engine starts: the port below has no server, and nothing waits for one.
    settings = Settings(cache_dir=tmp_path, engine_urls=["http://127.0.0.1:9/v1"], turn_text_judge="engine")
    app = create_app(settings)
    with pytest.raises(ValueError, match="set turn_text_judge to 'off'"):
        async with app.router.lifespan_context(app):
            pass


async def test_an_engine_that_scores_the_end_of_a_turn_serves_with_turn_text_judge_engine(settings):
    app = create_app(settings.model_copy(update={"turn_text_judge": "engine", "media_workers": 1}),
                     engine=ScriptedEngine())
    async with app.router.lifespan_context(app):
        assert app.state.runtime is not None


async def test_a_client_secret_forcing_a_call_the_engine_cannot_make_is_refused(settings):
    settings = settings.model_copy(update={"api_key": SecretStr("sk-test"), "media_workers": 1})
    engine = ScriptedEngine(capabilities=dataclasses.replace(FULL_CAPABILITIES, function_calls=False))
    app = create_app(settings, engine=engine)
    tool = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            refused = await http.post(
                "/v1/realtime/client_secrets", headers={"Authorization": "Bearer sk-test"},
                json={"session": {"type": "realtime", "tools": [tool], "tool_choice": "required"}},
            )
    assert refused.status_code == 400
    assert "does not call functions" in refused.json()["error"]["message"]


class TwoEnginePool(FakeEngine):
    """An engine pool whose second engine process is being restarted."""

    def health(self) -> EngineHealth:
        return EngineHealth(alive=True, restarts=1, members=(
            {"device": "cuda:0", "alive": True, "pid": 11, "restarts": 0, "running": 2, "queue_depth": 0, "max_batch": 8},
            {"device": "cuda:1", "alive": False, "pid": None, "restarts": 1, "running": 0, "queue_depth": 0, "max_batch": 8},
        ))


class WarmingEngine(FakeEngine):
    """An engine whose process has loaded and runs its warm-up turns until ``warmed`` is set."""

    alive = False

    def health(self) -> EngineHealth:
        state = "ready" if self.alive else "warming"
        return EngineHealth(alive=self.alive, members=(
            {"device": "cpu", "alive": self.alive, "state": state, "pid": 11, "restarts": 0, "running": 0,
             "queue_depth": 0, "max_batch": 8, "warm_up": {"turns": 4} if self.alive else None},
        ))


async def test_healthz_is_not_ok_while_the_engine_warms_up(settings):
    engine = WarmingEngine()
    app = create_app(settings.model_copy(update={"media_workers": 1}), engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            warming = await http.get("/healthz")
            engine.alive = True  # its warm-up turns are over
            warmed = await http.get("/healthz")
    assert warming.status_code == 503
    assert [entry["state"] for entry in warming.json()["engine"]["engines"]] == ["warming"]
    assert warmed.status_code == 200
    assert warmed.json()["status"] == "ok"


async def test_healthz_shows_each_engine_of_a_pool_and_degraded_while_one_restarts(settings):
    app = create_app(settings, engine=TwoEnginePool())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            response = await http.get("/healthz")
    assert response.status_code == 200  # one engine still serves
    body = response.json()
    assert body["status"] == "degraded"
    assert body["engine"] == {"alive": True, "restarts": 1, "queue_depth": 0, "engines": [
        {"device": "cuda:0", "alive": True, "pid": 11, "restarts": 0, "running": 2, "queue_depth": 0, "max_batch": 8},
        {"device": "cuda:1", "alive": False, "pid": None, "restarts": 1, "running": 0, "queue_depth": 0, "max_batch": 8},
    ]}


async def minted_turn_detection(settings: Settings, session: dict) -> dict:
    """The turn detection a call placed with a client secret minted for ``session`` starts with."""
    settings = settings.model_copy(update={"api_key": SecretStr("sk-test")})
    async with serving(settings) as http:
        minted = await http.post("/v1/realtime/client_secrets", json={"session": session},
                                 headers={"Authorization": "Bearer sk-test"})
    assert minted.status_code == 200
    return minted.json()["session"]["audio"]["input"]["turn_detection"]


async def test_a_call_barges_in_by_default_as_openai_does(settings):
    assert (await minted_turn_detection(settings, {"type": "realtime"}))["interrupt_response"] is True
    without_field = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    assert (await minted_turn_detection(settings, without_field))["interrupt_response"] is True


async def test_the_server_setting_makes_calls_half_duplex_unless_they_ask(settings):
    settings = settings.model_copy(update={"default_interrupt_response": False})
    assert (await minted_turn_detection(settings, {"type": "realtime"}))["interrupt_response"] is False
    without_field = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    assert (await minted_turn_detection(settings, without_field))["interrupt_response"] is False
    asked = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": True}}}}
    assert (await minted_turn_detection(settings, asked))["interrupt_response"] is True
