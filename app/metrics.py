"""Prometheus metrics: one registry per app, fed by the call glue and an engine wrapper.

The numbers come from what the glue already sees:

- the server events a session sends (``response.done`` status, ``error`` type, the speech
  and playback events whose wall-clock spacing is the user-facing latency), read by a
  per-call :class:`CallMetrics`;
- the engine's own ``GenerationDone.timings`` (queue wait, time to first Thinker token), read by
  :class:`app.serving.engines.MeteredEngine`, which wraps the shared engine the sessions are given;
- three session callbacks: ``on_ignored_speech`` (an utterance half-duplex did not act on),
  counted in ``ignored_speech``; ``on_speculation`` (each speculative answer's outcome and
  the engine time thrown away, ``app.realtime.speculation``), counted by :meth:`Metrics.speculation`;
  ``on_partial_transcript`` (each partial transcript's outcome and engine time,
  ``app.realtime.transcription``), counted by :meth:`Metrics.partial_transcript`;
- each WebRTC call's network samples (``app.transports.webrtc.network.CallNetwork``, every second and once
  at the end): packet and frame counters as they move, and per-call summaries (loss, jitter,
  RTT) when the call ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from app.realtime.gate import RateLimit
from app.realtime.interruption import InterruptionOutcome
from app.realtime.protocol import (
    InputAudioBufferCommittedEvent,
    InputAudioBufferSpeechStoppedEvent,
    OutputAudioBufferStartedEvent,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
    event_type,
)
from app.realtime.shares import RefusedWork, ShareLimit
from app.transports.webrtc.network import NetworkFigures
from media.pacing import LATENESS_BUCKETS_S, PacingStats
from media.rates import SPEECH_RATE

_SESSION_CONFIGURED = (event_type(SessionCreatedEvent), event_type(SessionUpdatedEvent))
_SPEECH_STOPPED = event_type(InputAudioBufferSpeechStoppedEvent)
_COMMITTED = event_type(InputAudioBufferCommittedEvent)
_RESPONSE_CREATED = event_type(ResponseCreatedEvent)
_AUDIO_STARTED = event_type(OutputAudioBufferStartedEvent)
_RESPONSE_DONE = event_type(ResponseDoneEvent)

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Seconds. Voice latency matters from ~100 ms (noticeable) to tens of seconds (CPU dev model
# under load); turn durations run up to minutes for long answers.
LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
TRANSPORTS = ("webrtc", "websocket")
# A call's share of packets lost: phone-call quality ends around 5 %, 20 % is barely usable.
LOSS_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Seconds: jitter of Wi-Fi and mobile links runs from a few ms to ~100 ms; RTT up to ~1 s.
JITTER_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2)
RTT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)
SPECULATION_OUTCOMES = ("started", "used", "discarded", "refused", "preempted")
PARTIAL_OUTCOMES = ("started", "done", "superseded", "cancelled", "refused", "preempted", "failed")
SHARE_LIMITS: tuple[ShareLimit, ...] = ("session", "client")
REFUSED_WORK: tuple[RefusedWork, ...] = ("response", "speculative_response", "partial_transcript")
RATE_LIMITS: tuple[RateLimit, ...] = ("session", "client")


# Prompt tokens one session has the engine prefill: a short chat (a few turns of ~1,000), a long
# one, up to a session looping response.create on 16,000 tokens of instructions.
SESSION_TOKEN_BUCKETS = (1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000, 4_000_000)


class Metrics:
    """Every metric of one server; ``render()`` is the ``/metrics`` body."""

    def __init__(self, worker: str = "0") -> None:
        """``worker``: the name this process's pacing is reported under (a media worker's index)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.pacing = PacingStats()  # every call's outbound track in this process reports here
        # Each media worker's PacingStats.snapshot() by worker name: by default this process's own;
        # a front process with media workers replaces it with their latest reports.
        self.pacing_snapshots: Callable[[], dict[str, dict[str, Any]]] = lambda: {worker: self.pacing.snapshot()}
        r.register(_PacingCollector(lambda: self.pacing_snapshots()))
        # transport: "webrtc" (POST /v1/realtime/calls) or "websocket" (GET /v1/realtime).
        self.sessions_open = Gauge(
            "omni_rtc_sessions_open", "Open sessions, by transport.", ["transport"], registry=r
        )
        for transport in TRANSPORTS:
            self.sessions_open.labels(transport=transport).set(0)
        self.calls = Counter(
            "omni_rtc_calls", "Sessions ended, by transport and why they ended.", ["transport", "reason"], registry=r
        )
        self.turns = Counter(
            "omni_rtc_turns", "Responses finished, by transport and response.done status.", ["transport", "status"],
            registry=r,
        )
        self.errors = Counter(
            "omni_rtc_errors", "Errors by type: error events sent, engine and signaling failures.",
            ["type", "code"], registry=r,
        )
        self.ignored_speech = Counter(
            "omni_rtc_ignored_speech",
            "Utterances half-duplex did not act on: the user (or the answer's echo) spoke while an "
            "answer was being given or played. Reported by the session (on_ignored_speech).",
            registry=r,
        )
        self.false_interruptions_resumed = Counter(
            "omni_rtc_false_interruptions_resumed",
            "Answers paused by speech over them (a cough, a knock, a backchannel, their own echo) that "
            "played on because it was not an interruption (app/realtime/interruption.py).",
            registry=r,
        )
        self.backchannels_ignored = Counter(
            "omni_rtc_backchannels_ignored",
            "Utterances over an answer that ended before they were confirmed as an interruption "
            '("mm-hmm", "okay"): not turns, not answered.',
            registry=r,
        )
        self.echo_suppressed = Counter(
            "omni_rtc_echo_suppressed_seconds",
            "Seconds of WebRTC input heard while an answer played whose level the echo canceller cut by "
            "10 dB or more: the answer's own echo, taken out before the VAD (media/echo_canceller.py).",
            registry=r,
        )
        self.speculative_responses = Counter(
            "omni_rtc_speculative_responses",
            "Answers started at a candidate end of turn and held until the commit, by outcome: started; "
            "then used (the commit released it), discarded (speech resumed, the turn it answered changed, "
            "or the session closed), refused (no spare engine capacity) or preempted (a committed turn "
            "needed its engine slot).",
            ["outcome"], registry=r,
        )
        for outcome in SPECULATION_OUTCOMES:
            self.speculative_responses.labels(outcome=outcome)
        self.speculative_discarded_engine = Counter(
            "omni_rtc_speculative_discarded_engine_seconds",
            "Engine time spent on speculative answers (and their held transcriptions) that were thrown "
            "away: from each one's start to its cancel (or its end, for one that finished first).",
            registry=r,
        )
        self.partial_transcripts = Counter(
            "omni_rtc_partial_transcripts",
            "Transcriptions of the utterance so far while the user speaks, by outcome: started; then done "
            "(ended by itself: shown when it says something new), superseded (a newer one was due), "
            "cancelled (the commit, a clear, or transcription turned off), refused (no spare engine "
            "capacity), preempted (a committed turn needed its slot) or failed.",
            ["outcome"], registry=r,
        )
        for outcome in PARTIAL_OUTCOMES:
            self.partial_transcripts.labels(outcome=outcome)
        self.partial_transcript_engine = Counter(
            "omni_rtc_partial_transcript_engine_seconds",
            "Engine time spent on partial transcripts, shown or not: from each one's start to its end or cancel.",
            registry=r,
        )
        self.session_engine_tokens = Histogram(
            "omni_rtc_session_engine_tokens",
            "Per session, observed when it closes: the prompt tokens its work had the engine prefill "
            "(answers, cancelled or not, speculative answers, transcriptions, partial transcripts; "
            "app/realtime/shares.py). A session far right of the rest is the greedy one.",
            buckets=SESSION_TOKEN_BUCKETS, registry=r,
        )
        # By limit, not by client: an address per label would name visitors and grow without bound.
        self.engine_share_refusals = Counter(
            "omni_rtc_engine_share_refusals",
            "Work the engine share refused, by the limit that refused it (session: the session's own "
            "share; client: its client's, across its sessions) and the work: response (a client's "
            "response.create, answered engine_share_exceeded), speculative_response or partial_transcript "
            "(throw-away work, skipped). app/realtime/shares.py.",
            ["limit", "work"], registry=r,
        )
        for limit in SHARE_LIMITS:
            for work in REFUSED_WORK:
                self.engine_share_refusals.labels(limit=limit, work=work)
        self.event_rate_refusals = Counter(
            "omni_rtc_event_rate_refusals",
            "Client events the event rate refused (rate_limit_exceeded, answered or not), by the limit that "
            "refused them (session: the session's own rate; client: its client's, across its sessions). "
            "app/realtime/gate.py.",
            ["limit"], registry=r,
        )
        for rate_limit in RATE_LIMITS:
            self.event_rate_refusals.labels(limit=rate_limit)
        self.end_of_utterance_delay = Histogram(
            "omni_rtc_end_of_utterance_delay_seconds",
            "From the end of speech to the server VAD's speech_stopped: the session's silence wait "
            "plus the input audio received while the VAD caught up.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.time_to_first_audio = Histogram(
            "omni_rtc_time_to_first_audio_seconds",
            "From speech_stopped (or commit, or response.created for text turns) to the first "
            "answer audio sent on the outbound track. Plus the end-of-utterance delay: what the user waits.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.thinker_first_token = Histogram(
            "omni_rtc_thinker_first_token_seconds",
            "Engine: from turn submission to the first Thinker text token (includes queue wait); "
            "task: respond (an answer) or transcribe (input transcription).",
            ["task"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.engine_first_audio = Histogram(
            "omni_rtc_engine_first_audio_seconds",
            "Engine: from turn submission to the answer's first audio chunk (includes queue wait); "
            "for a vLLM-Omni engine, from sending the request to its first audio chunk.",
            ["task"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.engine_queue_wait = Histogram(
            "omni_rtc_engine_queue_wait_seconds",
            "Engine: time a turn waited for the engine before it started; task: respond or transcribe.",
            ["task"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.engine_turn = Histogram(
            "omni_rtc_engine_turn_seconds",
            "Engine: each turn's time from submission to its end (done, cancelled or failed), queue wait "
            "included; task: respond, transcribe or end_of_turn. Its sum is the engine time turns took.",
            ["task"], buckets=DURATION_BUCKETS, registry=r,
        )
        self.turn_duration = Histogram(
            "omni_rtc_turn_duration_seconds",
            "From response.created to response.done.",
            buckets=DURATION_BUCKETS, registry=r,
        )
        self.inbound_packets = Counter(
            "omni_rtc_inbound_audio_packets",
            "Peers' audio packets, by outcome: received (in time or not), lost (never arrived), "
            "late (arrived after their frame was concealed; dropped), overrun (sent faster than real time, "
            "arrived with 500 packets waiting; dropped).",
            ["outcome"], registry=r,
        )
        self.inbound_frames_repaired = Counter(
            "omni_rtc_inbound_audio_frames_repaired",
            "20 ms frames of peers' audio missing at their playout deadline, by how they were filled: "
            "fec (from the next packet's in-band FEC) or plc (Opus packet loss concealment).",
            ["method"], registry=r,
        )
        self.call_packet_loss = Histogram(
            "omni_rtc_call_packet_loss_ratio",
            "Per WebRTC call, at its end: the share of audio packets lost; inbound (the peer's, counted "
            "by the server) or outbound (the server's, from the peer's RTCP receiver reports).",
            ["direction"], buckets=LOSS_BUCKETS, registry=r,
        )
        self.call_jitter = Histogram(
            "omni_rtc_call_jitter_seconds",
            "Per WebRTC call, at its end: RFC 3550 interarrival jitter of the peer's audio packets.",
            buckets=JITTER_BUCKETS, registry=r,
        )
        self.call_rtt = Histogram(
            "omni_rtc_call_rtt_seconds",
            "Per WebRTC call, at its end: the last round-trip time measured from RTCP reports "
            "(calls that never measured one are not counted).",
            buckets=RTT_BUCKETS, registry=r,
        )

    def render(self, others: list[list[FamilySamples]] | None = None) -> bytes:
        """The exposition text; ``others``: other processes' :meth:`samples`, summed in by name and labels.

        Summing is right for every metric here: counters and histograms of different processes
        add up, and the one gauge of counts (open sessions) too.
        """
        if not others:
            return generate_latest(self.registry)
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_MergedCollector([self.samples(), *others]))
        return generate_latest(merged)

    def samples(self) -> list[FamilySamples]:
        """Every metric's samples as plain data, to send to the process that serves /metrics."""
        return [
            (family.name, family.type, family.documentation,
             # _created (a timestamp per process) does not add up; Prometheus does without it.
             [(sample.name, dict(sample.labels), sample.value) for sample in family.samples
              if not sample.name.endswith("_created")])
            for family in self.registry.collect()
        ]

    def speculation(self, outcome: str | None, engine_seconds: float) -> None:
        """A session's speculation report (``app.realtime.speculation.OutcomeObserver``)."""
        if outcome is not None:
            self.speculative_responses.labels(outcome=outcome).inc()
        if engine_seconds > 0:
            self.speculative_discarded_engine.inc(engine_seconds)

    def share_refused(self, limit: ShareLimit, work: RefusedWork) -> None:
        """A session's report of work its engine share refused (``app.realtime.shares.RefusalObserver``)."""
        self.engine_share_refusals.labels(limit=limit, work=work).inc()

    def rate_refused(self, limit: RateLimit) -> None:
        """A session's report of a client event its event rate refused (``app.realtime.gate.RateObserver``)."""
        self.event_rate_refusals.labels(limit=limit).inc()

    def interruption(self, outcome: InterruptionOutcome) -> None:
        """A session's report of speech over an answer (``app.realtime.interruption``)."""
        match outcome:
            case "resumed":
                self.false_interruptions_resumed.inc()
            case "backchannel":
                self.backchannels_ignored.inc()

    def partial_transcript(self, outcome: str, engine_seconds: float) -> None:
        """A session's partial transcript report (``app.realtime.transcription.PartialObserver``)."""
        self.partial_transcripts.labels(outcome=outcome).inc()
        if engine_seconds > 0:
            self.partial_transcript_engine.inc(engine_seconds)

    def set_open_sessions(self, counts: dict[str, int]) -> None:
        for transport in TRANSPORTS:
            self.sessions_open.labels(transport=transport).set(counts.get(transport, 0))

    def observer(self, clock: Callable[[], float] = time.monotonic, *, transport: str = "webrtc") -> CallMetrics:
        return CallMetrics(self, clock, transport)


# (family name, type, help, [(sample name, labels, value)]): one metric family as plain data.
FamilySamples = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


class _MergedCollector:
    """Several processes' families, samples with the same name and labels summed."""

    def __init__(self, sources: list[list[FamilySamples]]) -> None:
        self._sources = sources

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for source in self._sources:
            for name, kind, documentation, samples in source:
                if name not in families:
                    families[name] = Metric(name, documentation, kind)
                    sums[name] = {}
                totals = sums[name]
                for sample_name, labels, value in samples:
                    key = (sample_name, tuple(sorted(labels.items())))
                    totals[key] = totals.get(key, 0.0) + value
        for name, family in families.items():
            for (sample_name, label_pairs), value in sums[name].items():
                family.add_sample(sample_name, dict(label_pairs), value)
        return list(families.values())


class _PacingCollector:
    """Each media worker's outbound pacing (``PacingStats.snapshot()``), read at scrape time.

    Counting happens in ``media.pacing`` with plain integers per frame; the Prometheus families
    are built only when ``/metrics`` is read.
    """

    def __init__(self, snapshots: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._snapshots = snapshots

    def collect(self) -> list[Metric]:
        lateness = HistogramMetricFamily(
            "omni_rtc_outbound_frame_lateness_seconds",
            "How long after its due time each outbound 20 ms audio frame was handed out, per media worker.",
            labels=["worker"],
        )
        late = CounterMetricFamily(
            "omni_rtc_outbound_frames_late",
            "Outbound audio frames handed out a whole frame (20 ms) or more after they were due, per media worker.",
            labels=["worker"],
        )
        skipped = CounterMetricFamily(
            "omni_rtc_outbound_frames_skipped",
            "Outbound frame slots skipped after a stall (the stream's timeline jumps over them), per media worker.",
            labels=["worker"],
        )
        overloaded = GaugeMetricFamily(
            "omni_rtc_media_worker_overloaded",
            "1 when at least 1 % of a media worker's outbound frames in the last 10 s were late or skipped.",
            labels=["worker"],
        )
        for worker, snapshot in sorted(self._snapshots().items()):
            counts = snapshot["bucket_counts"]
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, LATENESS_BUCKETS_S), "+Inf"], counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            lateness.add_metric([worker], buckets, sum_value=snapshot["lateness_sum_s"])
            late.add_metric([worker], snapshot["late_frames"])
            skipped.add_metric([worker], snapshot["skipped_frames"])
            overloaded.add_metric([worker], 1.0 if snapshot["overloaded"] else 0.0)
        return [lateness, late, skipped, overloaded]


class CallMetrics:
    """Reads one call's server events and inbound audio, and turns their timing into metrics."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float], transport: str = "webrtc") -> None:
        self._metrics = metrics
        self._clock = clock
        self._transport = transport
        self._input_samples = 0
        self._silence_ms = 0  # the session's turn_detection.silence_duration_ms, from its events
        self._turn_start: float | None = None  # wall clock the user-facing latency counts from
        self._awaiting_first_audio = False
        self._responses_created: dict[str, float] = {}
        self._lost_counted = 0
        self._last_network = NetworkFigures()

    def on_network_sample(self, current: NetworkFigures) -> None:
        """A call's network figures moved (``app.transports.webrtc.network.NetworkObserver``): count the differences."""
        previous = self._last_network
        packets, frames = self._metrics.inbound_packets, self._metrics.inbound_frames_repaired
        packets.labels(outcome="received").inc(max(current.inbound_packets_received - previous.inbound_packets_received, 0))
        packets.labels(outcome="late").inc(max(current.inbound_packets_late - previous.inbound_packets_late, 0))
        packets.labels(outcome="overrun").inc(
            max(current.inbound_packets_overrun - previous.inbound_packets_overrun, 0)
        )
        # Loss counted so far can shrink when a reordered packet turns up; the counter takes only rises.
        lost = max(current.inbound_packets_lost, self._lost_counted)
        packets.labels(outcome="lost").inc(lost - self._lost_counted)
        self._lost_counted = lost
        frames.labels(method="fec").inc(max(current.inbound_frames_recovered - previous.inbound_frames_recovered, 0))
        frames.labels(method="plc").inc(max(current.inbound_frames_concealed - previous.inbound_frames_concealed, 0))
        self._last_network = current

    def on_network_closed(self, figures: NetworkFigures) -> None:
        """The call ended: its last figures move the counters and its summaries are observed."""
        self.on_network_sample(figures)
        expected = figures.inbound_packets_expected
        if expected:
            self._metrics.call_packet_loss.labels(direction="inbound").observe(figures.inbound_packets_lost / expected)
            self._metrics.call_jitter.observe(figures.inbound_jitter_ms / 1000)
        if figures.outbound_packets_sent:
            self._metrics.call_packet_loss.labels(direction="outbound").observe(
                min(figures.outbound_packets_lost / figures.outbound_packets_sent, 1.0)
            )
        if figures.rtt_ms is not None:
            self._metrics.call_rtt.observe(figures.rtt_ms / 1000)

    def on_input_audio(self, samples: int) -> None:
        """16 kHz samples handed to the session so far feed the end-of-utterance delay."""
        self._input_samples += samples

    def on_echo_removed(self, seconds: float) -> None:
        self._metrics.echo_suppressed.inc(seconds)

    def on_server_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        now = self._clock()
        if kind in _SESSION_CONFIGURED:
            self._silence_ms = _silence_duration_ms(event.get("session") or {})
        elif kind == _SPEECH_STOPPED:
            # audio_end_ms is where the VAD decided: the silence wait after the speech, already heard.
            received_ms = self._input_samples * 1000 / SPEECH_RATE
            audio_end_ms = event.get("audio_end_ms")
            if isinstance(audio_end_ms, int | float):
                lag_ms = max(0.0, received_ms - audio_end_ms)
                self._metrics.end_of_utterance_delay.observe((self._silence_ms + lag_ms) / 1000)
            self._turn_start = now
        elif kind == _COMMITTED and self._turn_start is None:
            self._turn_start = now  # manual commit: no speech_stopped came first
        elif kind == _RESPONSE_CREATED:
            response_id = _response_id(event)
            if response_id is not None:
                self._responses_created[response_id] = now
            if self._turn_start is None:
                self._turn_start = now  # a text turn, or response.create after a manual commit
            self._awaiting_first_audio = True
        elif kind == _AUDIO_STARTED and self._awaiting_first_audio:
            if self._turn_start is not None:
                self._metrics.time_to_first_audio.observe(now - self._turn_start)
            self._awaiting_first_audio = False
            self._turn_start = None
        elif kind == _RESPONSE_DONE:
            response = event.get("response") or {}
            self._metrics.turns.labels(
                transport=self._transport, status=str(response.get("status", "unknown"))
            ).inc()
            created = self._responses_created.pop(str(response.get("id")), None)
            if created is not None:
                self._metrics.turn_duration.observe(now - created)
            if not self._awaiting_first_audio:
                return
            # A response that ended without audio (text only, failed, cancelled) has no
            # first-audio figure; the next turn's clock starts afresh.
            self._awaiting_first_audio = False
            self._turn_start = None
        elif kind == "error":
            error = event.get("error") or {}
            self._metrics.errors.labels(
                type=str(error.get("type", "unknown")), code=str(error.get("code") or "")
            ).inc()


def _silence_duration_ms(session: dict[str, Any]) -> int:
    turn_detection = ((session.get("audio") or {}).get("input") or {}).get("turn_detection") or {}
    value = turn_detection.get("silence_duration_ms")
    return int(value) if isinstance(value, int | float) else 0


def _response_id(event: dict[str, Any]) -> str | None:
    response = event.get("response") or {}
    value = response.get("id")
    return str(value) if value is not None else None
