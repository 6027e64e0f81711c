"""One visitor never slows another: four polite sessions beside one hostile client, attack by attack.

Run: .venv/bin/python tests/bench/fair_share.py [--attacks cancel_loop speculation_loop ...] [--repo DIR]
     [--label L] [--turns 6] [--server-args "..."] [--out tests/bench/results/fair_share.json]

Before and after in one sitting: ``--repo DIR`` runs that checkout's server (e.g. ``git worktree add
/tmp/base COMMIT`` with ``.venv`` linked in) against the same clients, this checkout's. What an older
server does not know is recorded as the answer it gives (an error code, a refusal), never a crash of
the bench.

The server: ``omni-rtc serve`` from ``--repo`` on a free 127.0.0.1 port: the dev model on the
in-process engine (seed 0, answers capped at 25 codec frames, ``OMP_NUM_THREADS=1``), two media
workers, ``--trusted-proxy 127.0.0.1 --allow-unauthenticated-public``, and ``--dev-replies`` holding one
reply, a call of the ReDoS tool (below). Every client names an address of its own in
``X-Forwarded-For``, as visitors behind a deployment's proxy do (documentation addresses: the polite
sessions 198.51.100.1-4, each attack's hostile one of its own from 203.0.113.66), so that bounds per client apply as they would
there. Each session's first response says the scripted reply, then the model's own: the polite
sessions' first response is their unmeasured warm-up (the tool is not theirs, so it is no call).

Per attack, two phases on the one server, each once the server has settled (no session open and no
engine turn finished for 2 s):

- baseline: the polite sessions alone;
- attack: the hostile client (a process of its own, at nice 10: its CPU stands for a visitor's own
  machine, not the server's) starts; once it says its attack is under way, the polite sessions run
  again; then it is told to stop and reports what it got.

A polite session connects (WebSocket; for ``tool_redos_rtc`` a WebRTC call, an aiortc peer, so that
some share a media worker with the hostile call), sets ``max_output_tokens`` 8 and no turn detection,
takes one warm-up turn, then ``--turns`` turns: after a pause of 0.2-0.8 s (seeded) a short user text
(``conversation.item.create``) and ``response.create``. Per turn, from the ``response.create`` sent:
``first text`` = the first ``response.output_text.delta`` or ``response.output_audio_transcript.delta``
of the response; ``first audio`` = its first ``response.output_audio.delta`` (WebRTC: the first frame
received with a peak of -60 dBFS or more). A turn that fails (the session refused, an error answering
its events, a response neither completed nor incomplete, no ``response.done`` within
``--turn-timeout``, the session gone, the phase's ``--phase-seconds`` spent) counts as infinitely
slow, so failures move the median and p90 ("fail" in the table when half or more failed). A WebRTC
client ends its call once it has heard nothing (no frame, no event) for 5 s, as
``app.client.webrtc`` does: a media worker whose loop stalls that long loses its calls' turns.

The rule, per attack: the polite sessions' median within 1.5 x the same run's baseline median + 100 ms,
for the first text and for the first audio; ``pass`` when both hold.

The attacks, each one hostile client, bounded by ``--hostile-seconds`` and by its own counts:

- ``cancel_loop``: a session whose instructions are 15,000 characters of punctuation (~10,500 Qwen
  tokens) plus a function tool whose description is as much punctuation as the server still takes
  (a binary search on ``session.update``: ~15,950 tokens in all under the default 16,000 of
  ``--instructions-max-tokens``), then ``response.create``, ``response.cancel`` 150 ms after
  ``response.created``, and again at once, until stopped.
- ``speculation_loop``: server VAD (``silence_duration_ms`` 1500, ``speculative_response`` on) and
  the cancel loop's system message less 200 characters (so that each speculation is a long prefill,
  and changed instructions still fit); ``tests/fixtures/hello.wav`` appended at twice real time,
  200 ms of silence (a candidate end of turn: a speculative answer starts), three ``session.update``
  50 ms apart whose instructions begin differently (each restarts it), ``input_audio_buffer.clear``
  (the utterance is dropped before its commit), again.
- ``transcription_flood``: manual turns with input transcription on (partials off): 120 ms of white
  noise appended and committed (100 ms is the least a commit takes), 150 commits (45 at once, then
  24 a second), then 20 a second.
- ``tool_redos_ws``: a session with a function tool whose string parameter has the pattern
  ``^(.+)+X$``, a user text and ``response.create``; the scripted reply calls the tool with
  ``--redos-chars`` (27) letters, which a backtracking engine checks in ~2^27 steps. One call per
  session (the script is each session's first reply): a session after another, one every 2 s at most,
  until stopped or ``--redos-attempts`` (20).
- ``tool_redos_rtc``: the same over WebRTC calls (the tool set over the data channel); the polite
  sessions are WebRTC calls too.
- ``append_flood``: ``{"type":"input_audio_buffer.append","audio":"!"}`` sent as fast as the client
  can, alternating every 2.5 s with the same event padded with 240,000 spaces (JSON's ignored
  whitespace), reading every answer, until stopped.
- ``slot_filling``: 16 WebSockets opened from the hostile's one address and held idle; then the polite
  sessions connect (a refusal fails every turn of that session).

Recorded beside the latencies: the polite sessions' failures by reason; the hostile's counts (events
sent and received by type, errors by code, refusals by HTTP status and code, responses by status) and
its own figures; the server's ``/metrics`` counters that moved during each phase; the server
process's CPU seconds and its children's (engine and media workers) per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import psutil
import soxr
import websockets
from harness import REPO, free_port, machine, read_wav, wait_until_healthy, write_report
from soak import DEV_MODEL_AUDIO_FRAMES  # answers capped at 2 s: the random dev model's Talker never ends
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from app.client.base import ClientError, RealtimeClientBase
from app.client.webrtc import AUDIBLE_PEAK, RealtimeClient
from pipeline.token_count import system_tokens_at_most
from pipeline.tool_format import Tool
from tests.hostile import catastrophic_pattern_tool, forced_tool_call, punctuation

logger = logging.getLogger(__name__)

Event = dict[str, Any]
Transport = Literal["websocket", "webrtc"]

ATTACKS = ("cancel_loop", "speculation_loop", "transcription_flood", "tool_redos_ws", "tool_redos_rtc",
           "append_flood", "slot_filling")
POLITE_OVER_WEBRTC = ("tool_redos_rtc",)
DEFAULT_OUT = REPO / "tests" / "bench" / "results" / "fair_share.json"

FORWARDED_FOR = "X-Forwarded-For"
HOSTILE_ADDRESSES = "203.0.113.{}"  # TEST-NET-3 (RFC 5737), one per attack
POLITE_ADDRESS = "198.51.100.{}"  # TEST-NET-2, one per polite session
# Lower priority for the hostile client's process: on this shared box its own CPU would otherwise
# be taken from the server, which a visitor's machine never is.
HOSTILE_NICENESS = 10

TEXT_DELTAS = ("response.output_text.delta", "response.output_audio_transcript.delta")
AUDIO_DELTA = "response.output_audio.delta"
ANSWERED = ("completed", "incomplete")  # incomplete: max_output_tokens reached, the answer said
PLAYBACK_ENDED = ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
RULE_FACTOR, RULE_MARGIN_MS = 1.5, 100.0

POLITE_SESSION: dict[str, Any] = {"instructions": "Answer in a few words.", "max_output_tokens": 8,
                                  "audio": {"input": {"turn_detection": None}}}
POLITE_TEXTS = ("Hi, how are you today?", "What time do the shops open?", "Tell me a short fact.",
                "How far away is the moon?", "Name a colour you like.", "What is two plus two?")
PAUSE_S = (0.2, 0.8)
CONNECT_TIMEOUT_S = 60.0
SETTLE_QUIET_S = 2.0  # no engine turn finished for this long: the engine is idle
SETTLE_LIMIT_S = 90.0
METRICS_TIMEOUT_S = 60.0  # a frozen front answers late

REDOS_TOOL = "lookup"
HOSTILE_WAIT_S = 120.0  # a hostile's wait for one answer: against hangs only
INSTRUCTION_CHARS = 15_000  # under --max-text-chars' 16,000 default
CANCEL_AFTER_S = 0.150
SPECULATION_RESTARTS = 3  # session.update per utterance: with the first start, 4 speculations
SPECULATION_SILENCE_MS = 1_500  # the server VAD's wait: longer than the pause, so nothing commits
SPECULATION_PAUSE_MS = 200  # after the speech: a candidate end of turn
SPECULATION_RESTART_S = 0.05
CHUNK_MS = 100
# A commit of noise: 100 ms is the least a commit takes, and a server that resamples appends as one
# stream holds a few ms of each back (the filter's delay), so 100 ms appends commit only every other time.
NOISE_MS = 120
TRANSCRIPTION_BURST, TRANSCRIPTION_FIRST, TRANSCRIPTION_FIRST_RATE, TRANSCRIPTION_RATE = 45, 150, 24.0, 20.0
FLOOD_SWITCH_S = 2.5
FLOOD_PADDING = 240_000
SLOTS = 16
REDOS_INTERVAL_S = 2.0  # a tool call at most this often, so that calls go on through the polite turns
SESSIONS_PER_ATTACK = 8  # a hostile whose sessions the server ends opens at most this many in all
READY_TIMEOUT_S = 60.0  # from a hostile's start to its attack under way
STOP_GRACE_S = 15.0  # from the stop to a hostile's result: what it still waits for is cut short


# -- clients ----------------------------------------------------------------------------------------


class Refused(Exception):
    """The server refused a session: its HTTP status and error code, or why connecting failed."""


def refusal(status: int, body: bytes | str | None) -> str:
    """``HTTP 429 too_many_sessions``: the status and, when the body is OpenAI's error object, its code."""
    code = None
    if body:
        try:
            code = json.loads(body)["error"]["code"]
        except (ValueError, TypeError, KeyError):
            code = None  # not OpenAI's error body: the status says it
    return f"HTTP {status}" + (f" {code}" if code else "")


