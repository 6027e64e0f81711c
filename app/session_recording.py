"""One session's recording: a ``SessionObserver`` (``app.realtime.turn_report``) and the thread that writes it.

The folder (``app.recording`` names and prunes them) holds:

- ``input.flac``: the user's audio as the session heard it, 16 kHz mono (after noise suppression);
- ``output.flac``: the answer's audio as written to the call, 24 kHz mono (a cut answer's tail
  that was written and then cleared included: ``events.jsonl`` says where it was cut);
- ``events.jsonl``: every client event as received and every server event sent, one a line:
  ``{"t": seconds since the session started, "from": "client" | "server", "event": {...}}``;
  base64 audio (``audio`` fields, audio ``delta``s) and images hold ``{"base64_chars": N}`` instead.
  The server's are the session's and its transport's own (a WebSocket's
  ``response.output_audio.delta`` events, whose audio ``output.flac`` holds; its answer to a
  binary frame; a call's last word); ``output_audio_buffer.*`` are there for either transport
  (a WebSocket does not carry them);
- ``transcript.jsonl``: per item, the user's words (input transcription, input_text) and the
  assistant's (its audio transcript or text): ``{"t", "item_id", "role", "text"}``;
- ``timeline.json``, written at the end: the session's turn timeline (``app.turn_timelines``, the
  shape ``GET /debug/turns`` gives a session), ``audio``: where each side's audio lies on the
  session's clock (:class:`AudioPlacement`), so that a player puts both files on it, and
  ``levels``: each side's level per 50 ms on that clock as placed, a cut tail not heard
  (``app.recording_levels``, at most 72,000 whole dB a side);
- ``session.json``, written last: the session id, transport, start and end (UTC), the rates,
  how many queued writes were dropped (``dropped``, 0 unless the disk fell behind), and how
  many turns ``timeline.json`` holds (``turns``).

The session's clock is the one of ``events.jsonl``'s ``t``: seconds since ``session.created`` was
sent (the timeline's ms count from the same moment).

Never written: client secrets (``client_secret`` objects, any ``ek_`` string), ``authorization``,
``api_key``, TURN ``username``/``credential`` fields, and the server's own secrets (the access key,
the engine key, the TURN credential and secret) wherever they appear. A session is recorded once
its ``session.created`` says so (``recording.enabled``); a ``session.updated`` that says it no longer
is deletes the folder. The recorder only queues (bounded in bytes, :data:`MAX_QUEUED_BYTES`); the
writer thread parses, redacts, encodes and writes.
"""

from __future__ import annotations

import copy
import json
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import soundfile

from app.realtime.turn_report import PlaybackReport, SessionStart, TurnReport
from app.recording_levels import LevelTrack, levels_json
from app.turn_timelines import SessionTimeline
from media.rates import SPEECH_RATE, VOICE_RATE

logger = logging.getLogger(__name__)

# What may wait for the writer: ~30 s of a busy session's events and audio (a 256 KiB client
# event at most each); past it writes are dropped and counted (session.json's "dropped").
MAX_QUEUED_BYTES = 32 * 2**20
REDACTED = "[redacted]"
SECRET_KEYS = frozenset({"client_secret", "authorization", "api_key", "credential", "username", "password"})
CLIENT_SECRET_PREFIX = "ek_"
# A side's chunk that begins within this of where its audio so far ends joins it (two WebRTC
# frames of arrival jitter); one later starts a segment of its own, at its own time.
CONTIGUOUS_S = 0.04
Side = Literal["client", "server"]


