"""Recordings of the sessions, on request (``--record-dir``): a folder per session, and their retention.

Every process that holds sessions records its own (the server process for its WebSocket sessions
and its WebRTC calls without media workers, each media worker for its calls), into the same
directory. Each has one :class:`Recordings`: ``session_recorder`` gives a session its observer
(``app.session_recording``), which writes from a thread of its own; ``close`` waits for every
writer to finish (off the event loop) when the process stops serving.

Retention (:func:`prune`): when a recording starts, its writer removes the oldest folders past
the count, age and size bounds (``record_max_*``). Only folders named as recordings are touched
(``20261205T070512Z-sess_...``: the UTC start, then the session id), oldest by that name first.
What is recorded and what never is: ``app.session_recording``; reading them back (the operator
page's): ``app.recording_playback``; docs/OPERATING.md "Recordings".
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.config import Settings
from app.session_recording import RecordingWriter, SessionRecorder, WriterStart

logger = logging.getLogger(__name__)

FOLDER_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
_FOLDER_NAME = re.compile(r"^(\d{8}T\d{6}Z)-[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class RetentionBounds:
    """How many recordings are kept, for how long, in how many bytes together."""

    max_sessions: int
    max_age_s: float
    max_bytes: int


def folder_name(session_id: str, started: float) -> str:
    """A recording's folder: its UTC start (``started``, unix seconds), then the session id."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", session_id)
    return f"{datetime.fromtimestamp(started, UTC).strftime(FOLDER_TIME_FORMAT)}-{safe}"


def recording_folders(root: Path) -> list[tuple[float, Path]]:
    """The recordings under ``root`` (folders named as :func:`folder_name` makes them), oldest first,
    each with its start (unix seconds)."""
    found: list[tuple[float, Path]] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    for path in entries:
        match = _FOLDER_NAME.match(path.name)
        if match is None or not path.is_dir():
            continue
        started = datetime.strptime(match.group(1), FOLDER_TIME_FORMAT).replace(tzinfo=UTC).timestamp()
        found.append((started, path))
    return sorted(found, key=lambda pair: (pair[0], pair[1].name))


def prune(root: Path, bounds: RetentionBounds, *, keep: Path, live: frozenset[Path] = frozenset(),
          now: float | None = None) -> list[Path]:
    """Removes the oldest recordings under ``root`` past ``bounds``, never ``keep`` (the one
    starting, counted toward the number) nor ``live`` ones (still written by this process);
    returns those removed. Blocking: a writer thread runs it. Several processes may prune at
    once: a folder gone meanwhile is no error."""
    now = time.time() if now is None else now
    others = [(started, path) for started, path in recording_folders(root) if path != keep and path not in live]
    removed: list[Path] = []
    sizes = {path: folder_size(path) for _, path in others}
    total = sum(sizes.values())
    for index, (started, path) in enumerate(others):
        left = len(others) - index  # this one and the newer others
        too_many = left + 1 > bounds.max_sessions
        too_old = now - started > bounds.max_age_s
        too_big = total > bounds.max_bytes
        if not (too_many or too_old or too_big):
            break  # the rest are newer: within the count and the size, and younger
        shutil.rmtree(path, onerror=_removal_failed)
        total -= sizes[path]
        removed.append(path)
    if removed:
        logger.info("recordings: removed %d past the retention bounds (%s)", len(removed), bounds)
    return removed


def _removal_failed(function: object, path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
    """A file of a recording being removed: gone already (another process pruned it) is no error."""
    if not isinstance(exc_info[1], FileNotFoundError):
        logger.error("recordings: could not remove %s: %s", path, exc_info[1])


def folder_size(folder: Path) -> int:
    """The bytes of a recording's files (those removed meanwhile not counted)."""
    size = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                size += path.stat().st_size
        except OSError:  # removed meanwhile by another process pruning
            continue
    return size


class Recordings:
    """One process's recordings (see the module docstring)."""

    def __init__(self, root: Path, bounds: RetentionBounds, secrets: tuple[str, ...]) -> None:
        """``secrets``: strings never written (the access key, TURN credentials...), replaced wherever found."""
        self._root = root
        self._bounds = bounds
        self._secrets = secrets
        self._lock = threading.Lock()
        self._writers: set[RecordingWriter] = set()

    @classmethod
    def of(cls, settings: Settings) -> Recordings | None:
        """The recordings ``settings`` ask for; None: ``record_dir`` is not set."""
        if settings.record_dir is None:
            return None
        secrets = tuple(
            secret.get_secret_value()
            for secret in (settings.api_key, settings.engine_api_key, settings.ice_credential, settings.ice_auth_secret)
            if secret is not None and secret.get_secret_value()
        )
        bounds = RetentionBounds(settings.record_max_sessions, settings.record_max_age_s, settings.record_max_bytes)
        return cls(settings.record_dir, bounds, secrets)

    def session_recorder(self, transport: str) -> SessionRecorder:
        """A new session's observer; it writes only once ``session.created`` says it is recorded."""
        return SessionRecorder(self._start_writer, transport=transport)

    def _start_writer(self, start: WriterStart) -> RecordingWriter:
        folder = self._root / folder_name(start.session_id, start.unix_s)
        with self._lock:
            writer = RecordingWriter(
                folder, start, secrets=self._secrets,
                before=lambda: prune(self._root, self._bounds, keep=folder, live=self._live()),
                on_done=self._finished,
            )
            self._writers.add(writer)
        writer.start()
        return writer

    def _live(self) -> frozenset[Path]:
        with self._lock:
            return frozenset(writer.folder for writer in self._writers)

    def _finished(self, writer: RecordingWriter) -> None:
        with self._lock:
            self._writers.discard(writer)

    def close(self) -> None:
        """Waits for every writer to flush and finish (their sessions are closed); blocking: run
        it off the event loop. Safe twice."""
        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            writer.join()