def call_refusal(exc: Exception) -> str:
    """A WebRTC client's failure to connect, as :func:`refusal` words it where it can."""
    found = re.search(r"HTTP (\d+) (.*)", str(exc), flags=re.DOTALL)
    return refusal(int(found[1]), found[2]) if found else f"{type(exc).__name__}: {exc}"[:200]


class ForwardedSocket(RealtimeClientBase):
    """One ``GET /v1/realtime`` session speaking for ``address`` (``X-Forwarded-For``): every server
    event with its arrival time, or only counted (``keep_events`` False: a flood's answers)."""

    def __init__(self, url: str, address: str, *, on_event: Callable[[Event], None] | None = None,
                 timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        super().__init__(timeout_s)
        self.url = url.rstrip("/").replace("http://", "ws://", 1) + "/v1/realtime"
        self.address = address
        self.arrivals: list[float] = []
        self.keep_events = True
        self.closed: str | None = None
        self.on_event = on_event  # every event, kept or not
        self._ws: ClientConnection | None = None
        self._receiver: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """Open, and wait for ``session.created``; :class:`Refused` otherwise."""
        try:
            # No client pings: a browser sends none, and a stalled server is the turns' to measure.
            self._ws = await websockets.connect(self.url, additional_headers={FORWARDED_FOR: self.address},
                                                max_size=None, open_timeout=self._timeout_s, ping_interval=None)
        except InvalidStatus as exc:
            raise Refused(refusal(exc.response.status_code, exc.response.body)) from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise Refused(f"{type(exc).__name__}: {exc}"[:200]) from None
        self._receiver = asyncio.create_task(self._receive(self._ws), name=f"socket {self.address}")
        try:
            await self.wait_for("session.created")
        except (ClientError, TimeoutError) as exc:
            errors = [error_code(event) for event in self.events if event.get("type") == "error"]
            raise Refused(f"accepted, then {errors[0] if errors else exc or 'no session.created'}") from None

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
            self._receiver = None

    async def send(self, event: Event) -> None:
        await self.send_raw(json.dumps(event))

    async def send_raw(self, message: str) -> None:
        assert self._ws is not None, "connect() first"
        try:
            await self._ws.send(message)
        except ConnectionClosed:
            raise ClientError(self.closed or "the server closed the session") from None

    async def _receive(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                try:
                    event = json.loads(message)
                except json.JSONDecodeError:
                    event = {"type": "(not JSON)"}
                if self.on_event is not None:
                    self.on_event(event)
                if self.keep_events:
                    self.events.append(event)
                    self.arrivals.append(time.monotonic())
                self._notify()
        except ConnectionClosed:
            pass  # ended below: the close code says how
        finally:
            self.closed = f"closed {ws.close_code} {ws.close_reason or ''}".strip()
            self._notify()

    def _server_gone(self) -> str | None:
        return self.closed


class ForwardedCall(RealtimeClient):
    """A WebRTC call whose requests speak for ``address`` (``X-Forwarded-For``), as a trusted proxy's do."""

    def __init__(self, url: str, address: str, **options: Any) -> None:
        super().__init__(url, ice_loopback=True, headers={FORWARDED_FOR: address}, **options)
        self.address = address


Client = ForwardedSocket | ForwardedCall


def arrivals(client: Client) -> list[float]:
    return client.arrivals if isinstance(client, ForwardedSocket) else client.event_arrivals


def error_code(event: Event) -> str:
    error = event.get("error") or {}
    return str(error.get("code") or error.get("type") or "unknown")


def response_outcome(response: Event) -> str:
    status = str(response.get("status"))
    details = response.get("status_details") or {}
    reason = (details.get("error") or {}).get("code") or details.get("reason")
    return f"{status} ({reason})" if reason and status not in ANSWERED else status


async def configure(client: Client, session: Event, event_id: str = "configure",
                    timeout_s: float = HOSTILE_WAIT_S) -> str | None:
    """``session.update``; None once ``session.updated``, or the error code it got."""
    start = len(client.events)
    await client.send({"type": "session.update", "event_id": event_id, "session": session})
    answer = await client.wait_for(
        lambda event: event.get("type") == "session.updated"
        or (event.get("type") == "error" and (event.get("error") or {}).get("event_id") == event_id),
        start=start, timeout_s=timeout_s)
    return None if answer["type"] == "session.updated" else error_code(answer)


def user_text(text: str, event_id: str) -> Event:
    return {"type": "conversation.item.create", "event_id": event_id,
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleeps ``seconds`` unless stopped first; whether stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


# -- polite sessions --------------------------------------------------------------------------------


@dataclass
class Turn:
    """One polite turn: ``outcome`` "ok" or why it failed; milliseconds from ``response.create`` sent."""

    number: int
    outcome: str = "ok"
    first_text_ms: float | None = None
    first_audio_ms: float | None = None
    started_s: float | None = None  # into its phase


@dataclass
class PoliteSession:
    index: int
    address: str
    transport: Transport
    refused: str | None = None
    configure_error: str | None = None
    warm_up: Turn | None = None
    turns: list[Turn] = field(default_factory=list)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def first_arrival(client: Client, start: int, match: Callable[[Event], bool]) -> float | None:
    times = arrivals(client)
    return next((times[index] for index in range(start, len(client.events)) if match(client.events[index])), None)


def first_audible(call: ForwardedCall, frame_mark: int, after: float) -> float | None:
    return next((frame.arrived_at for frame in call.frames_since(frame_mark)
                 if frame.arrived_at >= after and frame.peak >= AUDIBLE_PEAK), None)


async def settle_turn(client: Client, start: int, *, cancel: bool) -> None:
    """After a failed turn: cancel it (when asked) and let its response end, so the next turn starts clean."""
    try:
        if cancel:
            await client.send({"type": "response.cancel"})
        if any(event.get("type") == "response.created" for event in client.events[start:]):
            await client.wait_for("response.done", start=start, timeout_s=10.0)
    except (TimeoutError, ClientError) as exc:
        logger.info("a failed turn did not end cleanly: %s", exc or type(exc).__name__)


async def polite_turn(client: Client, number: int, text: str, timeout_s: float, phase_start: float) -> Turn:
    start = len(client.events)
    frame_mark = client.frames_received if isinstance(client, ForwardedCall) else 0
    turn = Turn(number, started_s=round(time.monotonic() - phase_start, 2))
    ids = (f"item-{number}", f"create-{number}")
    try:
        await client.send(user_text(text, ids[0]))
        sent_at = time.monotonic()
        await client.send({"type": "response.create", "event_id": ids[1]})
        ended = await client.wait_for(
            lambda event: event.get("type") == "response.done"
            or (event.get("type") == "error" and (event.get("error") or {}).get("event_id") in ids),
            start=start, timeout_s=timeout_s)
    except TimeoutError:
        turn.outcome = f"no response.done within {timeout_s:.0f} s"
        await settle_turn(client, start, cancel=True)
        return turn
    except ClientError as exc:
        turn.outcome = f"session gone: {exc}"
        return turn
    if ended["type"] == "error":
        turn.outcome = f"error {error_code(ended)}"
        await settle_turn(client, start, cancel=False)
        return turn
    response = ended["response"]
    if response.get("status") not in ANSWERED:
        turn.outcome = f"response {response_outcome(response)}"
        return turn
    response_id = response.get("id")
    text_at = first_arrival(client, start, lambda event: event.get("type") in TEXT_DELTAS
                            and event.get("response_id") == response_id)
    if isinstance(client, ForwardedCall):
        if any(event.get("type") == "output_audio_buffer.started" for event in client.events[start:]):
            try:  # the answer plays in real time after response.done; its first frame may come later
                await client.wait_for(lambda event: event.get("type") in PLAYBACK_ENDED, start=start,
                                      timeout_s=timeout_s)
            except (TimeoutError, ClientError) as exc:
                turn.outcome = f"playback did not end: {exc or type(exc).__name__}"
        audio_at = first_audible(client, frame_mark, sent_at)
    else:
        audio_at = first_arrival(client, start, lambda event: event.get("type") == AUDIO_DELTA
                                 and event.get("response_id") == response_id)
    turn.first_text_ms = None if text_at is None else ms(text_at - sent_at)
    turn.first_audio_ms = None if audio_at is None else ms(audio_at - sent_at)
    return turn


def polite_client(url: str, transport: Transport, address: str, timeout_s: float) -> Client:
    if transport == "webrtc":
        return ForwardedCall(url, address, session=POLITE_SESSION, timeout_s=timeout_s)
    return ForwardedSocket(url, address, timeout_s=timeout_s)


async def polite_session(index: int, url: str, transport: Transport, args: argparse.Namespace,
                         phase_start: float, rng: random.Random) -> PoliteSession:
    """Connect, warm up, then ``args.turns`` turns; every turn past the phase's bound fails."""
    result = PoliteSession(index, POLITE_ADDRESS.format(index + 1), transport)
    deadline = phase_start + args.phase_seconds
    await asyncio.sleep(rng.uniform(0.0, 0.3))
    client = polite_client(url, transport, result.address, min(args.turn_timeout, CONNECT_TIMEOUT_S))
    try:
        try:
            await client.connect()
        except (Refused, ClientError, httpx.HTTPError, OSError, TimeoutError) as exc:
            result.refused = str(exc) if isinstance(exc, Refused) else call_refusal(exc)
            result.turns = [Turn(number, f"refused: {result.refused}") for number in range(1, args.turns + 1)]
            return result
        if transport == "websocket":
            try:
                result.configure_error = await configure(client, POLITE_SESSION, timeout_s=args.turn_timeout)
            except (ClientError, TimeoutError) as exc:
                result.configure_error = f"{type(exc).__name__}: {exc}"
        texts = POLITE_TEXTS[index:] + POLITE_TEXTS[:index]
        result.warm_up = await polite_turn(client, 0, texts[0], args.turn_timeout, phase_start)
        for number in range(1, args.turns + 1):
            await asyncio.sleep(rng.uniform(*PAUSE_S))
            left = deadline - time.monotonic()
            if left <= 0:
                result.turns.append(Turn(number, f"the phase's {args.phase_seconds:g} s were spent"))
                continue
            turn = await polite_turn(client, number, texts[number % len(texts)], min(args.turn_timeout, left),
                                     phase_start)
            result.turns.append(turn)
            if turn.outcome.startswith("session gone"):
                break
    except Exception as exc:  # recorded as the failure of its remaining turns: the run goes on
        logger.exception("polite session %d failed", index)
        result.turns.append(Turn(len(result.turns) + 1, f"client failed: {type(exc).__name__}: {exc}"[:200]))
    finally:
        await client.close()
    if len(result.turns) < args.turns:  # the session went (or the client failed): the rest fail alike
        gone = result.turns[-1].outcome if result.turns else "client failed"
        result.turns += [Turn(number, gone) for number in range(len(result.turns) + 1, args.turns + 1)]
    return result


async def polite_phase(url: str, transport: Transport, args: argparse.Namespace, seed: str) -> list[PoliteSession]:
    phase_start = time.monotonic()
    return list(await asyncio.gather(*(
        polite_session(index, url, transport, args, phase_start, random.Random(f"{args.seed}/{seed}/{index}"))
        for index in range(args.polite)
    )))


def values(sessions: list[PoliteSession], column: Literal["text", "audio"]) -> list[float]:
    """The column's milliseconds over every measured turn; a failed turn is infinitely slow, and an
    answered turn without that part (no text delta, no audio) is left out."""
    out = []
    for session in sessions:
        for turn in session.turns:
            value = turn.first_text_ms if column == "text" else turn.first_audio_ms
            if turn.outcome != "ok":
                out.append(math.inf)
            elif value is not None:
                out.append(value)
    return out


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest rank (no interpolation between turns)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 1)


def statistic(sessions: list[PoliteSession], column: Literal["text", "audio"]) -> dict[str, Any]:
    measured = sorted(values(sessions, column))
    if not measured:
        return {"turns": 0, "median_ms": None, "p90_ms": None, "failed": 0, "median_failed": True}
    median = statistics.median(measured)
    return {"turns": len(measured), "median_ms": finite(median), "p90_ms": finite(percentile(measured, 0.9)),
            "failed": sum(math.isinf(value) for value in measured), "median_failed": math.isinf(median)}


def rule(baseline: dict[str, Any], attacked: dict[str, Any]) -> dict[str, Any]:
    """The attack's median within 1.5 x the baseline's + 100 ms (None: no baseline to hold it to)."""
    if baseline["median_ms"] is None:
        return {"bound_ms": None, "holds": None}
    bound = RULE_FACTOR * baseline["median_ms"] + RULE_MARGIN_MS
    return {"bound_ms": round(bound, 1),
            "holds": attacked["median_ms"] is not None and attacked["median_ms"] <= bound}


def failures(sessions: list[PoliteSession]) -> dict[str, int]:
    reasons = collections.Counter(turn.outcome for session in sessions for turn in session.turns
                                  if turn.outcome != "ok")
    return dict(reasons.most_common())


# -- the hostile client (a process of its own) ------------------------------------------------------


@dataclass
class Tally:
    """What the hostile sent and got back: counts by kind, figures of its attack, notes."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error_messages: dict[str, str] = field(default_factory=dict)  # the first of each code

    def event(self, event: Event) -> None:
        kind = str(event.get("type"))
        self.counts[f"received {kind}"] += 1
        if kind == "error":
            code = error_code(event)
            self.counts[f"error {code}"] += 1
            self.error_messages.setdefault(code, str((event.get("error") or {}).get("message"))[:300])
        elif kind == "response.done":
            self.counts[f"response {response_outcome(event.get('response') or {})}"] += 1

    def sent(self, kind: str, count: int = 1) -> None:
        self.counts[f"sent {kind}"] += count

    def report(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"counts": dict(sorted(self.counts.items())), "figures": self.figures, "notes": self.notes,
                "error_messages": self.error_messages, "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}


Attack = Callable[[str, asyncio.Event, Tally, Callable[[], None], argparse.Namespace], Awaitable[None]]
SessionBody = Callable[[ForwardedSocket], Awaitable[None]]


def hostile_address(attack: str) -> str:
    """The attack's own client address: what one attack spends of a client's share or rate is not
    the next attack's to meet."""
    return HOSTILE_ADDRESSES.format(66 + ATTACKS.index(attack))


async def hostile_sessions(url: str, stop: asyncio.Event, tally: Tally, body: SessionBody, limit: int,
                           *, address: str) -> None:
    """``body`` on a fresh WebSocket session, and again on another when it returns or the server ends
    it, until stopped or ``limit`` sessions; a refused session is tried again a second later."""
    for _ in range(limit):
        if stop.is_set():
            break
        socket = ForwardedSocket(url, address, on_event=tally.event)
        try:
            await socket.connect()
        except Refused as exc:
            tally.counts[f"refused {exc}"] += 1
            await socket.close()
            await wait_or_stop(stop, 1.0)
            continue
        tally.counts["sessions opened"] += 1
        try:
            await body(socket)
        except ClientError as exc:
            tally.counts[f"session ended: {exc}"] += 1
        except TimeoutError:
            tally.counts[f"no answer within {HOSTILE_WAIT_S:g} s"] += 1
        finally:
            await socket.close()
    await stop.wait()


def system_tokens(instructions: str, tool: Tool) -> int:
    """The system message's exact Qwen tokens (a limit of 0 makes it count, never bound)."""
    return system_tokens_at_most(instructions, (tool,), limit=0)


async def fit_instructions(socket: ForwardedSocket, tally: Tally, instructions: str, margin_chars: int = 0) -> None:
    """``instructions`` and a tool whose description is the most punctuation the server still takes
    (binary search: a refused update changes nothing, so the session holds the largest one taken),
    less ``margin_chars`` (room for instructions changed later). Its refusals are counted apart
    from the attack's."""
    counted, socket.on_event = socket.on_event, None
    try:
        await _fit_instructions(socket, tally, instructions, margin_chars)
    finally:
        socket.on_event = counted


async def _fit_instructions(socket: ForwardedSocket, tally: Tally, instructions: str, margin_chars: int) -> None:
    def session(chars: int) -> Event:
        description = punctuation(chars, seed=2) if chars else "Unused."
        tool = {"type": "function", "name": "padding", "description": description,
                "parameters": {"type": "object", "properties": {}}}
        return {"instructions": instructions, "tools": [tool]}

    refused = []
    taken, over = 0, INSTRUCTION_CHARS + 1
    if (error := await configure(socket, session(0), "fit-0")) is not None:
        refused.append(error)
        instructions = instructions[: len(instructions) // 2]
        tally.notes.append(f"{INSTRUCTION_CHARS} characters of instructions refused ({error}); half of them sent")
        await configure(socket, session(0), "fit-half")
    for step in range(1, 9):
        chars = (taken + over) // 2
        error = await configure(socket, session(chars), f"fit-{step}")
        if error is None:
            taken = chars
        else:
            over = chars
            refused.append(error)
    if margin_chars and taken:
        taken = max(0, taken - margin_chars)
        await configure(socket, session(taken), "fit-margin")
    # As this checkout's server counts them (the server under test refused or took them as it counts).
    tool = Tool("padding", session(taken)["tools"][0]["description"], {"type": "object", "properties": {}})
    tokens = await asyncio.to_thread(system_tokens, instructions, tool)
    tally.figures.update({"instructions_chars": len(instructions), "tool_description_chars": taken,
                          "system_message_tokens": tokens,
                          "session_updates_refused_while_fitting": collections.Counter(refused)})


async def cancel_loop(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                      options: argparse.Namespace) -> None:
    responses = 0

    async def body(socket: ForwardedSocket) -> None:
        nonlocal responses
        await fit_instructions(socket, tally, punctuation(INSTRUCTION_CHARS, seed=1))
        while not stop.is_set():
            start = len(socket.events)
            event_id = f"create-{responses}"
            await socket.send({"type": "response.create", "event_id": event_id})
            tally.sent("response.create")
            ready()
            opened = await socket.wait_for(
                lambda event: event.get("type") == "response.created"
                or (event.get("type") == "error" and (event.get("error") or {}).get("event_id") == event_id),
                start=start, timeout_s=HOSTILE_WAIT_S)
            if opened["type"] == "error":
                await wait_or_stop(stop, 0.05)
                continue
            responses += 1
            await asyncio.sleep(CANCEL_AFTER_S)
            await socket.send({"type": "response.cancel"})
            tally.sent("response.cancel")
            await socket.wait_for("response.done", start=start, timeout_s=HOSTILE_WAIT_S)

    try:
        await hostile_sessions(url, stop, tally, body, SESSIONS_PER_ATTACK, address=hostile_address(options.hostile))
    finally:
        tally.figures["responses_started"] = responses
        tally.figures["headline"] = (f"{responses} responses started (instructions and tool: "
                                     f"{tally.figures.get('system_message_tokens', '?')} tokens)")


def pcm16_chunks(pcm24k: np.ndarray, chunk_ms: int = CHUNK_MS) -> list[str]:
    """24 kHz float audio as base64 PCM16 appends of ``chunk_ms`` each."""
    samples = (np.clip(pcm24k, -1.0, 1.0) * 32767).astype("<i2")
    step = chunk_ms * 24
    return [base64.b64encode(samples[offset:offset + step].tobytes()).decode("ascii")
            for offset in range(0, samples.size, step)]


def append(audio: str) -> Event:
    return {"type": "input_audio_buffer.append", "audio": audio}


async def speculation_loop(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                           options: argparse.Namespace) -> None:
    speech = pcm16_chunks(soxr.resample(read_wav(REPO / "tests" / "fixtures" / "hello.wav"), 16_000, 24_000))
    silence = pcm16_chunks(np.zeros(SPECULATION_PAUSE_MS * 24, dtype=np.float32))
    cycles = 0

    filler = punctuation(INSTRUCTION_CHARS - 16, seed=1)

    def instructions(version: str) -> str:
        """The first tokens changed: every speculation prefills them all."""
        return f"Version {version}. {filler}"

    async def body(socket: ForwardedSocket) -> None:
        nonlocal cycles
        # Room for the versions to come: a few characters each, against ~140 tokens of punctuation.
        await fit_instructions(socket, tally, instructions("0.0"), margin_chars=200)
        detection = {"type": "server_vad", "silence_duration_ms": SPECULATION_SILENCE_MS,
                     "speculative_response": True, "create_response": True}
        error = await configure(socket, {"audio": {"input": {"turn_detection": detection}}})
        if error is not None:
            tally.notes.append(f"the speculating session was refused: {error}")
        while not stop.is_set():
            for chunk in speech + silence:  # twice real time: the audio bucket takes it
                await socket.send(append(chunk))
                await asyncio.sleep(CHUNK_MS / 2000)
            tally.sent("input_audio_buffer.append", len(speech) + len(silence))
            for restart in range(SPECULATION_RESTARTS):
                await socket.send({"type": "session.update",
                                   "session": {"instructions": instructions(f"{cycles}.{restart}")}})
                await asyncio.sleep(SPECULATION_RESTART_S)
            tally.sent("session.update", SPECULATION_RESTARTS)
            await socket.send({"type": "input_audio_buffer.clear"})
            tally.sent("input_audio_buffer.clear")
            cycles += 1
            ready()

    try:
        await hostile_sessions(url, stop, tally, body, SESSIONS_PER_ATTACK, address=hostile_address(options.hostile))
    finally:
        tally.figures["utterances"] = cycles
        tally.figures["headline"] = f"{cycles} utterances, {cycles * (SPECULATION_RESTARTS + 1)} speculation chances"


async def transcription_flood(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                              options: argparse.Namespace) -> None:
    noise = pcm16_chunks(np.random.default_rng(45).normal(0.0, 0.1, NOISE_MS * 24).astype(np.float32), NOISE_MS)[0]
    commits = 0

    async def body(socket: ForwardedSocket) -> None:
        nonlocal commits
        transcription = {"model": "qwen3-omni", "partials": False}
        error = await configure(socket, {"audio": {"input": {"turn_detection": None, "transcription": transcription}}})
        if error is not None:
            tally.notes.append(f"transcription refused: {error}")
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not stop.is_set():
            await socket.send(append(noise))
            await socket.send({"type": "input_audio_buffer.commit"})
            commits += 1
            if commits == 1:
                ready()
            # 45 at once (90 events of the gate's burst of 100), 24 a second to 150, then 20 a second.
            if commits < TRANSCRIPTION_BURST:
                due = started
            elif commits < TRANSCRIPTION_FIRST:
                due = started + (commits - TRANSCRIPTION_BURST) / TRANSCRIPTION_FIRST_RATE
            else:
                due = (started + (TRANSCRIPTION_FIRST - TRANSCRIPTION_BURST) / TRANSCRIPTION_FIRST_RATE
                       + (commits - TRANSCRIPTION_FIRST) / TRANSCRIPTION_RATE)
            await asyncio.sleep(max(0.0, due - loop.time()))

    try:
        await hostile_sessions(url, stop, tally, body, SESSIONS_PER_ATTACK, address=hostile_address(options.hostile))
    finally:
        tally.sent("input_audio_buffer.commit", commits)
        completed = tally.counts["received conversation.item.input_audio_transcription.completed"]
        tally.figures["headline"] = f"{commits} commits sent, {completed} transcribed"


def redos_response_figures(events: list[Event], asked_at: float, done_at: float) -> dict[str, Any]:
    done = next((event for event in events if event.get("type") == "response.done"), None)
    output = (done or {}).get("response", {}).get("output") or []
    return {
        "seconds": round(done_at - asked_at, 2),
        "status": None if done is None else response_outcome(done["response"]),
        "output": [{"type": item.get("type"), "name": item.get("name"), "status": item.get("status"),
                    "arguments_chars": len(item.get("arguments") or "")} for item in output],
        "errors": [error_code(event) for event in events if event.get("type") == "error"],
    }


async def tool_redos_ws(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                        options: argparse.Namespace) -> None:
    attempts: list[dict[str, Any]] = []

    async def body(socket: ForwardedSocket) -> None:
        error = await configure(socket, {"tools": [catastrophic_pattern_tool(REDOS_TOOL)], "tool_choice": "auto"})
        if error is not None:
            tally.figures["tool_refused"] = error
            ready()
            await stop.wait()  # refused at session.update: nothing more to try
            return
        start = len(socket.events)
        await socket.send(user_text("Look the code up.", "ask"))
        asked_at = time.monotonic()
        await socket.send({"type": "response.create", "event_id": "call"})
        ready()
        await socket.wait_for("response.done", start=start, timeout_s=HOSTILE_WAIT_S)
        attempts.append(redos_response_figures(socket.events[start:], asked_at, time.monotonic()))
        await wait_or_stop(stop, asked_at + REDOS_INTERVAL_S - time.monotonic())

    try:
        await hostile_sessions(url, stop, tally, body, options.redos_attempts, address=hostile_address(options.hostile))
    finally:
        tally.figures["calls"] = attempts
        tally.figures["headline"] = redos_headline(tally, attempts)


def redos_headline(tally: Tally, attempts: list[dict[str, Any]]) -> str:
    if "tool_refused" in tally.figures:
        return f"tool refused: {tally.figures['tool_refused']}"
    seconds = ", ".join(f"{attempt['seconds']:g}" for attempt in attempts)
    failed = sum("failed" in attempt for attempt in attempts)
    return f"{len(attempts)} calls ({failed} failed), answered in {seconds} s"


async def tool_redos_rtc(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                         options: argparse.Namespace) -> None:
    attempts: list[dict[str, Any]] = []
    try:
        for _ in range(options.redos_attempts):
            if stop.is_set():
                break
            call = ForwardedCall(url, hostile_address(options.hostile), timeout_s=HOSTILE_WAIT_S)
            asked_at = time.monotonic()
            try:
                await call.connect()
                tally.counts["calls connected"] += 1
                error = await configure(call, {"tools": [catastrophic_pattern_tool(REDOS_TOOL)], "tool_choice": "auto"})
                if error is not None:
                    tally.figures["tool_refused"] = error
                    break
                start = len(call.events)
                await call.send(user_text("Look the code up.", "ask"))
                asked_at = time.monotonic()
                await call.send({"type": "response.create", "event_id": "call"})
                ready()
                await call.wait_for("response.done", start=start, timeout_s=HOSTILE_WAIT_S)
                attempts.append(redos_response_figures(call.events[start:], asked_at, time.monotonic()))
                await wait_or_stop(stop, asked_at + REDOS_INTERVAL_S - time.monotonic())
            except (ClientError, TimeoutError, httpx.HTTPError, OSError) as exc:
                tally.counts[f"call failed: {call_refusal(exc)}"] += 1
                attempts.append({"seconds": round(time.monotonic() - asked_at, 2), "failed": call_refusal(exc)})
            finally:
                await call.close()
                for event in call.events:
                    tally.event(event)
                if call.ended not in (None, "hung up"):
                    tally.counts[f"call ended: {call.ended}"] += 1
        ready()
        await stop.wait()
    finally:
        tally.figures["calls"] = attempts
        tally.figures["headline"] = redos_headline(tally, attempts)


async def append_flood(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                       options: argparse.Namespace) -> None:
    plain = json.dumps(append("!"))
    padded = plain[:-1] + " " * FLOOD_PADDING + "}"
    seconds = {"plain": 0.0, "padded": 0.0}

    async def body(socket: ForwardedSocket) -> None:
        socket.keep_events = False  # counted, not kept: tens of thousands of answers
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            for mode, message in (("plain", plain), ("padded", padded)):
                began = loop.time()
                sent = 0
                try:
                    while not stop.is_set() and loop.time() - began < FLOOD_SWITCH_S:
                        await socket.send_raw(message)
                        sent += 1
                        ready()
                        if sent % 20 == 0:
                            await asyncio.sleep(0)  # let the answers be read
                finally:  # counted also when the server ends the session mid-flood
                    tally.sent(f"append ({mode})", sent)
                    seconds[mode] += loop.time() - began

    try:
        await hostile_sessions(url, stop, tally, body, SESSIONS_PER_ATTACK, address=hostile_address(options.hostile))
    finally:
        answers = sum(value for key, value in tally.counts.items() if key.startswith("received "))
        rates = {mode: round(tally.counts[f"sent append ({mode})"] / spent) for mode, spent in seconds.items() if spent}
        tally.figures.update({"flood_seconds": {mode: round(spent, 1) for mode, spent in seconds.items()},
                              "sent_per_second": rates,
                              "answers_per_second": round(answers / max(sum(seconds.values()), 1e-9))})
        tally.figures["headline"] = (f"sent {rates.get('plain', 0)}/s plain, {rates.get('padded', 0)}/s padded; "
                                     f"{tally.figures['answers_per_second']} answers/s")


async def slot_filling(url: str, stop: asyncio.Event, tally: Tally, ready: Callable[[], None],
                       options: argparse.Namespace) -> None:
    held: list[ForwardedSocket] = []
    try:
        for _ in range(SLOTS):
            socket = ForwardedSocket(url, hostile_address(options.hostile), on_event=tally.event)
            try:
                await socket.connect()
            except Refused as exc:
                tally.counts[f"refused {exc}"] += 1
                await socket.close()
                continue
            held.append(socket)
        tally.figures["held"] = len(held)
        ready()
        await stop.wait()
    finally:
        ended = [socket.closed for socket in held if socket.closed]
        for reason in ended:
            tally.counts[f"ended by the server: {reason}"] += 1
        for socket in held:
            await socket.close()
    tally.figures["headline"] = f"held {len(held)} of {SLOTS} ({len(ended)} ended by the server)"


HOSTILES: dict[str, Attack] = {
    "cancel_loop": cancel_loop, "speculation_loop": speculation_loop, "transcription_flood": transcription_flood,
    "tool_redos_ws": tool_redos_ws, "tool_redos_rtc": tool_redos_rtc, "append_flood": append_flood,
    "slot_filling": slot_filling,
}


async def hostile_main(args: argparse.Namespace) -> None:
    """The hostile process: prints ``ready`` once its attack is under way, runs until a line (or EOF)
    on stdin or ``--hostile-seconds``, then prints ``result`` and its tally as JSON."""
    os.nice(HOSTILE_NICENESS)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def read_stop() -> None:
        sys.stdin.readline()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=read_stop, name="stop reader", daemon=True).start()
    said_ready = False

    def ready() -> None:
        nonlocal said_ready
        if not said_ready:
            said_ready = True
            print("ready", flush=True)

    tally = Tally()
    try:
        async with asyncio.timeout(args.hostile_seconds) as bound:

            async def hurry() -> None:
                """Once told to stop, the attack has ``STOP_GRACE_S`` to end what it waits for."""
                await stop.wait()
                bound.reschedule(min(bound.when() or math.inf, loop.time() + STOP_GRACE_S))

            hurrying = asyncio.create_task(hurry(), name="hurry")
            try:
                await HOSTILES[args.hostile](args.url, stop, tally, ready, args)
            finally:
                hurrying.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await hurrying
    except TimeoutError:
        tally.notes.append(f"cut short {STOP_GRACE_S:g} s after the stop, mid-wait" if stop.is_set()
                           else f"stopped by its own bound of {args.hostile_seconds:g} s")
    except Exception as exc:  # reported in its result: the run goes on to the next attack
        logger.exception("the hostile client failed")
        tally.notes.append(f"the hostile client failed: {type(exc).__name__}: {exc}"[:300])
    ready()
    print("result " + json.dumps(tally.report(), default=str), flush=True)


class Hostile:
    """The main process's handle on one hostile process."""

    def __init__(self, attack: str, url: str, args: argparse.Namespace, log: Path) -> None:
        self.attack = attack
        self._command = [sys.executable, __file__, "--hostile", attack, "--url", url,
                         "--hostile-seconds", str(args.hostile_seconds), "--redos-chars", str(args.redos_chars),
                         "--redos-attempts", str(args.redos_attempts)]
        self._log = log
        self._process: asyncio.subprocess.Process | None = None
        self.ready_after_s: float | None = None

    async def start(self, timeout_s: float) -> bool:
        """Starts it and waits until its attack is under way (False: it never said so in ``timeout_s``)."""
        started = time.monotonic()
        with self._log.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self._command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log)
        assert self._process.stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                while (line := await self._process.stdout.readline()) and line.strip() != b"ready":
                    pass
        except TimeoutError:
            return False
        if not line:
            return False  # it ended first: stop() reads why
        self.ready_after_s = round(time.monotonic() - started, 1)
        return True

    async def stop(self) -> dict[str, Any]:
        """Tells it to stop; its tally, or why there is none."""
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it ended already: its result is read below
            process.stdin.write(b"stop\n")
            await process.stdin.drain()
        result: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(120):
                while line := await process.stdout.readline():
                    if line.startswith(b"result "):
                        result = json.loads(line[len(b"result "):])
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
        if result is None:
            tail = self._log.read_text(errors="replace").splitlines()[-15:]
            result = {"counts": {}, "figures": {}, "notes": [f"no result (exit {process.returncode})", *tail]}
        result["ready_after_s"] = self.ready_after_s
        return result


# -- the server -------------------------------------------------------------------------------------


@contextlib.contextmanager
def serve(repo: Path, replies: Path, extra: list[str], media_workers: int, log: Path) -> Iterator[tuple[str, int]]:
    """``omni-rtc serve`` from ``repo`` (its own ``.venv`` when it has one); its URL and pid once healthy."""
    python = repo / ".venv" / "bin" / "python"
    port = free_port()
    command = [str(python) if python.exists() else sys.executable, "-m", "app.cli", "serve", "--port", str(port),
               "--device", "cpu", "--seed", "0", "--ice-loopback", "--log-level", "warning",
               "--generation", json.dumps({"max_audio_frames": DEV_MODEL_AUDIO_FRAMES}),
               "--dev-replies", str(replies), "--media-workers", str(media_workers),
               "--trusted-proxy", "127.0.0.1", "--allow-unauthenticated-public", *extra]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with log.open("wb") as out:
        server = subprocess.Popen(command, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server, deadline_s=600)  # the first start may build the dev model
        yield url, server.pid
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


_SAMPLE = re.compile(r"^(?P<key>[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (?P<value>\S+)$")
# Counters, and the engine's time by task: what moved during a phase.
_MOVED = re.compile(r"^omni_rtc_([a-z_]+_total|engine_turn_seconds_(sum|count))(\{|$)")


async def read_metrics(http: httpx.AsyncClient) -> dict[str, float]:
    """The server's ``/metrics`` samples by name and labels (empty when it does not answer)."""
    try:
        text = (await http.get("/metrics", timeout=METRICS_TIMEOUT_S)).text
    except httpx.HTTPError as exc:
        logger.warning("/metrics did not answer: %s", exc)
        return {}
    samples = {}
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is not None and not line.startswith("#"):
            with contextlib.suppress(ValueError):  # a value that is no number is no sample
                samples[sample["key"]] = float(sample["value"])
    return samples


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: round(after[key] - before.get(key, 0.0), 3) for key in sorted(after)
            if _MOVED.match(key) and abs(after[key] - before.get(key, 0.0)) > 1e-9}


