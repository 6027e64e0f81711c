"""One session's OpenTelemetry spans, drawn from its turn reports (``app.realtime.turn_report``).

The tree (docs/OPERATING.md lists every attribute)::

    omni_rtc.session                      open to close
      omni_rtc.turn                       a response: end of the user's speech to its playback's end
        omni_rtc.end_of_turn              the silence the VAD waited through, to the commit
        omni_rtc.engine.prefill           engine submission to its first audio (or text), as it reports it
        omni_rtc.first_audio              the commit to the first frame handed to the transport
        omni_rtc.playback                 that first frame to the audio played out, or cut
        omni_rtc.tool_call                a function call item: the model began it, to written whole

Every time is one the session measured (``time.monotonic``), the ones the ``latency`` block of
``response.done`` is computed from: the turn starts ``silence_wait_ms`` before the commit, so
``end_of_turn`` lasts ``silence_wait_ms``, ``first_audio`` ends
``end_of_speech_to_first_audio_ms`` after the turn began, and ``engine.prefill`` lasts
``engine_first_audio_ms`` (plus ``speculation_hidden_ms`` for a speculative answer, whose engine
turn began before the commit). Spans are made when what they describe is over, with those start
and end times; a turn whose answer still plays ends with its playback (or the session's close).
Attribute names follow OpenTelemetry's GenAI conventions where one fits (``gen_ai.*``), else
they are omni-rtc's own (``omni_rtc.*``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_TYPE,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    GEN_AI_SYSTEM,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GenAiOperationNameValues,
    GenAiOutputTypeValues,
)
from opentelemetry.semconv._incubating.attributes.session_attributes import SESSION_ID
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from app.realtime.protocol import ResponseLatency
from app.realtime.turn_report import PlaybackReport, SessionStart, ToolCallReport, TurnReport
from media.rates import VOICE_RATE

PlaybackEnd = Literal["played_out", "truncated", "session_closed"]
Attributes = dict[str, AttributeValue]

# gen_ai.provider.name (and the older gen_ai.system): this server runs the model itself; the
# conventions name no provider for it, and take a custom value.
PROVIDER = "omni_rtc"
TOOL_TYPE = "function"  # gen_ai.tool.type: the client runs the function the call names

SESSION_SPAN = "omni_rtc.session"
TURN_SPAN = "omni_rtc.turn"
END_OF_TURN_SPAN = "omni_rtc.end_of_turn"
ENGINE_PREFILL_SPAN = "omni_rtc.engine.prefill"
FIRST_AUDIO_SPAN = "omni_rtc.first_audio"
PLAYBACK_SPAN = "omni_rtc.playback"
TOOL_CALL_SPAN = "omni_rtc.tool_call"

# omni-rtc's own attributes.
TRANSPORT = "omni_rtc.transport"  # webrtc or websocket
SESSION_TURNS = "omni_rtc.session.turns"  # responses the session ran
RESPONSE_STATUS = "omni_rtc.response.status"  # response.done's status
RESPONSE_STATUS_REASON = "omni_rtc.response.status_reason"  # its status_details.reason
SPECULATIVE = "omni_rtc.turn.speculative"  # the answer started at a candidate end of turn
INTERRUPTED = "omni_rtc.turn.interrupted"  # the user's speech cancelled it, or cut its audio
TRUNCATED = "omni_rtc.turn.truncated"  # its audio did not all play
# The latency block of response.done, field by field.
LATENCY_END_OF_SPEECH_TO_FIRST_AUDIO_MS = "omni_rtc.latency.end_of_speech_to_first_audio_ms"
LATENCY_SILENCE_WAIT_MS = "omni_rtc.latency.silence_wait_ms"
LATENCY_ENGINE_FIRST_AUDIO_MS = "omni_rtc.latency.engine_first_audio_ms"
LATENCY_QUEUE_WAIT_MS = "omni_rtc.latency.queue_wait_ms"
LATENCY_OTHER_MS = "omni_rtc.latency.other_ms"
LATENCY_SPECULATION_HIDDEN_MS = "omni_rtc.latency.speculation_hidden_ms"
# Its network part (WebRTC calls: the call's figures so far, cumulative), field by field.
LATENCY_NETWORK_INBOUND_PACKETS_LOST = "omni_rtc.latency.network.inbound_packets_lost"
LATENCY_NETWORK_INBOUND_PACKETS_LATE = "omni_rtc.latency.network.inbound_packets_late"
LATENCY_NETWORK_INBOUND_PACKETS_OVERRUN = "omni_rtc.latency.network.inbound_packets_overrun"
LATENCY_NETWORK_INBOUND_FRAMES_RECOVERED = "omni_rtc.latency.network.inbound_frames_recovered"
LATENCY_NETWORK_INBOUND_FRAMES_CONCEALED = "omni_rtc.latency.network.inbound_frames_concealed"
LATENCY_NETWORK_INBOUND_JITTER_MS = "omni_rtc.latency.network.inbound_jitter_ms"
LATENCY_NETWORK_OUTBOUND_PACKETS_LOST = "omni_rtc.latency.network.outbound_packets_lost"
LATENCY_NETWORK_OUTBOUND_FEC_LOSS_PERCENT = "omni_rtc.latency.network.outbound_fec_loss_percent"
LATENCY_NETWORK_RTT_MS = "omni_rtc.latency.network.rtt_ms"  # only once measured
# The usage of response.done beyond gen_ai.usage's two totals.
USAGE_INPUT_TEXT_TOKENS = "omni_rtc.usage.input_text_tokens"
USAGE_INPUT_AUDIO_TOKENS = "omni_rtc.usage.input_audio_tokens"
USAGE_INPUT_IMAGE_TOKENS = "omni_rtc.usage.input_image_tokens"
USAGE_OUTPUT_TEXT_TOKENS = "omni_rtc.usage.output_text_tokens"
USAGE_OUTPUT_AUDIO_TOKENS = "omni_rtc.usage.output_audio_tokens"
# The engine's own timings (GenerationTimings), from its submission.
ENGINE_QUEUE_WAIT_MS = "omni_rtc.engine.queue_wait_ms"
ENGINE_FIRST_TEXT_MS = "omni_rtc.engine.first_text_ms"
ENGINE_FIRST_AUDIO_MS = "omni_rtc.engine.first_audio_ms"
ENGINE_TOTAL_MS = "omni_rtc.engine.total_ms"
PLAYBACK_PLAYED_MS = "omni_rtc.playback.played_ms"  # of the answer's audio, heard
PLAYBACK_AUDIO_MS = "omni_rtc.playback.audio_ms"  # of the answer's audio, written to the output
PLAYBACK_END = "omni_rtc.playback.end"  # PlaybackEnd
ITEM_ID = "omni_rtc.item.id"
TOOL_CALL_STATUS = "omni_rtc.tool_call.status"  # completed, or incomplete (cut off)


@dataclass(frozen=True)
class WallClock:
    """``time.monotonic()`` seconds as the epoch nanoseconds spans take, by one offset read once:
    the durations are the session's own, untouched by the wall clock being set meanwhile."""

    offset_ns: int

    @classmethod
    def now(cls) -> WallClock:
        return cls(time.time_ns() - time.monotonic_ns())

    def ns(self, monotonic_s: float) -> int:
        return self.offset_ns + round(monotonic_s * 1e9)


