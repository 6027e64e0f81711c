"""What the server's lifespan builds and every route reads: the engine, the VADs, the calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.calls.registry import CallRegistry
from app.realtime.shares import ClientShares
from app.recording import Recordings
from app.serving.engines import for_session
from app.serving.media_workers import MediaWorkerPool
from app.tracing import Tracing
from app.turn_timelines import TurnTimelines
from media.end_of_turn_model import EndOfTurnModel
from media.vad import SileroVad
from pipeline.contract import Engine


@dataclass
class Runtime:
    """Present on ``app.state.runtime`` while the app serves."""

    engine: Engine
    for_sessions: Engine  # the engine as sessions get it
    model: str
    vad: SileroVad
    # Every open session (--max-sessions): calls and WebSockets here, and the media workers' calls.
    calls: CallRegistry
    end_of_turn: EndOfTurnModel | None = None  # None: not installed; semantic_vad is refused
    workers: MediaWorkerPool | None = None  # --media-workers > 1
    dev_replies: tuple[str, ...] = ()  # --dev-replies
    tracing: Tracing | None = None  # this process's trace export; None: no OTLP endpoint configured
    recordings: Recordings | None = None  # this process's session recordings; None: --record-dir not set
    # Recent sessions' turns in this process (GET /debug/turns); the media workers' calls are not here.
    timelines: TurnTimelines = field(default_factory=TurnTimelines)
    # The engine share and event rate of each client of this process's sessions (the media workers keep their own).
    client_shares: ClientShares = field(default_factory=ClientShares)

    def session_engine(self) -> Engine:
        """The engine one new session gets."""
        return for_session(self.for_sessions, self.dev_replies)
