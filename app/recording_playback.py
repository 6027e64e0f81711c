"""Reading recordings back (``--record-dir``) for the operator page: which there are, their files,
and both sides as one stereo WAV on the session's clock.

Every function here blocks (it reads files): the routes (``app.http.debug``) run them in a thread.
A recording is looked up among the folders :func:`app.recording.recording_folders` lists, by the
session id its name ends with, so no path a client gives is ever opened. What the folder holds:
``app.session_recording``.

The WAV (:func:`wav_size`, :func:`wav_bytes`): 16-bit stereo at the answer's rate (24 kHz), the
user on the left (resampled from 16 kHz with soxr) and the assistant on the right, each side's
segments (``timeline.json``'s ``audio``) at their times and silence between; as long as the
session (``closed_ms``) or its audio, whichever ends later. It is made a block at a time from any
byte on, so that a player may seek (an HTTP range) and an hour's session never sits in memory.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
import soxr

from app.recording import folder_name, folder_size, recording_folders
from media.rates import VOICE_RATE

# The files of a recording a client may fetch, with their media types.
RECORDING_FILES: dict[str, str] = {
    "input.flac": "audio/flac",
    "output.flac": "audio/flac",
    "events.jsonl": "application/x-ndjson",
    "transcript.jsonl": "application/x-ndjson",
    "session.json": "application/json",
    "timeline.json": "application/json",
}
WAV_RATE = VOICE_RATE
WAV_CHANNELS = 2
WAV_SAMPLE_BYTES = 2
WAV_FRAME_BYTES = WAV_CHANNELS * WAV_SAMPLE_BYTES
WAV_HEADER_BYTES = 44
BLOCK_FRAMES = WAV_RATE  # a second a block: 96 KiB of WAV
# Context read on each side of a block's input before resampling it alone, so that the filter's
# edges fall outside the block (soxr's HQ filter at 16 kHz spans a few ms).
RESAMPLE_MARGIN_S = 0.02


@dataclass(frozen=True)
class RecordingSummary:
    """One recording as ``GET /debug/recordings`` lists it."""

    session_id: str
    transport: str | None
    started: str  # UTC, ISO 8601
    ended: str | None  # None: still being written (or its process stopped before it could finish)
    turns: int | None  # None: not finished
    bytes: int


def list_recordings(root: Path) -> list[RecordingSummary]:
    """The recordings under ``root``, newest first."""
    found = []
    for started, folder in reversed(recording_folders(root)):
        summary = _read_json(folder / "session.json") or {}  # written last: the recording is whole
        turns = summary.get("turns")
        found.append(RecordingSummary(
            session_id=str(summary.get("session_id") or folder.name.split("-", 1)[1]),
            transport=str(summary["transport"]) if "transport" in summary else None,
            started=str(summary.get("started") or datetime.fromtimestamp(started, UTC).isoformat()),
            ended=str(summary["ended"]) if "ended" in summary else None,
            turns=turns if isinstance(turns, int) else None,
            bytes=folder_size(folder),
        ))
    return found


def find_recording(root: Path, session_id: str) -> Path | None:
    """The folder of ``session_id``'s recording under ``root``, or None (never a path built from it)."""
    named = folder_name(session_id, 0).split("-", 1)[1]
    for _, folder in recording_folders(root):
        if folder.name.split("-", 1)[1] == named:
            return folder
    return None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class _Side:
    """One side's file and where its segments lie, in the WAV's frames."""

    path: Path
    rate: int
    segments: tuple[tuple[int, int, int], ...]  # (first WAV frame, first file sample, file samples)

    def frames(self, samples: int) -> int:
        return math.ceil(samples * WAV_RATE / self.rate)


@dataclass(frozen=True)
class WavPlan:
    """What :func:`wav_bytes` reads: both sides and the length, from ``timeline.json``."""

    left: _Side
    right: _Side
    frames: int

    @property
    def size(self) -> int:
        return WAV_HEADER_BYTES + self.frames * WAV_FRAME_BYTES


