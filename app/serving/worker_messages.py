"""What the front process and its media workers say to each other over their connection (all picklable).

The front asks (``Offer``, ``HangUp``, ``AskResources``: each carries a ``request`` number that its
reply repeats), serves the workers' engine turns (``TurnEventMessage``, ``TurnEnd``,
``TurnPromoted``) and stops them (``Shutdown``). A worker says who it is (``Hello``), replies
(``OfferAnswered``, ``OfferRefused``, ``OfferFailed``, ``HungUp``, ``ResourcesReport``), tells of its
calls (``CallConnected``, ``CallClosed``), reports every ``STATUS_INTERVAL_S`` (``Status``: its
heartbeat) and runs turns on the front's engine (``StartTurn``, ``CancelTurn``, ``PromoteTurn``).
``app.serving.ipc`` carries them; ``app.serving.media_workers`` and ``app.serving.media_worker``
dispatch on their types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.metrics import FamilySamples
from app.realtime.session_config import SessionConfig
from pipeline.contract import TurnEvent, TurnRequest

# -- front -> worker --------------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """Answer this SDP offer with a new call ``call_id``; replied with ``OfferAnswered``,
    ``OfferRefused`` or ``OfferFailed``."""

    request: int
    call_id: str
    sdp: str
    config: SessionConfig


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
class TurnEventMessage:
    """The next event of the worker's turn ``turn``."""

    turn: int
    event: TurnEvent


@dataclass(frozen=True)
class TurnError:
    """Why a turn failed in the front: an ``EngineError``'s code and message."""

    code: str
    message: str


@dataclass(frozen=True)
class TurnEnd:
    """Turn ``turn`` is over: it ended (``error`` None) or failed."""

    turn: int
    error: TurnError | None = None


@dataclass(frozen=True)
class TurnPromoted:
    """The front engine's answer to ``PromoteTurn`` ``promotion``."""

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
class StartTurn:
    """Run ``request`` on the front's engine as the worker's turn ``turn``."""

    turn: int
    request: TurnRequest


@dataclass(frozen=True)
class CancelTurn:
    turn: int


@dataclass(frozen=True)
class PromoteTurn:
    """``Engine.promote(preemptible_id)`` on the front's engine; answered with ``TurnPromoted``."""

    promotion: int
    preemptible_id: str


FrontRequest = Offer | HangUp | AskResources
Reply = OfferAnswered | OfferRefused | OfferFailed | HungUp | ResourcesReport
ToWorker = FrontRequest | TurnEventMessage | TurnEnd | TurnPromoted | Shutdown
ToFront = Hello | Reply | CallConnected | CallClosed | Status | StartTurn | CancelTurn | PromoteTurn
Message = ToWorker | ToFront