def total(samples: dict[str, float], name: str) -> float:
    return sum(value for key, value in samples.items() if key == name or key.startswith(name + "{"))


async def settle(http: httpx.AsyncClient) -> float:
    """Waits until no session is open and no engine turn has finished for ``SETTLE_QUIET_S`` (a hostile's
    queued turns run on after it leaves); the seconds waited (at most ``SETTLE_LIMIT_S``)."""
    started = time.monotonic()
    last_turns, quiet_since = -1.0, time.monotonic()
    while time.monotonic() - started < SETTLE_LIMIT_S:
        samples = await read_metrics(http)
        turns = total(samples, "omni_rtc_engine_turn_seconds_count")
        if turns != last_turns:
            last_turns, quiet_since = turns, time.monotonic()
        idle = time.monotonic() - quiet_since >= SETTLE_QUIET_S
        if samples and total(samples, "omni_rtc_sessions_open") == 0 and idle:
            break
        await asyncio.sleep(0.5)
    return round(time.monotonic() - started, 1)


def cpu_seconds(pid: int) -> dict[str, float]:
    """The server process's CPU seconds and its living children's (the engine, the media workers)."""
    try:
        server = psutil.Process(pid)
        front = sum(server.cpu_times()[:2])
        children = 0.0
        for child in server.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # a worker that ended meanwhile
                children += sum(child.cpu_times()[:2])
    except psutil.NoSuchProcess:
        return {"front_s": math.nan, "children_s": math.nan}
    return {"front_s": front, "children_s": children}


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    return {key: finite(after[key] - before[key]) for key in after}