@dataclass
class AudioPlacement:
    """Where one side's audio file lies on the session's clock: ``segments`` of
    ``[start_ms, first_sample, samples]``, each ``samples`` of the file from ``first_sample`` on
    playing from ``start_ms``; in order, never overlapping.

    A chunk is placed at ``candidate_s`` (the input's: its arrival less its length, as heard
    live; the answer's: when it was written, as played from then on), but never before where the
    side's audio so far ends: a client that sends faster than real time, and an answer written
    ahead of its playback, queue behind what came before. A chunk within ``CONTIGUOUS_S`` of the
    end joins its run. With ``heard_late`` (the input: a chunk arrives after it was said, never
    before), a run starts at the earliest its chunks allow, as a jitter buffer's clock follows its
    fastest packets: one delayed first chunk (a stalled loop's backlog, a slow start) does not push
    the whole call late. ``cut`` ends the audio at a moment (a cut answer's tail, written and never
    played, stays in the file unplaced)."""

    rate: int
    heard_late: bool = False
    segments: list[list[float]] = field(default_factory=list)
    written: int = 0  # the file's samples so far

    def add(self, candidate_s: float, samples: int) -> None:
        """Places the file's next ``samples``."""
        end_s = 0.0
        if self.segments:
            start_ms, first, count = self.segments[-1]
            end_s = start_ms / 1000 + count / self.rate
            if first + count == self.written and candidate_s - end_s <= CONTIGUOUS_S:
                if self.heard_late and candidate_s < end_s:
                    # This chunk, ``count`` samples into the run, was said by candidate_s.
                    before = self.segments[-2] if len(self.segments) > 1 else None
                    floor_s = 0.0 if before is None else before[0] / 1000 + before[2] / self.rate
                    earliest_s = max(candidate_s - count / self.rate, floor_s)
                    if earliest_s < start_ms / 1000:
                        self.segments[-1][0] = round(earliest_s * 1000, 1)
                if samples > 0:
                    self.segments[-1][2] = count + samples
                    self.written += samples
                return
        start_ms = round(max(candidate_s, end_s) * 1000, 1)
        if samples > 0:
            self.segments.append([start_ms, self.written, samples])
            self.written += samples

    def cut(self, at_s: float) -> None:
        """Nothing of what was written plays past ``at_s``."""
        while self.segments:
            start_ms, first, count = self.segments[-1]
            played = max(0, round((at_s - start_ms / 1000) * self.rate))
            if played >= count:
                return
            if played > 0:
                self.segments[-1][2] = played
                return
            self.segments.pop()

    def to_json(self) -> list[list[float]]:
        return [[start_ms, int(first), int(count)] for start_ms, first, count in self.segments]


@dataclass(frozen=True)
class _Event:
    at: float
    side: Side
    event: Mapping[str, Any] | str | bytes  # a client's raw text, a server's event


@dataclass(frozen=True)
class _Audio:
    at: float  # when the recorder got it (monotonic)
    output: bool  # the answer's (24 kHz); else the input (16 kHz)
    pcm: np.ndarray


@dataclass(frozen=True)
class _Cut:
    at: float  # the answer's playback was cut here: what was written past it never played


@dataclass(frozen=True)
class _Finish:
    at: float
    discard: bool  # the session asked not to be recorded: the folder goes
    timeline: dict[str, Any] | None = None  # the session's SessionTimeline.to_json(); None: the process stopped first


_Item = _Event | _Audio | _Cut | _Finish


@dataclass(frozen=True)
class WriterStart:
    """A recorded session's start: its id, transport, and when (``at`` monotonic, ``unix_s``)."""

    session_id: str
    transport: str
    at: float
    unix_s: float