def wav_plan(folder: Path) -> WavPlan | None:
    """The WAV's plan for a recording; None when it has no ``timeline.json`` (not finished)."""
    timeline = _read_json(folder / "timeline.json")
    if timeline is None or not isinstance(timeline.get("audio"), dict):
        return None
    audio = timeline["audio"]

    def side(name: str, rate: int) -> _Side:
        segments = tuple((round(start_ms * WAV_RATE / 1000), int(first), int(count))
                         for start_ms, first, count in audio[name])
        return _Side(folder / f"{name}.flac", rate, segments)

    left, right = side("input", int(audio["input_rate"])), side("output", int(audio["output_rate"]))
    ends = [start + s.frames(count) for s in (left, right) for start, _, count in s.segments]
    session_frames = round((timeline.get("closed_ms") or 0) * WAV_RATE / 1000)
    return WavPlan(left, right, max([session_frames, *ends]))


def wav_header(frames: int) -> bytes:
    data = frames * WAV_FRAME_BYTES
    return (b"RIFF" + struct.pack("<I", 36 + data) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, WAV_CHANNELS, WAV_RATE, WAV_RATE * WAV_FRAME_BYTES,
                                    WAV_FRAME_BYTES, 8 * WAV_SAMPLE_BYTES)
            + b"data" + struct.pack("<I", data))


def wav_bytes(plan: WavPlan, first: int = 0, last: int | None = None) -> Iterator[bytes]:
    """The WAV's bytes ``first`` to ``last`` (inclusive; None: to the end), a block at a time."""
    last = plan.size - 1 if last is None else min(last, plan.size - 1)
    if first <= last and first < WAV_HEADER_BYTES:
        yield wav_header(plan.frames)[first:last + 1]
    # Made in the same blocks whatever the range: a block's resampling does not depend on it.
    frame = max(0, first - WAV_HEADER_BYTES) // WAV_FRAME_BYTES // BLOCK_FRAMES * BLOCK_FRAMES
    skip = max(0, first - WAV_HEADER_BYTES) - frame * WAV_FRAME_BYTES
    end_frame = (last - WAV_HEADER_BYTES) // WAV_FRAME_BYTES + 1 if last >= WAV_HEADER_BYTES else 0
    with ExitStack() as files:
        # A side with no audio (a typed session's input) may have an empty file: not opened.
        left, right = (files.enter_context(soundfile.SoundFile(side.path)) if side.segments else None
                       for side in (plan.left, plan.right))
        while frame < end_frame:
            stop = min(frame + BLOCK_FRAMES, end_frame)
            block = np.stack([_block(plan.left, left, frame, stop), _block(plan.right, right, frame, stop)], axis=1)
            data = (np.clip(block, -1.0, 1.0) * 32767).astype("<i2").tobytes()
            tail = (last - WAV_HEADER_BYTES + 1) - frame * WAV_FRAME_BYTES
            yield data[skip:tail]
            skip = 0
            frame = stop


def _block(side: _Side, sound: soundfile.SoundFile | None, start: int, stop: int) -> np.ndarray:
    """WAV frames ``start`` to ``stop`` of one side."""
    out = np.zeros(stop - start, dtype=np.float32)
    if sound is None:
        return out
    for placed, first, count in side.segments:
        lo, hi = max(start, placed), min(stop, placed + side.frames(count))
        if lo >= hi:
            continue
        out[lo - start:hi - start] = _resampled(side, sound, first, count, lo - placed, hi - lo)
    return out


def _resampled(side: _Side, sound: soundfile.SoundFile, first: int, count: int, offset: int, frames: int) -> np.ndarray:
    """``frames`` WAV frames of a segment (``count`` file samples from ``first``), from its ``offset``-th."""
    if side.rate == WAV_RATE:
        sound.seek(first + offset)
        pcm = sound.read(min(frames, count - offset), dtype="float32")
        return np.pad(pcm, (0, frames - pcm.size))
    # Resampled from a whole number of the rates' common period, so that the output lines up.
    common = math.gcd(side.rate, WAV_RATE)
    step_in, step_out = side.rate // common, WAV_RATE // common
    margin = math.ceil(RESAMPLE_MARGIN_S * side.rate / step_in) * step_in
    begin = max(0, (offset * side.rate // WAV_RATE) // step_in * step_in - margin)
    end = min(count, math.ceil((offset + frames) * side.rate / WAV_RATE) + margin)
    sound.seek(first + begin)
    pcm = sound.read(end - begin, dtype="float32")
    resampled = soxr.resample(pcm, side.rate, WAV_RATE, quality="HQ") if pcm.size else pcm
    at = offset - begin // step_in * step_out
    piece = np.asarray(resampled[at:at + frames], dtype=np.float32)
    return np.pad(piece, (0, frames - piece.size))