@dataclass
class Phase:
    """One phase's polite sessions and what the server did meanwhile."""

    sessions: list[PoliteSession]
    seconds: float
    settled_after_s: float
    metrics: dict[str, float]
    cpu_s: dict[str, float | None]

    def summary(self) -> dict[str, Any]:
        return {"text": statistic(self.sessions, "text"), "audio": statistic(self.sessions, "audio"),
                "failures": failures(self.sessions), "seconds": round(self.seconds, 1),
                "settled_after_s": self.settled_after_s, "cpu_s": self.cpu_s, "metrics_moved": self.metrics,
                "sessions": [dataclasses.asdict(session) for session in self.sessions]}


async def measure(url: str, http: httpx.AsyncClient, pid: int, transport: Transport, args: argparse.Namespace,
                  seed: str, hostile: Hostile | None) -> tuple[Phase, dict[str, Any] | None]:
    """Settle, then the polite sessions (beside ``hostile`` once its attack is under way)."""
    settled = await settle(http)
    metrics, cpu, began = await read_metrics(http), cpu_seconds(pid), time.monotonic()
    result: dict[str, Any] | None = None
    if hostile is not None and not await hostile.start(READY_TIMEOUT_S):
        logger.warning("%s: the hostile did not say its attack was under way; measuring anyway", hostile.attack)
    try:
        sessions = await polite_phase(url, transport, args, seed)
    finally:
        if hostile is not None:
            result = await hostile.stop()
    phase = Phase(sessions, time.monotonic() - began, settled, moved(metrics, await read_metrics(http)),
                  cpu_used(cpu, cpu_seconds(pid)))
    return phase, result


