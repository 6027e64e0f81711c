"""The event gate: admits client events by size and by rate, before they are parsed, and says
how the refusals are answered.

A refused event gets a :class:`Rejection`, which the session answers with an ``error`` event;
the session goes on. An event pays the rate's bucket one token per ``max_bytes`` it holds (at most
a burst), refused ones too; an image event may be larger, but what it holds beside its images is
held to ``max_bytes`` once parsed. Audio appends pay by their audio (``app.realtime.input``), not
here; an event that only looked like one pays once parsed (:meth:`EventGate.admit_parsed`). A
session whose client is held to a share pays its client's bucket too (``app.token_bucket``, one per
client across its sessions, twice a session's size: :meth:`EventRate.for_client`), and is refused
by either, the refusal naming which. The bounds and why: docs/HARDENING.md, "Limits".

Refusals for a bound (the event rate, appends faster than real time, an event too large:
``BOUND_CODES``) are answered with an ``error`` each up to ``REPLY_BURST`` at once and
``REPLIES_PER_SECOND`` after (:class:`RefusalReplies`; every other mistake is answered, within the
event rate): a hostile client sent 23,000 malformed appends a second, and answering each cost the
server more than refusing it (~17,000 error events a second; another visitor's first words came
230 ms late against 20). The next reply says how many went unanswered. A client that has had
``FLOOD_REFUSALS`` events refused within ``FLOOD_WINDOW_S`` is flooding: its session ends
(``rate_limit_exceeded``, then the transport closes). No client that heeds a refusal comes near
it: the event rate allows 50 a second.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.realtime.protocol import APPEND_EVENT_TYPE
from app.token_bucket import TokenBucket

_APPEND_MARK = APPEND_EVENT_TYPE
# What an append may carry beside its audio: its type, an event_id and JSON's punctuation take
# ~100 bytes (openai-python, the page, DashScope's SDK).
APPEND_ENVELOPE_BYTES = 1_024
_APPEND_MARK_BYTES = APPEND_EVENT_TYPE.encode()


# A session's event rate, by default (Settings.max_events_per_second, max_event_burst).
MAX_EVENTS_PER_SECOND = 50.0
MAX_EVENT_BURST = 100
# A client's, across its sessions (up to --max-sessions-per-client, 4): twice a session's rate and
# burst. One person rarely keeps more than two sessions busy at once (a tab speaking, one more
# answering); four sessions at a session's rate each would let one address send 200 events a second.
CLIENT_EVENT_FACTOR = 2

# Whose event rate refused an event: the session's own, or its client's across its sessions.
RateLimit = Literal["session", "client"]
# A refusal's report (metrics): which limit refused an event.
RateObserver = Callable[[RateLimit], None]


@dataclass(frozen=True)
class EventRate:
    """A bucket's size: ``burst`` events at once, refilled at ``per_second``."""

    per_second: float = MAX_EVENTS_PER_SECOND
    burst: int = MAX_EVENT_BURST

    def for_client(self) -> EventRate:
        """A client's, across its sessions, when each of them has this size."""
        return EventRate(CLIENT_EVENT_FACTOR * self.per_second, CLIENT_EVENT_FACTOR * self.burst)

    def bucket(self, *, clock: Callable[[], float] = time.monotonic) -> TokenBucket:
        """A bucket of this size: a session's (its gate's own), or a client's (kept per client
        across its sessions, ``app.realtime.shares.ClientShares``)."""
        return TokenBucket(self.burst, self.per_second, clock=clock)


@dataclass(frozen=True)
class Rejection:
    """Why one client event was refused; the session answers with an ``error`` event."""

    code: str
    message: str


