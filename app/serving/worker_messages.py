"""What the front process and its media workers say to each other over their connection (all picklable).

The front asks (``Offer``, ``HangUp``, ``AskResources``, ``AskTurns``: each carries a ``request`` number that its
reply repeats), serves the workers' engine generations (``GenerationEventMessage``, ``GenerationEnd``,
``GenerationPromoted``) and stops them (``Shutdown``). A worker says who it is (``Hello``), replies
(``OfferAnswered``, ``OfferRefused``, ``OfferFailed``, ``HungUp``, ``ResourcesReport``, ``TurnsReport``), tells of its
calls (``CallConnected``, ``CallClosed``), reports every ``STATUS_INTERVAL_S`` (``Status``: its
heartbeat) and runs generations on the front's engine (``StartGeneration``, ``CancelGeneration``, ``PromoteGeneration``).
``app.serving.ipc`` carries them; ``app.serving.media_workers`` and ``app.serving.media_worker``
dispatch on their types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.metrics import FamilySamples
from app.realtime.session_config import SessionConfig
from pipeline.contract import EngineErrorCode, GenerationEvent, GenerationRequest

# -- front -> worker --------------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """Answer this SDP offer with a new call ``call_id``; replied with ``OfferAnswered``,
    ``OfferRefused`` or ``OfferFailed``. ``client``: the key of the client whose share of the
    engine its session draws on (``Admission.client_key``; None: its own share only)."""

    request: int
    call_id: str
    sdp: str
    config: SessionConfig
    client: str | None


@dataclass(frozen=True)
class HangUp:
    """End call ``call_id``; replied with ``HungUp`` (``request`` 0: the front waits for no reply)."""

    request: int
    call_id: str


@dataclass(frozen=True)
class AskResources:
    """The worker's ``process_resources()`` (``/debug/resources``); replied with ``ResourcesReport``."""

    request: int


@dataclass(frozen=True)
class AskTurns:
    """The worker's recent sessions' turn timelines (``/debug/turns``); replied with ``TurnsReport``."""

    request: int


@dataclass(frozen=True)
class GenerationEventMessage:
    """The next event of the worker's generation ``generation``."""

    generation: int
    event: GenerationEvent


@dataclass(frozen=True)
class GenerationError:
    """Why a generation failed in the front: an ``EngineError``'s code and message."""

    code: EngineErrorCode
    message: str


@dataclass(frozen=True)
class GenerationEnd:
    """Generation ``generation`` is over: it ended (``error`` None) or failed."""

    generation: int
    error: GenerationError | None = None


@dataclass(frozen=True)
class GenerationPromoted:
    """The front engine's answer to ``PromoteGeneration`` ``promotion``."""

    promotion: int
    promoted: bool


@dataclass(frozen=True)
class Shutdown:
    """Close every call and exit."""


# -- worker -> front --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The worker's first message: which worker it is, in which process."""

    worker: int
    pid: int


@dataclass(frozen=True)
class OfferAnswered:
    """The call joined this worker; ``sdp`` is its answer."""

    request: int
    call_id: str
    sdp: str


@dataclass(frozen=True)
class OfferRefused:
    """The offer was wrong (``OfferError``); the call is closed."""

    request: int
    call_id: str
    error: str


@dataclass(frozen=True)
class OfferFailed:
    """Answering the offer failed otherwise (logged in the worker); the call is closed."""

    request: int
    call_id: str


@dataclass(frozen=True)
class HungUp:
    """``found``: the worker held the call (now closed)."""

    request: int
    found: bool


@dataclass(frozen=True)
class ResourcesReport:
    request: int
    resources: dict[str, Any]


@dataclass(frozen=True)
class TurnsReport:
    request: int
    sessions: list[dict[str, Any]]  # app.turn_timelines.TurnTimelines.to_json()


@dataclass(frozen=True)
class CallConnected:
    call_id: str


@dataclass(frozen=True)
class CallClosed:
    call_id: str
    reason: str


@dataclass(frozen=True)
class Status:
    """The worker's heartbeat: its sessions, its pacing (``media.pacing`` snapshot) and metrics."""

    sessions: int
    pacing: dict[str, Any]
    metrics: list[FamilySamples]


@dataclass(frozen=True)
class StartGeneration:
    """Run ``request`` on the front's engine as the worker's generation ``generation``."""

    generation: int
    request: GenerationRequest


@dataclass(frozen=True)
class CancelGeneration:
    generation: int


@dataclass(frozen=True)
class PromoteGeneration:
    """``Engine.promote(preemptible_id)`` on the front's engine; answered with ``GenerationPromoted``."""

    promotion: int
    preemptible_id: str


FrontRequest = Offer | HangUp | AskResources | AskTurns
Reply = OfferAnswered | OfferRefused | OfferFailed | HungUp | ResourcesReport | TurnsReport
ToWorker = FrontRequest | GenerationEventMessage | GenerationEnd | GenerationPromoted | Shutdown
ToFront = Hello | Reply | CallConnected | CallClosed | Status | StartGeneration | CancelGeneration | PromoteGeneration
Message = ToWorker | ToFront