# -- the report -------------------------------------------------------------------------------------


def attack_result(transport: Transport, baseline: Phase, attacked: Phase, hostile: dict[str, Any]) -> dict[str, Any]:
    base, under = baseline.summary(), attacked.summary()
    rules = {column: rule(base[column], under[column]) for column in ("text", "audio")}
    holds = [rules[column]["holds"] for column in ("text", "audio")]
    verdict = "no baseline" if None in holds else "pass" if all(holds) else "fail"
    return {"polite_transport": transport, "baseline": base, "attack": under, "rule": rules,
            "verdict": verdict, "hostile": hostile}


def cell(summary: dict[str, Any]) -> str:
    if summary["turns"] == 0:
        return "-"
    median = "fail" if summary["median_failed"] else f"{summary['median_ms']:.0f}"
    p90 = "fail" if summary["p90_ms"] is None else f"{summary['p90_ms']:.0f}"
    return f"{median} ({p90})"


SPECULATIONS = re.compile(r'^omni_rtc_speculative_responses_total\{outcome="([a-z_]+)"\}$')


def hostile_brief(hostile: dict[str, Any], server_moved: dict[str, float]) -> str:
    """The hostile's headline, its errors, refusals and ends by kind, and the speculations the server started."""
    counts: dict[str, int] = hostile.get("counts", {})
    kinds = ("error ", "refused ", "session ended", "call ended", "call failed", "ended by the server")
    parts = [f"{key} ×{value}" for key, value in counts.items() if key.startswith(kinds)]
    speculations = [f"{found[1]} {value:g}" for key, value in server_moved.items()
                    if (found := SPECULATIONS.match(key))]
    if speculations:
        parts.append("server speculations: " + ", ".join(speculations))
    headline = hostile.get("figures", {}).get("headline")
    notes = [note for note in hostile.get("notes", []) if note.startswith(("stopped", "cut short", "no result", "the hostile"))]
    return "; ".join(([headline] if headline else []) + parts + notes).replace("|", "/") or "-"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| attack | polite | first text ms p50 (p90): baseline | attack | bound | first audio ms p50 (p90): baseline "
        "| attack | bound | rule | polite failures | hostile got |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for attack, result in results.items():
        base, under, rules = result["baseline"], result["attack"], result["rule"]
        bounds = ["-" if rules[column]["bound_ms"] is None else f"{rules[column]['bound_ms']:.0f}"
                  for column in ("text", "audio")]
        failed = "; ".join(f"{reason} ×{count}" for reason, count in under["failures"].items()) or "0"
        lines.append(
            f"| {attack} | {result['polite_transport']} | {cell(base['text'])} | {cell(under['text'])} | {bounds[0]} "
            f"| {cell(base['audio'])} | {cell(under['audio'])} | {bounds[1]} | {result['verdict']} "
            f"| {failed.replace('|', '/')} | {hostile_brief(result['hostile'], under['metrics_moved'])} |")
    return "\n".join(lines)