@dataclass
class _PlayingTurn:
    """A turn reported done whose answer's audio has not finished playing."""

    span: Span
    context: Context
    report: TurnReport


class SessionSpans:
    """A ``SessionObserver`` (``app.realtime.turn_report``) that makes the session's spans."""

    def __init__(self, tracer: trace.Tracer, clock: WallClock, transport: str) -> None:
        """``transport``: the call's (``webrtc`` or ``websocket``), put on the session span."""
        self._tracer = tracer
        self._clock = clock
        self._transport = transport
        self._session: Span | None = None
        self._session_context: Context | None = None
        self._model = ""
        self._conversation_id = ""
        self._turns = 0
        self._playing: dict[str, _PlayingTurn] = {}  # by response id
        # Playbacks over before their response reported (a barge-in cuts the audio, then the
        # cancelled response sends its response.done), by response id.
        self._ended_early: dict[str, PlaybackReport] = {}

    # -- SessionObserver -------------------------------------------------------------------

    def session_started(self, start: SessionStart) -> None:
        self._model, self._conversation_id = start.model, start.conversation_id
        self._session = self._tracer.start_span(
            SESSION_SPAN, start_time=self._clock.ns(start.at), attributes={
                SESSION_ID: start.session_id,
                GEN_AI_CONVERSATION_ID: start.conversation_id,
                GEN_AI_PROVIDER_NAME: PROVIDER,
                GEN_AI_SYSTEM: PROVIDER,
                GEN_AI_REQUEST_MODEL: start.model,
                TRANSPORT: self._transport,
            },
        )
        self._session_context = trace.set_span_in_context(self._session)

    def turn_done(self, report: TurnReport) -> None:
        if self._session is None:
            return
        self._turns += 1
        end_of_speech = report.started_at - report.silence_wait_ms / 1000
        span = self._tracer.start_span(
            TURN_SPAN, context=self._session_context, start_time=self._clock.ns(end_of_speech),
            attributes=self._turn_attributes(report),
        )
        if report.status == "failed":
            span.set_status(Status(StatusCode.ERROR, report.error_code))
        context = trace.set_span_in_context(span)
        if report.silence_wait_ms > 0:
            self._child(END_OF_TURN_SPAN, context, end_of_speech, report.started_at,
                        {LATENCY_SILENCE_WAIT_MS: report.silence_wait_ms})
        self._engine_prefill(report, context)
        if report.first_audio_at is not None:
            self._child(FIRST_AUDIO_SPAN, context, report.started_at, report.first_audio_at, {})
        for call in report.tool_calls:
            self._child(TOOL_CALL_SPAN, context, call.started_at, call.ended_at, _tool_call_attributes(call))
        playback = self._ended_early.pop(report.response_id, None)
        if report.audio_item_id is None:
            span.set_attribute(INTERRUPTED, report.status_reason == "turn_detected")
            span.end(end_time=self._clock.ns(report.done_at))
            return
        playing = _PlayingTurn(span, context, report)
        if playback is None:
            self._playing[report.response_id] = playing
        else:
            self._end_playing(playing, playback.ended_at, playback)

    def playback_over(self, report: PlaybackReport) -> None:
        playing = self._playing.pop(report.response_id, None)
        if playing is not None:
            self._end_playing(playing, report.ended_at, report)
        elif self._session is not None:
            self._ended_early[report.response_id] = report

    def session_closed(self, at: float) -> None:
        if self._session is None:
            return
        for playing in self._playing.values():
            self._end_playing(playing, at, None)
        self._playing.clear()
        self._ended_early.clear()
        self._session.set_attribute(SESSION_TURNS, self._turns)
        self._session.end(end_time=self._clock.ns(at))
        self._session = self._session_context = None

    # Spans are drawn from the reports alone: the events and the audio are not theirs.
    def client_event(self, raw: str | bytes, at: float) -> None:
        pass

    def server_event(self, event: Mapping[str, Any], at: float) -> None:
        pass

    def input_audio(self, pcm: np.ndarray) -> None:
        pass

    def output_audio(self, pcm: np.ndarray) -> None:
        pass

    # -- spans -----------------------------------------------------------------------------

    def _child(self, name: str, context: Context, start: float, end: float, attributes: Attributes) -> None:
        span = self._tracer.start_span(name, context=context, start_time=self._clock.ns(start), attributes=attributes)
        span.end(end_time=self._clock.ns(end))

    def _engine_prefill(self, report: TurnReport, context: Context) -> None:
        """Submission to the engine's first audio (its first text when it spoke none), as it timed them."""
        timings = report.timings
        if report.engine_started_at is None or timings is None:
            return
        prefill_s = timings.first_audio if timings.first_audio is not None else timings.first_text
        if prefill_s is None:
            return
        attributes: Attributes = {ENGINE_QUEUE_WAIT_MS: timings.queue_wait * 1000, ENGINE_TOTAL_MS: timings.total * 1000}
        if timings.first_text is not None:
            attributes[ENGINE_FIRST_TEXT_MS] = timings.first_text * 1000
            attributes[GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = timings.first_text
        if timings.first_audio is not None:
            attributes[ENGINE_FIRST_AUDIO_MS] = timings.first_audio * 1000
        self._child(ENGINE_PREFILL_SPAN, context, report.engine_started_at, report.engine_started_at + prefill_s,
                    attributes)

    def _end_playing(self, playing: _PlayingTurn, at: float, playback: PlaybackReport | None) -> None:
        """The answer's audio is over (``playback``), or the session closed first (None)."""
        report = playing.report
        attributes: Attributes = {PLAYBACK_END: "session_closed"}
        if playback is not None:
            attributes = {
                PLAYBACK_END: "truncated" if playback.truncated else "played_out",
                PLAYBACK_PLAYED_MS: playback.played_samples * 1000 / VOICE_RATE,
                PLAYBACK_AUDIO_MS: playback.written_samples * 1000 / VOICE_RATE,
                ITEM_ID: playback.item_id,
            }
        started = report.first_audio_at if report.first_audio_at is not None else at
        self._child(PLAYBACK_SPAN, playing.context, started, at, attributes)
        interrupted = report.status_reason == "turn_detected" or (playback is not None and playback.interrupted)
        playing.span.set_attributes({INTERRUPTED: interrupted, TRUNCATED: playback is not None and playback.truncated})
        playing.span.end(end_time=self._clock.ns(max(at, report.done_at)))

    def _turn_attributes(self, report: TurnReport) -> Attributes:
        attributes: Attributes = {
            GEN_AI_OPERATION_NAME: GenAiOperationNameValues.CHAT.value,
            GEN_AI_PROVIDER_NAME: PROVIDER,
            GEN_AI_SYSTEM: PROVIDER,
            GEN_AI_REQUEST_MODEL: self._model,
            GEN_AI_CONVERSATION_ID: self._conversation_id,
            GEN_AI_RESPONSE_ID: report.response_id,
            GEN_AI_REQUEST_TEMPERATURE: report.temperature,
            GEN_AI_OUTPUT_TYPE: (GenAiOutputTypeValues.SPEECH if report.output_audio else GenAiOutputTypeValues.TEXT).value,
            GEN_AI_RESPONSE_FINISH_REASONS: (_finish_reason(report),),
            RESPONSE_STATUS: report.status,
            SPECULATIVE: report.speculative,
            TRUNCATED: False,
        }
        if report.max_output_tokens is not None:
            attributes[GEN_AI_REQUEST_MAX_TOKENS] = report.max_output_tokens
        if report.status_reason is not None:
            attributes[RESPONSE_STATUS_REASON] = report.status_reason
        if report.error_code is not None:
            attributes[ERROR_TYPE] = report.error_code
        if (usage := report.usage) is not None:
            attributes.update({
                GEN_AI_USAGE_INPUT_TOKENS: usage.input_tokens,
                GEN_AI_USAGE_OUTPUT_TOKENS: usage.output_tokens,
                USAGE_INPUT_TEXT_TOKENS: usage.input_text_tokens,
                USAGE_INPUT_AUDIO_TOKENS: usage.input_audio_tokens,
                USAGE_INPUT_IMAGE_TOKENS: usage.input_image_tokens,
                USAGE_OUTPUT_TEXT_TOKENS: usage.output_text_tokens,
                USAGE_OUTPUT_AUDIO_TOKENS: usage.output_audio_tokens,
            })
        if report.latency is not None:
            attributes.update(_latency_attributes(report.latency))
        return attributes


def _latency_attributes(latency: ResponseLatency) -> Attributes:
    attributes: Attributes = {
        LATENCY_END_OF_SPEECH_TO_FIRST_AUDIO_MS: latency.end_of_speech_to_first_audio_ms,
        LATENCY_SILENCE_WAIT_MS: latency.silence_wait_ms,
        LATENCY_QUEUE_WAIT_MS: latency.queue_wait_ms,
        LATENCY_OTHER_MS: latency.other_ms,
        LATENCY_SPECULATION_HIDDEN_MS: latency.speculation_hidden_ms,
    }
    if latency.engine_first_audio_ms is not None:
        attributes[LATENCY_ENGINE_FIRST_AUDIO_MS] = latency.engine_first_audio_ms
    if (network := latency.network) is not None:
        attributes.update({
            LATENCY_NETWORK_INBOUND_PACKETS_LOST: network.inbound_packets_lost,
            LATENCY_NETWORK_INBOUND_PACKETS_LATE: network.inbound_packets_late,
            LATENCY_NETWORK_INBOUND_PACKETS_OVERRUN: network.inbound_packets_overrun,
            LATENCY_NETWORK_INBOUND_FRAMES_RECOVERED: network.inbound_frames_recovered,
            LATENCY_NETWORK_INBOUND_FRAMES_CONCEALED: network.inbound_frames_concealed,
            LATENCY_NETWORK_INBOUND_JITTER_MS: network.inbound_jitter_ms,
            LATENCY_NETWORK_OUTBOUND_PACKETS_LOST: network.outbound_packets_lost,
            LATENCY_NETWORK_OUTBOUND_FEC_LOSS_PERCENT: network.outbound_fec_loss_percent,
        })
        if network.rtt_ms is not None:
            attributes[LATENCY_NETWORK_RTT_MS] = network.rtt_ms
    return attributes


def _tool_call_attributes(call: ToolCallReport) -> Attributes:
    return {
        GEN_AI_TOOL_NAME: call.name,
        GEN_AI_TOOL_CALL_ID: call.call_id,
        GEN_AI_TOOL_TYPE: TOOL_TYPE,
        ITEM_ID: call.item_id,
        TOOL_CALL_STATUS: call.status,
    }


def _finish_reason(report: TurnReport) -> str:
    """gen_ai.response.finish_reasons' one entry: the engine's (stop, length, cancelled); for a
    response that ended without the engine finishing, from its status (error, cancelled)."""
    if report.finish_reason is not None:
        return report.finish_reason
    return "error" if report.status == "failed" else "cancelled"