class EventGate:
    """Admits client events by size and by rate (a token bucket, and its client's when it has
    one), before they are parsed."""

    def __init__(
        self,
        *,
        max_bytes: int,
        per_second: float,
        burst: int,
        max_image_event_bytes: int | None = None,
        client: TokenBucket | None = None,
        on_refused: RateObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``client``: the bucket of the session's client, shared with its other sessions (None:
        the session's own rate only); ``on_refused``: each event the rate refused, by its limit."""
        self._max_bytes = max_bytes
        self._max_image_event_bytes = max(max_bytes, max_image_event_bytes or 0)
        self._own = EventRate(per_second, burst).bucket(clock=clock)
        self._client = client
        self._on_refused = on_refused

    def admit(self, raw: str | bytes) -> Rejection | None:
        """Before parsing: the size of every event; the rate of every event that cannot be an audio append."""
        size = _size(raw)
        if size <= self._max_bytes and _may_be_append(raw):
            return None  # rated by its audio once decoded, or by admit_parsed if it is no append
        return self._charge(size)  # a larger one is refused once parsed (an append has no image)

    def admit_parsed(self, raw: str | bytes, *, audio_chars: int | None) -> Rejection | None:
        """Once parsed (or refused by the parser): an event :meth:`admit` let through as a possible
        append that is not one (``audio_chars`` None) pays its tokens now, and so does an append
        that carries more than ``APPEND_ENVELOPE_BYTES`` beside its ``audio_chars`` of audio,
        which is refused: the audio bucket bounds an append's audio, not what pads it."""
        size = _size(raw)
        if size > self._max_bytes or not _may_be_append(raw):
            return None  # an event admit() charged already
        if audio_chars is None:
            return self._charge(size)
        if size - audio_chars <= APPEND_ENVELOPE_BYTES:
            return None  # an append: rated by its audio once decoded
        return self._charge(size) or Rejection(
            "invalid_value",
            f"An input_audio_buffer.append carries its audio and an event_id: {size - audio_chars} bytes "
            f"beside the audio is more than {APPEND_ENVELOPE_BYTES}; this event was dropped.",
        )

    def _charge(self, size: int) -> Rejection | None:
        # What receiving it cost, as many events of max_bytes: one past the largest event the
        # session takes pays as much as that one (it is refused unread; its frame was bounded).
        cost = max(1, math.ceil(min(size, self._max_image_event_bytes) / self._max_bytes))
        buckets: list[tuple[RateLimit, TokenBucket]] = [("session", self._own)]
        if self._client is not None:
            buckets.append(("client", self._client))
        # Both buckets pay, or neither (a refused event is dropped); the session's limit is named first.
        for limit, bucket in buckets:
            if not bucket.holds(min(cost, bucket.burst)):
                if self._on_refused is not None:
                    self._on_refused(limit)
                return _rate_refusal(limit, bucket)
        for _, bucket in buckets:
            bucket.take(min(cost, bucket.burst))
        if size > self._max_image_event_bytes:
            return too_large(size, self._max_bytes, self._max_image_event_bytes)
        return None

    def refuse_large(self, raw: str | bytes, *, image_chars: int = 0) -> Rejection | None:
        """Once parsed: an event whose size less its ``image_chars`` (its ``input_image`` data
        URLs) is over ``max_bytes`` is refused."""
        size = _size(raw)
        if size - image_chars <= self._max_bytes:
            return None
        return too_large(size, self._max_bytes, self._max_image_event_bytes)


def _rate_refusal(limit: RateLimit, bucket: TokenBucket) -> Rejection:
    whose = "from this session" if limit == "session" else "from this client's sessions together"
    return Rejection(
        "rate_limit_exceeded",
        f"More than {bucket.per_second:g} events per second (bursts of {bucket.burst:g}) {whose} (the {limit} limit); "
        "this event was dropped. Audio appends are not counted: they are bounded by their duration.",
    )


def _size(raw: str | bytes) -> int:
    return len(raw) if isinstance(raw, bytes) or raw.isascii() else len(raw.encode())


def _may_be_append(raw: str | bytes) -> bool:
    return (_APPEND_MARK_BYTES in raw) if isinstance(raw, bytes) else (_APPEND_MARK in raw)


def too_large(size: int, max_bytes: int, max_image_event_bytes: int) -> Rejection:
    if max_image_event_bytes <= max_bytes:
        return Rejection("event_too_large", f"Event is {size} bytes; the limit is {max_bytes}.")
    return Rejection(
        "event_too_large",
        f"Event is {size} bytes; the limit is {max_bytes}, besides the input_image data URLs of a "
        f"conversation.item.create (at most {max_image_event_bytes} in all).",
    )


# The errors that refuse an event for a bound, not for what it says.
BOUND_CODES = frozenset({"rate_limit_exceeded", "input_audio_too_fast", "event_too_large"})
REPLY_BURST = 20
REPLIES_PER_SECOND = 2.0
FLOOD_REFUSALS = 1_000
FLOOD_WINDOW_S = 10.0


@dataclass(frozen=True)
class Refusal:
    """What to do about one refused event: ``reply`` with an error (noting ``unanswered`` refusals
    before it), and whether the client is ``flooding`` (its session ends)."""

    reply: bool
    unanswered: int
    flooding: bool


class RefusalReplies:
    """One session's refused events: which to answer, and when they are a flood."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._replies = TokenBucket(REPLY_BURST, REPLIES_PER_SECOND, clock=clock)
        self._unanswered = 0
        self._recent: deque[float] = deque()  # times of the refusals within the flood window

    def refused(self) -> Refusal:
        now = self._clock()
        self._recent.append(now)
        while self._recent and self._recent[0] <= now - FLOOD_WINDOW_S:
            self._recent.popleft()
        flooding = len(self._recent) >= FLOOD_REFUSALS
        if not self._replies.take(1) and not flooding:
            self._unanswered += 1
            return Refusal(reply=False, unanswered=0, flooding=False)
        unanswered, self._unanswered = self._unanswered, 0
        return Refusal(reply=True, unanswered=unanswered, flooding=flooding)