def checkout(repo: Path) -> dict[str, Any]:
    def git(*arguments: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *arguments], capture_output=True, text=True).stdout.strip()

    return {"path": str(repo), "commit": git("rev-parse", "HEAD") or None, "branch": git("branch", "--show-current"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


async def run(args: argparse.Namespace, url: str, pid: int, logs: Path) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=METRICS_TIMEOUT_S) as http:
        for attack in args.attacks:
            transport: Transport = "webrtc" if attack in POLITE_OVER_WEBRTC else "websocket"
            print(f"{attack}: baseline, {args.polite} polite {transport} sessions", flush=True)
            baseline, _ = await measure(url, http, pid, transport, args, f"{attack}/baseline", None)
            print(f"{attack}: attack", flush=True)
            hostile = Hostile(attack, url, args, logs / f"hostile_{attack}.log")
            attacked, hostile_result = await measure(url, http, pid, transport, args, f"{attack}/attack", hostile)
            results[attack] = attack_result(transport, baseline, attacked, hostile_result or {})
            print(table({attack: results[attack]}).splitlines()[-1], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose server runs (default: this one)")
    parser.add_argument("--label", default="", help="recorded in the result (before, after...)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--polite", type=int, default=4, help="polite sessions per phase")
    parser.add_argument("--turns", type=int, default=6, help="measured turns per polite session (after a warm-up)")
    parser.add_argument("--turn-timeout", type=float, default=30.0,
                        help="seconds a polite turn may take before it fails")
    parser.add_argument("--phase-seconds", type=float, default=75.0, help="a phase's polite turns after this fail")
    parser.add_argument("--hostile-seconds", type=float, default=150.0,
                        help="a hostile client stops by itself after this")
    parser.add_argument("--redos-chars", type=int, default=27, help="letters in the ReDoS tool call's argument")
    parser.add_argument("--redos-attempts", type=int, default=20,
                        help="tool_redos_*: sessions (calls) calling the tool, one every 2 s at most, until stopped")
    parser.add_argument("--media-workers", type=int, default=2)
    parser.add_argument("--server-args", default="", help="extra `omni-rtc serve` flags, one string")
    parser.add_argument("--seed", type=int, default=45)
    # The hostile process (started by the bench itself).
    parser.add_argument("--hostile", choices=ATTACKS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.hostile:
        asyncio.run(hostile_main(args))
        return
    args.repo = args.repo.resolve()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fair-share-") as scratch:
        logs = Path(scratch)
        replies = logs / "replies.json"
        replies.write_text(json.dumps([forced_tool_call(REDOS_TOOL, {"code": "a" * args.redos_chars})]))
        server_log = logs / "server.log"
        try:
            with serve(args.repo, replies, shlex.split(args.server_args), args.media_workers, server_log) as (url, pid):
                results = asyncio.run(run(args, url, pid, logs))
        except BaseException:
            if server_log.exists():
                print("the server's log ends:", *server_log.read_text(errors="replace").splitlines()[-15:],
                      sep="\n  ", file=sys.stderr)
            raise
        server_tail = server_log.read_text(errors="replace").splitlines()[-40:]
    summary = table(results)
    print(summary)
    write_report(args.out, {
        "benchmark": "fair_share",
        "label": args.label,
        "command": " ".join([".venv/bin/python", "tests/bench/fair_share.py", *sys.argv[1:]]),
        "args": {key: str(value) for key, value in vars(args).items() if key not in ("hostile", "url")},
        "server": {"checkout": checkout(args.repo), "media_workers": args.media_workers,
                   "server_args": args.server_args, "log_tail": server_tail},
        "rule": f"attack median <= {RULE_FACTOR:g} x baseline median + {RULE_MARGIN_MS:g} ms, "
                "first text and first audio",
        "machine": machine(),
        "seconds": round(time.monotonic() - started, 1),
        "all_pass": all(result["verdict"] == "pass" for result in results.values()),
        "table": summary,
        "attacks": results,
    })


if __name__ == "__main__":
    main()
