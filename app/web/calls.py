"""How this server builds a call from its settings (ICE servers, timeouts, metrics, the end-of-turn
model), in whichever process carries it: the server process, or a media worker
(``app.web.media_worker``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiortc import RTCConfiguration

from app.config import Settings
from app.web.metrics import Metrics
from app.webrtc.call import Call, SessionFactory
from app.webrtc.ice import rtc_configuration
from media.end_of_turn import SmartTurnModel, default_model_path

logger = logging.getLogger(__name__)


def call_rtc_configuration(settings: Settings) -> RTCConfiguration:
    """The ICE servers every call uses; a bad URL raises ``ValueError`` naming it."""
    credential = settings.turn_credential.get_secret_value() if settings.turn_credential else None
    return rtc_configuration(settings.ice_servers, username=settings.turn_username, credential=credential)


def new_call(
    settings: Settings,
    make_session: SessionFactory,
    metrics: Metrics,
    on_closed: Callable[[Call, str], None],
    *,
    on_connected: Callable[[Call], None] | None = None,
    call_id: str | None = None,
) -> Call:
    """A call with the server's settings (in this process, or in a media worker)."""
    return Call(
        call_id=call_id,
        make_session=make_session,
        configuration=call_rtc_configuration(settings),
        ice_loopback=settings.ice_loopback,
        connect_timeout_s=settings.connect_timeout_s,
        disconnect_timeout_s=settings.disconnect_timeout_s,
        max_duration_s=settings.max_session_s,
        observer=metrics.observer(),
        on_connected=on_connected,
        on_closed=on_closed,
        pacing_stats=metrics.pacing,
        jitter_buffer=settings.jitter_buffer,
    )


def load_end_of_turn_model(settings: Settings) -> SmartTurnModel | None:
    """The end-of-turn model for semantic_vad, or None (logged) when it is missing or damaged."""
    path = settings.turn_model or default_model_path(settings.cache_dir)
    try:
        model = SmartTurnModel.load(path)
    except (OSError, ValueError) as exc:
        logger.error("semantic_vad is unavailable, sessions asking for it get server_vad: %s", exc)
        return None
    logger.info("end-of-turn model for semantic_vad: %s", path)
    return model
