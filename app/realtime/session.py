"""RealtimeSession: one conversation, transport-agnostic.

In: 16 kHz float32 PCM (``push_audio``), client events as JSON text (``handle_message``) and
camera frames (``add_video_frame``, sampled as ``video_plan`` says; or pushed by the client as
``input_image_buffer.append``; ``app.realtime.input``).
Out: server events as JSON-ready dicts (``send``) and 24 kHz float32 PCM (``AudioOutput.write``).

It hears utterances end (server VAD, or semantic VAD: ``end_of_turn``) or takes client commits,
runs one engine turn per response, streams the answer, and keeps the conversation *as the user
heard it* (``history``, ``ledger``). ``interrupt_response: true`` (default, OpenAI's) is barge-in;
``false`` is half-duplex (speech heard, not acted on, until the answer has played out plus
``ECHO_TAIL_MS``); ``null`` is manual mode. ``session.finish`` ends it with ``session.finished``.
VAD events become the protocol's in ``app.realtime.turn_taking``; answers start at a candidate end
of turn, held until the commit (``app.realtime.speculation``); partial transcripts:
``app.realtime.transcription``; what its engine cannot do is refused or off
(``app.realtime.session_config``). docs/SESSION.md has the whole picture.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from app.realtime.failures import failure_event
from app.realtime.gate import BOUND_CODES, FLOOD_REFUSALS, FLOOD_WINDOW_S, EventGate, RateObserver, RefusalReplies
from app.realtime.history import History, acknowledge_playback
from app.realtime.input import (
    AppendDecoder,
    ManualBuffer,
    TurnFrames,
    decode_budget,
    read_frame,
    read_item_audio,
    read_item_images,
)
from app.realtime.interruption import Backchannel, InterruptionObserver, InterruptionOutcome, Paused, Resumed
from app.realtime.playback import AnswerAudio, AudioIdle, AudioOutput, PlaybackEvent, Settled
from app.realtime.protocol import (
    ClientEvent,
    ClientMessageItem,
    ConversationItemCreateEvent,
    ConversationItemDeleteEvent,
    ConversationItemRetrieveEvent,
    ConversationItemTruncateEvent,
    InputAudioBufferAppendEvent,
    InputAudioBufferClearedEvent,
    InputAudioBufferClearEvent,
    InputAudioBufferCommitEvent,
    InputImageBufferAppendEvent,
    NetworkLatency,
    OutputAudioBufferClearEvent,
    PlaybackAckEvent,
    ProtocolError,
    ResponseCancelEvent,
    ResponseCreateEvent,
    ServerEvent,
    SessionCreatedEvent,
    SessionFinishedEvent,
    SessionFinishEvent,
    SessionObject,
    SessionUpdatedEvent,
    SessionUpdateEvent,
    new_id,
    parse_client_event,
)
from app.realtime.response import Response, ResponseContext, ResponseRun, apply_response_params, generation_request
from app.realtime.session_config import (
    SessionConfig,
    TurnDetection,
    check_item,
    check_pushed_image,
    check_session,
    check_system_budget,
    check_tool_choice,
    first_config,
    fitted,
    session_param,
)
from app.realtime.shares import (
    ClientShare,
    ClientShares,
    EngineShare,
    RefusalObserver,
    SessionShare,
    ShareSize,
    answer_estimate,
)
from app.realtime.speculation import OutcomeObserver, Speculation, SpeculativeAnswer, Speculator
from app.realtime.transcription import PartialObserver, PartialTranscripts, Transcriptions
from app.realtime.turn_report import PlaybackReport, SessionObserver, SessionStart, TurnReport
from app.realtime.turn_taking import (
    CandidateEnd,
    CandidateVoid,
    CommitAudio,
    Interrupt,
    Respond,
    SemanticVad,
    SpeechIgnored,
    TextJudge,
    TurnCommand,
    TurnTaking,
    UserSpeaking,
    detector_params,
)
from media.detector_events import EndOfTurnCheck
from media.end_of_turn_model import EndOfTurnModel
from media.frames import FramePlan, SampledFrame
from media.noise_suppression import NoiseSuppressor
from media.vad import SpeechModel
from pipeline.contract import (
    Engine,
    GenerationRequest,
)
from pipeline.conversation import ConversationItem, UserAudio, UserImage

logger = logging.getLogger(__name__)

SESSION_LIFETIME_S = 3_600  # expires_at in session objects, as OpenAI's 60-minute sessions


class RealtimeSession:
    """One conversation over the OpenAI Realtime protocol; see the module docstring."""

    def __init__(
        self,
        *,
        engine: Engine,
        vad: SpeechModel,
        output: AudioOutput,
        send: Callable[[dict[str, Any]], None],
        config: SessionConfig | None = None,
        session_id: str | None = None,
        on_ignored_speech: Callable[[], None] | None = None,
        end_of_turn: EndOfTurnModel | None = None,
        text_judge: TextJudge | None = None,
        session_fields: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_speculation: OutcomeObserver | None = None,
        on_partial_transcript: PartialObserver | None = None,
        on_interruption: InterruptionObserver | None = None,
        on_engine_tokens: Callable[[int], None] | None = None,
        on_share_refused: RefusalObserver | None = None,
        on_rate_refused: RateObserver | None = None,
        client: str | None = None,
        client_shares: ClientShares | None = None,
        share_size: ShareSize = ShareSize(),
        observer: SessionObserver | None = None,
    ) -> None:
        """``on_ignored_speech`` is called for each utterance half-duplex does not act on (metrics).
        ``end_of_turn``: the model semantic_vad needs; without it, semantic_vad is refused (server VAD stays).
        ``text_judge``: semantic_vad also judges the words said (``app.realtime.turn_taking``).
        ``session_fields``: a dialect's reading of ``session.update`` fields, before the session's
        own (``app.transports.websocket.dashscope``); it raises ``ProtocolError`` for what it refuses.
        ``on_speculation``: each speculation's outcome (metrics, ``app.realtime.speculation``).
        ``on_partial_transcript``: each partial transcript's outcome (metrics, ``app.realtime.transcription``).
        ``on_interruption``: speech over an answer that was not an interruption (metrics,
        ``app.realtime.interruption``). ``on_engine_tokens``: at close, the prompt tokens the
        session's work had the engine prefill (metrics, ``app.realtime.shares``);
        ``on_share_refused``: each piece of work the engine share refused, by the limit that refused it;
        ``on_rate_refused``: each client event the event rate refused, by its limit.
        ``client``: the key of the client held to a share (of the engine, and of the event rate)
        across its sessions (its address; None: none, the session's own only), kept in
        ``client_shares`` (this process's);
        ``share_size``: the session's own bucket.
        ``observer``: the session's start and close, each response and each answer's playback
        (traces, ``app.realtime.turn_report``).
        ``clock``: what the event gate and the appends' bound count time by (tests run it faster)."""
        self._engine = engine
        self._capabilities = engine.capabilities
        self._session_fields = session_fields
        self._send = send
        self.session_id = session_id or new_id("sess")
        self._semantic = SemanticVad(end_of_turn, self._on_end_of_turn_answer, name=self.session_id,
                                     text_judge=text_judge,
                                     on_words=self._on_words_answer if text_judge is not None else None)
        first, unfit = first_config(config or SessionConfig(), self._capabilities)
        self._config, unavailable = self._semantic.runnable(first)
        self._start_errors = [error for error in (unfit, unavailable) if error is not None]
        self._client_share: ClientShare | None = (
            client_shares.join(client) if client is not None and client_shares is not None else None
        )
        client_budget = self._client_share.budget if self._client_share is not None else None
        self._gate = EventGate(
            max_bytes=self._config.max_event_bytes,
            per_second=self._config.max_events_per_second,
            burst=self._config.max_event_burst,
            max_image_event_bytes=self._config.max_image_event_bytes,
            client=client_budget.events if client_budget is not None else None,
            on_refused=on_rate_refused,
            clock=clock,
        )
        self._conversation_id = new_id("conv")
        self._expires_at = int(time.time()) + SESSION_LIFETIME_S
        self._share = SessionShare(EngineShare(burst=share_size.burst, per_second=share_size.per_second, clock=clock),
                                   client_budget.engine if client_budget is not None else None,
                                   on_refused=on_share_refused)
        self._speculator = Speculator(engine, self._speculative_answer, session_id=self.session_id, share=self._share,
                                      on_outcome=on_speculation, clock=clock)
        self._turns = TurnTaking(
            vad,
            detector_params(self._config.turn_detection or TurnDetection(), self._config.history,
                            judge_words=self._semantic.judges_words),
            session_id=self.session_id,
            judge_words=self._semantic.judges_words,
        )
        self._on_ignored_speech = on_ignored_speech
        self._on_interruption = on_interruption
        self._on_engine_tokens = on_engine_tokens
        self._observer = observer
        self._manual = ManualBuffer()
        self._suppressor = _suppressor_for(self._config)
        self._appends = AppendDecoder(clock=clock)
        self._history = History()
        self._frames = TurnFrames()
        self._image_budget = decode_budget()
        self._response: ResponseRun | None = None  # generating, or queued behind a cancelling one
        self._runs: set[ResponseRun] = set()  # every run whose task is not over (a cancelled one finishing)
        self._audio = AnswerAudio(output, on_written=observer.output_audio if observer is not None else None)
        self._response_context = ResponseContext(self.session_id, engine, self._history, self._audio)
        # The response the user's speech cancelled (barge-in), until another response starts:
        # a client's response.cancel for it is answered by its response.done.
        self._cut_by_speech: str | None = None
        # The call's network figures its transport added to a response.done as it sent it (WebRTC),
        # by response id, until that response reports (at once: it sent its response.done first).
        self._sent_network: dict[str, NetworkLatency] = {}
        self._closed = False
        self._finished = False  # session.finished sent: nothing more is taken or sent
        self._refusals = RefusalReplies()
        self._flooding = False
        self._close_lock = asyncio.Lock()
        self._transcriptions = Transcriptions(engine, self.emit, self._history.holds, self.session_id, share=self._share)
        self._partials = PartialTranscripts(engine, self.emit, self._audio_content_index, session_id=self.session_id,
                                            on_outcome=on_partial_transcript, share=self._share)
        self._committed_speculation: Speculation | None = None  # taken at a commit, for its response
        self._active_at = time.monotonic()  # the last client event, speech or answer (idle_since)
        output.set_listener(self)

    # -- public API ------------------------------------------------------------------------

    @property
    def config(self) -> SessionConfig:
        return self._config

    @property
    def echo_cancellation(self) -> bool:
        """The call should take the answer's echo out of the input before ``push_audio``."""
        return self._config.echo_cancellation

    async def start(self) -> None:
        """Announce the session: ``session.created`` with the full effective session."""
        self.emit(SessionCreatedEvent(session=self._session_object()))
        if self._observer is not None:
            self._observer.session_started(
                SessionStart(self.session_id, self._conversation_id, self._engine.name, time.monotonic())
            )
        for error in self._start_errors:
            self.emit(error.to_event())

    async def handle_message(self, raw: str | bytes) -> None:
        """Handle one client event (JSON text); every mistake is answered with an ``error``."""
        if self._closed or self._finished or self._flooding:
            return
        self._active_at = time.monotonic()
        if self._observer is not None:
            self._observer.client_event(raw, self._active_at)
        rejection = self._gate.admit(raw)  # before parsing: a flood or a huge event costs nothing (appends: _parse)
        if rejection is not None:
            self._refuse(ProtocolError(rejection.code, rejection.message))
            return
        event_id: str | None = None
        try:
            event = self._parse(raw)
            event_id = event.event_id
            if isinstance(event, ConversationItemCreateEvent):
                image_chars = event.image_url_chars
            elif isinstance(event, InputImageBufferAppendEvent):
                image_chars = len(event.image)
            else:
                image_chars = 0
            if (large := self._gate.refuse_large(raw, image_chars=image_chars)) is not None:
                raise ProtocolError(large.code, large.message)
            await self._dispatch(event)
            self._speculator.check()  # the turn a commit would start may have changed
        except ProtocolError as exc:
            self._refuse(exc if exc.event_id else exc.for_event(event_id))
        except Exception as exc:  # a bug of ours: the client hears of it, the session goes on
            where = f"session {self.session_id}: handling a client event"
            self.emit(failure_event("server_error", exc, where=where, client_event_id=event_id))

    @property
    def flooding(self) -> bool:
        """The client had ``FLOOD_REFUSALS`` events refused within ``FLOOD_WINDOW_S``
        (``app.realtime.gate``): nothing more is taken; its transport ends the call."""
        return self._flooding

    def _refuse(self, error: ProtocolError) -> None:
        """A client event's ``error``; one refused for a bound within the replies' rate, and a
        flood of those ends the session (``app.realtime.gate``)."""
        if error.code not in BOUND_CODES:
            self.emit(error.to_event())
            return
        refusal = self._refusals.refused()
        if refusal.flooding:
            self._flooding = True
            logger.warning("session %s: %d client events refused within %g s; closing it", self.session_id,
                           FLOOD_REFUSALS, FLOOD_WINDOW_S)
            self.emit(ProtocolError(
                "rate_limit_exceeded",
                f"{FLOOD_REFUSALS} of this session's events were refused within {FLOOD_WINDOW_S:g} s; the session is "
                "closed.",
            ).to_event())
            return
        if not refusal.reply:
            return
        if refusal.unanswered:
            error = ProtocolError(error.code, f"{error.message} ({refusal.unanswered} more refused events were not "
                                  "answered one by one.)", param=error.param, event_id=error.event_id, type=error.type)
        self.emit(error.to_event())

    def _parse(self, raw: str | bytes) -> ClientEvent:
        """The event; one the gate let through as a possible audio append pays the event rate
        here unless it was one (``rate_limit_exceeded`` then wins over a parser's error)."""
        try:
            event = parse_client_event(raw)
        except ProtocolError:
            self._check_rate(raw, audio_chars=None)
            raise
        self._check_rate(raw, audio_chars=len(event.audio) if isinstance(event, InputAudioBufferAppendEvent) else None)
        return event

    def _check_rate(self, raw: str | bytes, *, audio_chars: int | None) -> None:
        if (rejection := self._gate.admit_parsed(raw, audio_chars=audio_chars)) is not None:
            raise ProtocolError(rejection.code, rejection.message)

    def push_audio(self, pcm: np.ndarray) -> None:
        """16 kHz float32 mono input (from the inbound track); runs the VAD inline, never awaits."""
        if self._closed or self._finished:
            return
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._suppressor is not None:  # before the VAD and the model hear it
            pcm = self._suppressor.process(pcm)
        if pcm.size == 0:
            return
        if self._observer is not None:
            self._observer.input_audio(pcm)
        turn_detection = self._config.turn_detection
        if turn_detection is None:
            self._turns.skip(pcm.size)
            self._manual.append(pcm)
            return
        self._on_turn(self._turns.push(pcm, turn_detection, busy=self._busy(), playing=len(self._audio) > 0))
        self._partials.heard(self._turns.speech_so_far(), self._config.transcription)

    def add_video_frame(self, frame: SampledFrame) -> None:
        """One frame sampled from the call's camera; it joins the next committed utterance (or not)."""
        if not self._closed:
            self._frames.keep(frame, self._config.video)
            self._speculator.check()

    def video_plan(self) -> FramePlan | None:
        """How often to sample the camera now and at what size; None: no frame is wanted now."""
        return None if self._closed else self._frames.plan(self._config.video)

    async def close(self) -> None:
        """Cancel the running response and await every task; safe to call twice."""
        async with self._close_lock:
            closing = not self._closed
            self._closed = True
            try:
                await self._transcriptions.close()  # first: an ending response would let them start
                await self._partials.close()
                await self._semantic.close()
                for run in list(self._runs):
                    await run.close()
                await self._speculator.close()  # last: a response ending hands its speculation back
            finally:
                if self._client_share is not None:  # after the runs' ends were charged to it
                    self._client_share.leave()
            if closing and self._on_engine_tokens is not None:  # the runs' decoded steps included
                self._on_engine_tokens(self._share.charged)
            if closing and self._observer is not None:  # every response has reported by now
                self._observer.session_closed(time.monotonic())

    def idle_since(self) -> float | None:
        """Since when (``time.monotonic``) nothing has happened: no client event, no speech, no
        answer running or playing; None while something does."""
        if self._busy() or self._turns.speech_so_far() is not None:
            return None
        return self._active_at

    def stats(self) -> dict[str, int]:
        """Sizes of the per-session structures (metrics; tests check they stay bounded)."""
        return {
            "items": len(self._history),
            "audio_clips": self._history.audio_clip_count(),
            "images": self._history.image_count(),
            "camera_frames": len(self._frames),
            "playbacks": len(self._audio),
            "tasks": len(self._runs) + len(self._transcriptions),
            "partial_transcripts": len(self._partials),
            "speculations": len(self._speculator),
            "manual_buffer_samples": self._manual.samples,
            "responses": int(self._response is not None),
        }

    # -- AudioOutput listener --------------------------------------------------------------

    def on_playback_started(self) -> None:
        if self._closed or (started := self._audio.started()) is None:
            return
        self.emit(started)
        if self._response is not None:
            self._response.response.first_frame_out(started.response_id)

    def on_playback_stopped(self) -> None:
        if not self._closed:
            self._on_playback(self._audio.stopped())

    # -- client events ---------------------------------------------------------------------

    async def _dispatch(self, event: ClientEvent) -> None:
        if isinstance(event, SessionUpdateEvent):
            await self._update_session(event)
        elif isinstance(event, InputAudioBufferAppendEvent):
            self._append_audio(event)
        elif isinstance(event, InputAudioBufferCommitEvent):
            self._commit_manual()
        elif isinstance(event, InputAudioBufferClearEvent):
            self._clear_input()
        elif isinstance(event, ConversationItemCreateEvent):
            await self._create_item(event)
        elif isinstance(event, ConversationItemDeleteEvent):
            self._delete_item(event)
        elif isinstance(event, ConversationItemRetrieveEvent):
            self.emit(self._history.retrieve_item(event.item_id))
        elif isinstance(event, ConversationItemTruncateEvent):
            await self._truncate_item(event)
        elif isinstance(event, ResponseCreateEvent):
            await self._create_response(event)
        elif isinstance(event, ResponseCancelEvent):
            await self._cancel_response(event)
        elif isinstance(event, OutputAudioBufferClearEvent):
            await self._clear_output_by_client()
        elif isinstance(event, PlaybackAckEvent):  # WebSocket: the client says what it played
            self.emit(acknowledge_playback(event, self._audio.output.playback_reports, self._history, self._audio.ledger,
                                            self.session_id))
        elif isinstance(event, InputImageBufferAppendEvent):
            await self._append_image(event)
        elif isinstance(event, SessionFinishEvent):
            await self._finish_session()

    async def _update_session(self, event: SessionUpdateEvent) -> None:
        old = self._config
        fields = event.session if self._session_fields is None else self._session_fields(event.session)
        updated = old.updated(fields)
        check_tool_choice(updated.tool_choice, self._capabilities, "session.tool_choice")
        await check_session(updated, since=old, param=session_param(event.session))
        if self._closed:
            return
        new, unavailable = self._semantic.runnable(fitted(updated, self._capabilities))
        if unavailable is not None:
            self.emit(unavailable.for_event(event.event_id).to_event())
        self._config = new
        if new.noise_reduction != old.noise_reduction:
            self._suppressor = _suppressor_for(new)
        if new.truncation != old.truncation:
            self.prune_history()  # a budget that drops items now applies to what "disabled" kept
        if new.turn_detection != old.turn_detection:
            self._on_turn(self._turns.configure(new.turn_detection, new.history))
            if old.turn_detection is None:  # manual audio is not the VAD's business
                self._manual.clear()
        if new.transcription != old.transcription:  # partials turned off stop now, not at the next audio
            self._partials.heard(self._turns.speech_so_far(), new.transcription)
        self.emit(SessionUpdatedEvent(session=self._session_object()))

    def _append_audio(self, event: InputAudioBufferAppendEvent) -> None:
        self.push_audio(self._appends.decode(event.audio, input_audio_format=self._config.input_audio_format,
                                             pcm_rate=self._config.input_audio_rate))

    async def _append_image(self, event: InputImageBufferAppendEvent) -> None:
        """A frame the client pushed joins the next committed utterance, as a camera frame does."""
        check_pushed_image(self._capabilities)
        video = self._config.video
        now = time.monotonic()
        if not self._frames.wants_pushed(video, now):
            return  # within the sampling interval of the last one kept (or no frames wanted)
        image = await asyncio.to_thread(read_frame, event.image, max_bytes=self._config.max_image_bytes,
                                        max_pixels=video.max_pixels, budget=self._image_budget)
        if not self._closed:
            self._frames.add_pushed(image, video, now)

    async def _finish_session(self) -> None:
        """``session.finish``: the running response is cancelled (its ``response.done`` goes out),
        then ``session.finished``, the last event; the transport closes on it."""
        run = self._response
        if run is not None:
            await asyncio.wait({run.cancel("client_cancelled") if not run.cancelling else run.task})
        self._speculator.utterance_over()  # nothing more is answered: a held answer is thrown away
        self._partials.stop()
        self.emit(SessionFinishedEvent())
        self._finished = True

    def _commit_manual(self) -> None:
        if self._config.turn_detection is not None:
            raise ProtocolError(
                "turn_detection_enabled",
                "Server VAD commits by itself; set audio.input.turn_detection to null to commit manually.",
            )
        held = self._appends.flush()
        if held.size:
            self.push_audio(held)
        self._commit_user_audio(new_id("item"), self._manual.take())

    def _clear_input(self) -> None:
        self._appends.flush()  # what the resampler held of the cleared appends goes with them
        self._manual.clear()
        self._on_turn(self._turns.clear())
        self.emit(InputAudioBufferClearedEvent())

    async def _create_item(self, event: ConversationItemCreateEvent) -> None:
        images: dict[int, UserImage] = {}
        audio: dict[int, UserAudio] = {}
        item = event.item
        check_item(item, self._capabilities)
        # Images and audio are decoded in worker threads; the history checks the rest.
        if isinstance(item, ClientMessageItem) and item.role == "user":
            images = await read_item_images(item.content, max_bytes=self._config.max_image_bytes,
                                            budget=self._image_budget)
            if any(part.type == "input_audio" for part in item.content):
                audio = await asyncio.to_thread(
                    read_item_audio, item.content, input_audio_format=self._config.input_audio_format,
                    max_seconds=self._config.history.max_audio_seconds, input_audio_rate=self._config.input_audio_rate,
                )
            if self._closed:
                return
        for server_event in self._history.create_item(
            event, max_chars=self._config.max_text_chars, images=images, audio=audio
        ):
            self.emit(server_event)
        self.prune_history()

    def _delete_item(self, event: ConversationItemDeleteEvent) -> None:
        in_progress = self._response.response.output if self._response is not None else []
        self.emit(self._history.delete_item(event.item_id, in_progress=in_progress))
        self._transcriptions.forget_gone()

    async def _truncate_item(self, event: ConversationItemTruncateEvent) -> None:
        run = self._response
        if run is not None and run.cancelling and any(entry.id == event.item_id for entry in run.response.output):
            # The client's reply to speech_started (pipecat, the Agents SDK), sent before the
            # server's own cancel at that barge-in ended the item: it is cut once that has.
            await asyncio.wait({run.task})
            if self._closed:
                return
        self.emit(self._history.truncate_item(event, self._audio.ledger))
        if (reports := self._audio.output.playback_reports) is not None:
            reports.played_out(event.item_id)

    async def _create_response(self, event: ResponseCreateEvent) -> None:
        self._refuse_second_response()
        response = self._session_response(time.monotonic())
        params = event.response
        if params is not None:
            apply_response_params(response, params, max_chars=self._config.max_text_chars)
            check_tool_choice(response.tool_choice, self._capabilities, "response.tool_choice")
            if params.instructions is not None or params.tools is not None:
                await check_system_budget(
                    response.instructions, response.tools, budget=self._config.max_instructions_tokens,
                    param="response.tools" if params.tools is not None else "response.instructions",
                )
                if self._closed:
                    return
                self._refuse_second_response()  # server VAD may have started one meanwhile
        cost = answer_estimate(response.instructions, self._history.prompt_tokens())
        if (refusal := self._share.charge_within(cost, "response")) is not None:
            whose = "This session has used its" if refusal.limit == "session" else (
                "This client's sessions have used the client's")
            raise ProtocolError(
                "engine_share_exceeded",
                f"{whose} share of the engine ({refusal.burst} prompt tokens at once, then {refusal.per_second:g} "
                f"a second; the {refusal.limit} limit); this response ({cost} prompt tokens) was not started.",
            )
        self._start_response(response)

    def _refuse_second_response(self) -> None:
        if self._response is not None and not self._response.cancelling:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self._response.id}. "
                "Wait until the response is finished before creating a new one.",
            )

    async def _cancel_response(self, event: ResponseCancelEvent) -> None:
        """Cancels the response in progress; answered by its ``response.done`` (docs/SESSION.md,
        "A cancel that races the server's own")."""
        run = self._response
        if run is not None and event.response_id in (None, run.id):
            # One being cancelled already (the user's speech, an output clear) is in progress
            # until its response.done, which answers this cancel too, as OpenAI's does.
            await asyncio.wait({run.task if run.cancelling else run.cancel("client_cancelled")})
            return
        if self._cut_by_speech is not None and event.response_id in (None, self._cut_by_speech):
            # The client's reply to speech_started, sent before the response.done of the server's
            # own cancel reached it (LiveKit's interrupt(), twice at a barge-in): that
            # response.done answered it.
            logger.debug("session %s: response.cancel %s answered by the barge-in's response.done of %s",
                         self.session_id, event.event_id, self._cut_by_speech)
            return
        raise ProtocolError(
            "response_cancel_not_active",
            "Cancellation failed: no active response found"
            + (f" with id {event.response_id!r}." if event.response_id else "."),
        )

    async def _clear_output_by_client(self) -> None:
        # OpenAI: clearing the output also stops generating the response whose audio it is.
        run = self._response
        if run is not None and not run.cancelling:
            await asyncio.wait({run.cancel("client_cancelled")})
        self._on_playback(self._audio.clear(always_announce=True))

    # -- server VAD (app.realtime.turn_taking) ---------------------------------------------

    def _on_end_of_turn_answer(self, check_id: int, probability: float) -> None:
        if not self._closed and self._config.turn_detection is not None:
            self._on_turn(self._turns.decide(check_id, probability, self._config.turn_detection, busy=self._busy()))

    def _on_words_answer(self, check_id: int, probability: float | None) -> None:
        if not self._closed and self._config.turn_detection is not None:
            self._on_turn(self._turns.decide_words(check_id, probability, self._config.turn_detection,
                                                   busy=self._busy()))

    def _on_turn(self, commands: list[TurnCommand]) -> None:
        """Carries out what turn taking asks, in order."""
        for command in commands:
            match command:
                case CommitAudio(item_id=item_id, pcm=pcm):
                    self._commit_user_audio(item_id, pcm)
                case Respond(item_id=item_id, committed_at=committed_at, silence_wait_ms=silence_wait_ms):
                    self._respond_to_speech(item_id, committed_at, silence_wait_ms)
                case Interrupt():
                    self._interrupt()
                case UserSpeaking(speaking=speaking):
                    self._user_speaking(speaking)
                case EndOfTurnCheck():
                    self._semantic.submit(command)
                case CandidateEnd(pcm=pcm):
                    self._speculator.candidate(pcm)
                case CandidateVoid():
                    self._speculator.resumed()
                case SpeechIgnored():
                    if self._on_ignored_speech is not None:
                        self._on_ignored_speech()
                case Paused():
                    self._audio.pause()
                case Resumed():
                    self._audio.resume()
                    self._observe_interruption("resumed")
                case Backchannel():
                    self._observe_interruption("backchannel")
                case _:
                    self.emit(command)

    def _observe_interruption(self, outcome: InterruptionOutcome) -> None:
        if self._on_interruption is not None:
            self._on_interruption(outcome)

    def _respond_to_speech(self, item_id: str, committed_at: float, silence_wait_ms: float) -> None:
        """Server VAD (or the idle timeout) committed the turn ending with ``item_id``: answer it."""
        speculation, self._committed_speculation = self._committed_speculation, None
        if self._response is not None and not self._response.cancelling:
            logger.info("session %s: utterance %s committed while %s is responding; not answering it",
                        self.session_id, item_id, self._response.id)
            if speculation is not None:
                self._speculator.release(speculation)
            return
        response = self._session_response(committed_at, silence_wait_ms)
        response.speculation = speculation
        if speculation is None:  # a speculation was charged when it started
            self._share.charge(answer_estimate(response.instructions, self._history.prompt_tokens()))
        self._start_response(response)

    def _speculative_answer(self, pcm: np.ndarray) -> SpeculativeAnswer | None:
        """The turn a commit of ``pcm`` now would start; None when the session would not answer now."""
        detection = self._config.turn_detection
        if self._closed or detection is None or not (detection.speculative_response and detection.create_response
                                                      and not self._busy()):
            return None
        response = self._session_response(0.0)
        audio = UserAudio(pcm)
        pending: tuple[ConversationItem, ...] = (*self._frames.peek(self._config.video.frames_per_turn), audio)
        answer = generation_request(response, self._history.conversation(response.instructions, self._config.history, pending))
        transcribe = self._config.transcription
        hint = transcribe.hint() if transcribe is not None and np.any(pcm) else None
        return SpeculativeAnswer(answer, GenerationRequest.transcription(audio, hint) if hint is not None else None)

    def _session_response(self, started_at: float, silence_wait_ms: float = 0.0) -> Response:
        """A response the server starts by itself, with the session's settings."""
        return Response.for_session(self._config, self._conversation_id, started_at, silence_wait_ms)

    def _user_speaking(self, speaking: bool) -> None:
        """Turn taking acts on the user's speech (True), or has committed or dropped it (False)."""
        self._active_at = time.monotonic()
        if speaking:
            self._frames.speech_started()
        else:
            self._frames.speech_ended()
            self._partials.stop()
        self._speculator.utterance_over()

    def _commit_user_audio(self, item_id: str, pcm: np.ndarray) -> None:
        """A user item of ``pcm``: of the audio a speculative answer was made from, when one runs."""
        if self._committed_speculation is not None:  # committed without an answer (create_response off)
            self._speculator.release(self._committed_speculation)
        speculation = self._committed_speculation = self._speculator.take()
        partial = self._partials.committed(item_id)
        images = self._frames.take(self._config.video.frames_per_turn)
        for event in self._history.commit_audio(item_id, pcm if speculation is None else speculation.pcm, images):
            self.emit(event)
        held = speculation.take_transcription if speculation is not None else None
        self._transcriptions.transcribe(self._history.require(item_id), self._config.transcription, held, partial)
        self.prune_history()

    def _audio_content_index(self) -> int:
        """The index a commit now would give the user item's audio part: after its camera frames."""
        return len(self._frames.peek(self._config.video.frames_per_turn))

    def _busy(self) -> bool:
        """The assistant is answering or its audio has not finished playing."""
        return self._response is not None or len(self._audio) > 0

    # -- responses (app.realtime.response) ---------------------------------------------

    def response_over(self, run: ResponseRun) -> None:
        """``run``'s task is over."""
        self._runs.discard(run)

    def release_speculation(self, speculation: Speculation) -> None:
        self._speculator.release(speculation)

    def _start_response(self, response: Response) -> None:
        run = ResponseRun(response, self._response_context, self)
        previous, self._response = self._response, run
        self._audio.last_response_id = response.id
        self._cut_by_speech = None  # a cancel from now on is for this one
        self._turns.response_started(self._config.turn_detection)
        self._transcriptions.hold_until(response.output_started)
        self._runs.add(run)
        run.start(previous)

    def response_done(self, run: ResponseRun, report: TurnReport) -> None:
        """``run`` sent its ``response.done``: what it decoded is charged to the session's share;
        its report carries the network figures the transport added to the event (``network_reported``)."""
        network = self._sent_network.pop(report.response_id, None)
        if network is not None and report.latency is not None:
            report = replace(report, latency=report.latency.model_copy(update={"network": network}))
        if self._observer is not None:
            self._observer.turn_done(report)
        self._active_at = time.monotonic()
        self._share.charge(run.decoded_steps)
        if self._response is run:
            self._response = None
        self._on_playback(self._audio.settle())
        self._speculator.check()  # a candidate silence the answer overlapped may speculate now

    # -- playback (app.realtime.playback) ----------------------------------------------

    def _audio_idle(self) -> None:
        """The answers' audio is over: played out, or cleared."""
        self._active_at = time.monotonic()
        if self._response is None:
            self._turns.idle()

    def _interrupt(self) -> None:
        """Barge-in: the user started speaking over the assistant."""
        run = self._response
        if run is not None and not run.cancelling:
            run.cancel("turn_detected")
            self._cut_by_speech = run.id
        self._on_playback(self._audio.clear(always_announce=False), interrupted=True)

    def _on_playback(self, events: list[PlaybackEvent], *, interrupted: bool = False) -> None:
        """What the answers' playback did: announced, settled into the history as heard, over.
        ``interrupted``: the user's speech cleared it (barge-in)."""
        settled = False
        for event in events:
            match event:
                case Settled(playbacks=playbacks, played=played):
                    for server_event in self._history.settle_all(playbacks, played):  # a cancelled answer's text ran ahead
                        self.emit(server_event)
                    self._report_playbacks(event, interrupted=interrupted)
                    settled = True
                case AudioIdle():
                    self._audio_idle()
                case _:
                    self.emit(event)
        if settled:
            self.prune_history()

    def _report_playbacks(self, settled: Settled, *, interrupted: bool) -> None:
        if self._observer is None:
            return
        now = time.monotonic()
        for playback in settled.playbacks:
            played = playback.heard(settled.played)
            truncated = played < playback.written or playback.unfinished
            self._observer.playback_over(PlaybackReport(
                response_id=playback.response_id, item_id=playback.item_id, ended_at=now, played_samples=played,
                written_samples=playback.written, truncated=truncated, interrupted=interrupted and truncated,
            ))

    # -- history ---------------------------------------------------------------------------

    def prune_history(self) -> None:
        for event in self._history.prune(self._config.history, self._config.truncation):
            self.emit(event)
        self._transcriptions.forget_gone()  # an item pruned is not transcribed

    # -- helpers ---------------------------------------------------------------------------

    def _session_object(self) -> SessionObject:
        return self._config.to_session_object(
            session_id=self.session_id, model=self._engine.name, expires_at=self._expires_at
        )

    def network_reported(self, response_id: str, network: NetworkLatency) -> None:
        """The transport added the call's network figures to ``response_id``'s ``response.done`` as
        it sent it (a WebRTC call): the response's report to the observers carries them too."""
        self._sent_network[response_id] = network

    def transport_sent(self, event: Mapping[str, Any]) -> None:
        """An event the transport sent the client itself (a WebSocket's audio deltas, a refused
        frame, the call's last word): the observers hear it as they hear the session's own."""
        if self._observer is not None and not self._closed:
            self._observer.server_event(event, time.monotonic())

    def emit(self, event: ServerEvent) -> None:
        if not self._closed and not self._finished:
            sent = event.to_json()
            # Observed first: sending may emit another event (playback started), which follows it.
            if self._observer is not None:
                self._observer.server_event(sent, time.monotonic())
            self._send(sent)


def _suppressor_for(config: SessionConfig) -> NoiseSuppressor | None:
    """The input's noise suppressor as ``audio.input.noise_reduction`` says; None: off."""
    return None if config.noise_reduction is None else NoiseSuppressor(config.noise_reduction)