class RecordingWriter:
    """The thread that writes one session's folder (see the module docstring)."""

    def __init__(self, folder: Path, start: WriterStart, *, secrets: tuple[str, ...], before: Callable[[], object],
                 on_done: Callable[[RecordingWriter], None]) -> None:
        """``before`` runs first in the thread (retention); ``on_done`` last."""
        self.folder = folder
        self._started = start.unix_s
        self._session_id = start.session_id
        self._transport = start.transport
        self._monotonic_start = start.at
        self._secrets = secrets
        self._before = before
        self._on_done = on_done
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued_bytes = 0
        self._dropped = 0
        self._finished = False
        self._finish_taken = False  # the writer thread took the finish: nothing more comes
        self._heard = AudioPlacement(SPEECH_RATE, heard_late=True)  # the writer thread's
        self._answered = AudioPlacement(VOICE_RATE)
        self._heard_levels = LevelTrack(SPEECH_RATE)  # the writer thread's, placed at the end
        self._answered_levels = LevelTrack(VOICE_RATE)
        self._thread = threading.Thread(target=self._run, name=f"recording {folder.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Finishes the recording (if its session has not) and waits for it to be written; blocking."""
        self.put(_Finish(time.monotonic(), discard=False))
        self._thread.join()

    def put(self, item: _Item) -> None:
        """Queues ``item``; never blocks. Past :data:`MAX_QUEUED_BYTES` it is dropped and counted;
        after a finish, ignored."""
        size = _size(item)
        with self._lock:
            if self._finished:
                return
            if isinstance(item, _Finish):
                self._finished = True
            elif self._queued_bytes + size > MAX_QUEUED_BYTES:
                self._dropped += 1
                if self._dropped == 1:
                    logger.warning("recording %s: the writer fell behind, dropping what it cannot take", self.folder)
                return
            self._queued_bytes += size
        self._queue.put(item)

    def _run(self) -> None:
        try:
            self._before()
        except OSError:
            logger.exception("recording %s: pruning old recordings failed; recording anyway", self.folder)
        try:
            self._write()
        except Exception:
            logger.exception("recording %s: writing failed; the recording stops here", self.folder)
            if not self._finish_taken:
                self._drain()
        finally:
            self._on_done(self)

    def _drain(self) -> None:
        """After a failure: takes what is queued until the finish, so that its session can go on."""
        while True:
            item = self._queue.get()
            with self._lock:
                self._queued_bytes -= _size(item)
            if isinstance(item, _Finish):
                return

    def _write(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (
            soundfile.SoundFile(self.folder / "input.flac", "w", SPEECH_RATE, 1, "PCM_16", format="FLAC") as heard,
            soundfile.SoundFile(self.folder / "output.flac", "w", VOICE_RATE, 1, "PCM_16", format="FLAC") as answered,
            open(self.folder / "events.jsonl", "w", encoding="utf-8") as events,
            open(self.folder / "transcript.jsonl", "w", encoding="utf-8") as transcript,
        ):
            while True:
                item = self._queue.get()
                with self._lock:
                    self._queued_bytes -= _size(item)
                if isinstance(item, _Finish):
                    self._finish_taken = True
                    finish = item
                    break
                if isinstance(item, _Audio):
                    pcm = np.clip(item.pcm, -1.0, 1.0)
                    (answered if item.output else heard).write(pcm)
                    self._place(item, pcm)
                    continue
                if isinstance(item, _Cut):
                    self._answered.cut(item.at - self._monotonic_start)
                    continue
                at = round(item.at - self._monotonic_start, 3)
                event = self._readable(item)
                events.write(json.dumps({"t": at, "from": item.side, "event": event}, ensure_ascii=False) + "\n")
                if item.side == "server" and isinstance(event, dict):
                    for line in _transcript_lines(event, at):
                        transcript.write(json.dumps(line, ensure_ascii=False) + "\n")
        if finish.discard:
            shutil.rmtree(self.folder, ignore_errors=True)
            logger.info("recording %s: deleted, as its session asked", self.folder)
            return
        closed_s = finish.at - self._monotonic_start
        ended = self._started + closed_s
        timeline = finish.timeline or {
            "session_id": self._session_id, "transport": self._transport, "model": "",
            "started_at": round(self._started, 3), "closed_ms": round(closed_s * 1000, 1),
            "turns": [],
        }
        audio = {"input_rate": SPEECH_RATE, "output_rate": VOICE_RATE,
                 "input": self._heard.to_json(), "output": self._answered.to_json()}
        levels = levels_json(self._heard_levels, self._heard.segments, self._answered_levels, self._answered.segments,
                             closed_s * 1000)
        # Compact: the levels are most of the file (an hour's are 144,000 numbers).
        written = json.dumps({**timeline, "audio": audio, "levels": levels}, separators=(",", ":"))
        (self.folder / "timeline.json").write_text(written + "\n", encoding="utf-8")
        summary = {
            "session_id": self._session_id, "transport": self._transport,
            "started": _utc(self._started), "ended": _utc(ended),
            "input_rate": SPEECH_RATE, "output_rate": VOICE_RATE, "dropped": self._dropped,
            "turns": len(timeline["turns"]),
        }
        (self.folder / "session.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")

    def _place(self, item: _Audio, pcm: np.ndarray) -> None:
        """Places the chunk on the session's clock; its level is placed with it at the end."""
        at = item.at - self._monotonic_start
        if item.output:
            self._answered.add(at, pcm.size)
            self._answered_levels.add(pcm)
        else:
            self._heard.add(at - pcm.size / SPEECH_RATE, pcm.size)
            self._heard_levels.add(pcm)

    def _readable(self, item: _Event) -> Any:
        """The event as written: parsed, its audio and images as lengths, its secrets redacted."""
        event = item.event
        if isinstance(event, (str, bytes)):
            try:
                event = json.loads(event)
            except ValueError:
                return {"unparsed_chars": len(event)}  # its text may be anything: not kept
        return redacted(event, self._secrets)


def redacted(event: Any, secrets: tuple[str, ...]) -> Any:
    """A copy of ``event`` (parsed JSON) with base64 payloads as their lengths and secrets replaced."""
    kind = event.get("type") if isinstance(event, dict) else None
    audio_delta = isinstance(kind, str) and kind.endswith("audio.delta")
    return _redacted(event, secrets, audio_delta=audio_delta)


def _redacted(value: Any, secrets: tuple[str, ...], *, audio_delta: bool) -> Any:
    if isinstance(value, dict):
        copy: dict[str, Any] = {}
        for key, item in value.items():
            if key.lower() in SECRET_KEYS and item is not None:
                copy[key] = REDACTED
            elif isinstance(item, str) and (
                key in ("audio", "image") or (key == "delta" and audio_delta)
                or (key == "image_url" and item.startswith("data:"))
            ):
                copy[key] = {"base64_chars": len(item)}
            else:
                copy[key] = _redacted(item, secrets, audio_delta=audio_delta)
        return copy
    if isinstance(value, list):
        return [_redacted(item, secrets, audio_delta=audio_delta) for item in value]
    if isinstance(value, str):
        if value.startswith(CLIENT_SECRET_PREFIX):
            return REDACTED
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    return value


def _transcript_lines(event: dict[str, Any], at: float) -> list[dict[str, Any]]:
    """The transcript's lines a server event carries: a user's words, or an assistant's."""
    kind = event.get("type")
    if kind == "conversation.item.input_audio_transcription.completed":
        return [{"t": at, "item_id": event.get("item_id"), "role": "user", "text": event.get("transcript", "")}]
    if kind in ("response.output_audio_transcript.done", "response.audio_transcript.done"):
        return [{"t": at, "item_id": event.get("item_id"), "role": "assistant", "text": event.get("transcript", "")}]
    if kind in ("response.output_text.done", "response.text.done"):
        return [{"t": at, "item_id": event.get("item_id"), "role": "assistant", "text": event.get("text", "")}]
    if kind == "conversation.item.added":
        item = event.get("item") or {}
        texts = [part.get("text", "") for part in item.get("content") or () if part.get("type") == "input_text"]
        if item.get("role") == "user" and texts:
            return [{"t": at, "item_id": item.get("id"), "role": "user", "text": "\n".join(texts)}]
    return []


def _size(item: _Item) -> int:
    if isinstance(item, _Audio):
        return int(item.pcm.nbytes)
    if isinstance(item, _Event) and isinstance(item.event, (str, bytes)):
        return len(item.event)
    return 1_024  # a server event: its audio deltas are the most of it, and are counted by the output's audio


def _utc(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds")


class SessionRecorder:
    """A ``SessionObserver`` that records its session (see the module docstring); never blocks."""

    def __init__(self, start_writer: Callable[[WriterStart], RecordingWriter], *, transport: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``start_writer``: a started writer for the session (``app.recording.Recordings``);
        ``clock``: when audio comes (the observer's audio calls carry no time)."""
        self._start_writer = start_writer
        self._transport = transport
        self._clock = clock
        self._writer: RecordingWriter | None = None
        self._timeline: SessionTimeline | None = None  # the recorded session's own, for timeline.json
        self._started_at = 0.0  # session.created's, the recording's clock's zero
        self._decided = False  # session.created was seen: recorded (a writer) or not

    @property
    def folder(self) -> Path | None:
        """Where the session is recorded; None while it is not."""
        return None if self._writer is None else self._writer.folder

    # -- SessionObserver -------------------------------------------------------------------

    def session_started(self, start: SessionStart) -> None:
        if self._timeline is not None:  # on the events' clock: from session.created
            self._timeline.session_started(replace(start, at=self._started_at))

    def turn_done(self, report: TurnReport) -> None:
        if self._timeline is not None:
            self._timeline.turn_done(report)

    def playback_over(self, report: PlaybackReport) -> None:
        if self._timeline is not None:
            self._timeline.playback_over(report)
        if self._writer is not None and report.truncated:
            self._writer.put(_Cut(report.ended_at))

    def session_closed(self, at: float) -> None:
        if self._writer is not None and self._timeline is not None:
            self._timeline.session_closed(at)
            self._writer.put(_Finish(at, discard=False, timeline=self._timeline.to_json()))
        self._writer = None
        self._timeline = None
        self._decided = True

    def client_event(self, raw: str | bytes, at: float) -> None:
        if self._writer is not None:
            self._writer.put(_Event(at, "client", raw))

    def server_event(self, event: Mapping[str, Any], at: float) -> None:
        kind = event.get("type")
        if kind == "session.created" and not self._decided:
            self._decided = True
            session = event.get("session") or {}
            if _recorded(session):
                start = WriterStart(str(session.get("id")), self._transport, at, time.time())
                self._writer = self._start_writer(start)
                self._timeline = SessionTimeline(self._transport, clock=self._clock)
                self._timeline.started_unix = start.unix_s
                self._started_at = at
        elif kind == "session.updated" and self._writer is not None and not _recorded(event.get("session") or {}):
            self._writer.put(_Finish(at, discard=True))
            self._writer = None
            self._timeline = None
            return
        if self._timeline is not None:
            self._timeline.server_event(event, at)
        if self._writer is not None:
            if isinstance(kind, str) and kind.endswith("audio.delta"):
                # The delta's audio is output.flac's: only its length is kept, taken here (cheap)
                # so that the queue does not hold the base64 twice.
                event = {**event, "delta": {"base64_chars": len(str(event.get("delta", "")))}}
            else:
                # A copy for the writer's thread: the transport may still add to the event on the
                # loop as it sends it (a WebRTC call's response.done gets latency.network).
                event = copy.deepcopy(event)
            self._writer.put(_Event(at, "server", event))

    def input_audio(self, pcm: np.ndarray) -> None:
        if self._writer is not None:
            self._writer.put(_Audio(self._clock(), output=False, pcm=np.array(pcm, dtype=np.float32)))

    def output_audio(self, pcm: np.ndarray) -> None:
        if self._writer is not None:
            self._writer.put(_Audio(self._clock(), output=True, pcm=np.array(pcm, dtype=np.float32)))


def _recorded(session: Mapping[str, Any]) -> bool:
    recording = session.get("recording")
    return isinstance(recording, Mapping) and recording.get("enabled") is True
