"""How this server builds a call from its settings (ICE servers, timeouts, metrics, the end-of-turn
model), in whichever process carries it: the server process, or a media worker
(``app.serving.media_worker``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from app.calls.registry import OnClosed
from app.config import Settings
from app.metrics import Metrics
from app.realtime.playback import AudioOutput
from app.realtime.session import RealtimeSession
from app.realtime.session_config import SessionConfig
from app.realtime.shares import ClientShares
from app.realtime.turn_report import SessionObservers
from app.realtime.turn_taking import EngineTextJudge, TextJudge
from app.recording import Recordings
from app.tracing import Tracing
from app.transports.webrtc.ice import IceServer, rest_api_credentials, rtc_configuration
from app.transports.webrtc.peer_call import Call, SessionFactory, new_call_id
from app.turn_timelines import TurnTimelines
from media.aiortc_version import UnsupportedAiortc
from media.end_of_turn_model import EndOfTurnModel, SmartTurnModel, default_turn_model_path
from media.receiver_tap import check_receiver_tap
from media.vad import SpeechModel
from pipeline.contract import Engine, EngineCapabilities

logger = logging.getLogger(__name__)


def ice_servers(settings: Settings, *, user: str, now: float | None = None) -> tuple[list[IceServer], int | None]:
    """The STUN/TURN servers for one peer (the server's own, or a client's), TURN ones with credentials:
    the static ones, or coturn REST credentials minted now for ``user`` (the username's part after
    the expiry: whose they are, so that coturn's ``user-quota`` bounds each call, docs/DEPLOY.md).
    Also when minted ones expire (unix seconds; None for static). A bad URL raises ``ValueError``
    naming it."""
    expires_at = None
    username: str | None
    credential: str | None
    if settings.ice_auth_secret is not None:
        expires_at = int(time.time() if now is None else now) + settings.ice_credential_ttl_s
        username, credential = rest_api_credentials(
            settings.ice_auth_secret.get_secret_value(), expires_at=expires_at, user=user
        )
    else:
        username = settings.ice_username
        credential = settings.ice_credential.get_secret_value() if settings.ice_credential else None
    servers = [
        IceServer(url, username, credential) if url.lower().startswith(("turn:", "turns:")) else IceServer(url)
        for url in settings.ice_servers
    ]
    return servers, expires_at


def session_factory(
    settings: Settings,
    metrics: Metrics,
    config: SessionConfig,
    *,
    session_engine: Callable[[], Engine],
    shared_engine: Engine,
    vad: SpeechModel,
    end_of_turn: EndOfTurnModel | None,
    tracing: Tracing | None,
    recordings: Recordings | None,
    transport: str,
    client_shares: ClientShares,
    client: str | None,
    session_fields: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    timelines: TurnTimelines | None = None,
) -> Callable[[AudioOutput, Callable[[dict[str, Any]], None]], RealtimeSession]:
    """How a call of either transport, in either process, makes its session: ``session_engine``
    gives each session its engine (wrapped per session: ``app.serving.engines.for_session``),
    ``shared_engine`` is the engine the text judge asks (``text_judge``); the server's metrics
    observe it, this process's ``tracing`` (when it exports traces) draws its spans,
    ``timelines`` (the server process's, for ``/debug/turns``) keeps its turns' timeline and its
    ``recordings`` (when the server keeps them) record it. ``client``: the key of the client whose
    share of the engine and event rate the session draws on too (``Admission.client_key``; None:
    its own only), kept in this process's ``client_shares``."""

    def make_session(output: AudioOutput, send: Callable[[dict[str, Any]], None]) -> RealtimeSession:
        return RealtimeSession(
            engine=session_engine(), vad=vad, output=output, send=send, config=config,
            on_ignored_speech=metrics.ignored_speech.inc, on_speculation=metrics.speculation,
            on_partial_transcript=metrics.partial_transcript, on_interruption=metrics.interruption,
            on_engine_tokens=metrics.session_engine_tokens.observe, on_share_refused=metrics.share_refused,
            on_rate_refused=metrics.rate_refused,
            client=client, client_shares=client_shares, share_size=settings.engine_share_size,
            end_of_turn=end_of_turn,
            text_judge=text_judge(settings, shared_engine),
            session_fields=session_fields,
            observer=SessionObservers.of(
                tracing.session_spans(transport) if tracing is not None else None,
                timelines.new_session(transport) if timelines is not None else None,
                recordings.session_recorder(transport) if recordings is not None else None,
            ),
        )

    return make_session


def new_call(
    settings: Settings,
    make_session: SessionFactory,
    metrics: Metrics,
    on_closed: OnClosed,
    *,
    on_connected: Callable[[Call], None] | None = None,
    call_id: str | None = None,
) -> Call:
    """A call with the server's settings (in this process, or in a media worker)."""
    call_id = call_id or new_call_id()
    return Call(
        call_id=call_id,
        make_session=make_session,
        # TURN credentials minted per call, for this call's own user (coturn's user-quota).
        configuration=rtc_configuration(ice_servers(settings, user=call_id)[0]),
        ice_loopback=settings.ice_loopback,
        connect_timeout_s=settings.connect_timeout_s,
        disconnect_timeout_s=settings.disconnect_timeout_s,
        max_duration_s=settings.max_session_s,
        idle_timeout_s=settings.session_idle_timeout_s,
        observer=metrics.observer(),
        on_connected=on_connected,
        on_closed=on_closed,
        pacing_stats=metrics.pacing,
        jitter_buffer=settings.jitter_buffer,
        max_video_pixels=settings.max_video_pixels,
    )


def check_jitter_buffer(settings: Settings) -> None:
    """At start: ``jitter_buffer`` taps aiortc's audio receiver, read in known aiortc versions only
    (``ValueError`` naming the setting and the way out)."""
    if settings.jitter_buffer:
        try:
            check_receiver_tap()
        except UnsupportedAiortc as exc:
            raise ValueError(f"jitter_buffer: {exc}") from None


def check_text_judge(settings: Settings, capabilities: EngineCapabilities) -> None:
    """At start, before the engine loads: ``turn_text_judge`` 'engine' needs an engine that scores
    the end of a turn (``ValueError`` naming the setting)."""
    if settings.turn_text_judge == "engine" and not capabilities.end_of_turn_scores:
        raise ValueError(
            "turn_text_judge 'engine': this server's engine does not score the end of a turn (the Thinker's "
            "P(<|im_end|>) after the transcript; vLLM-Omni servers, engine_urls, return text only); "
            "set turn_text_judge to 'off'"
        )


def text_judge(settings: Settings, engine: Engine) -> TextJudge | None:
    """semantic_vad's judge of the words (``turn_text_judge``): Qwen3-Omni on the sessions' engine,
    when that engine scores the end of a turn (``check_text_judge`` refused the setting otherwise)."""
    if settings.turn_text_judge == "engine" and engine.capabilities.end_of_turn_scores:
        return EngineTextJudge(engine)
    return None


def load_end_of_turn_model(settings: Settings) -> SmartTurnModel | None:
    """The end-of-turn model for semantic_vad, or None (logged) when it is missing or damaged."""
    path = settings.turn_model or default_turn_model_path(settings.cache_dir)
    try:
        model = SmartTurnModel.load(path)
    except (OSError, ValueError) as exc:
        logger.error("semantic_vad is unavailable, sessions asking for it get server_vad: %s", exc)
        return None
    logger.info("end-of-turn model for semantic_vad: %s", path)
    return model
