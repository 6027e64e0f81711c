"""Echo cancellation: the answer's own voice taken out of the caller's microphone.

A caller who plays the answer through a speaker with no echo cancellation of its own (a phone
bridge, a kiosk, a speakerphone) sends the answer back to us, 150-450 ms late and 6-12 dB down;
the VAD hears it as speech. The server knows exactly what it played: :class:`EchoCanceller`
feeds every 20 ms frame the outbound track sends (silence included) to WebRTC's echo canceller
(AEC3, from the audio-processing module that the ``livekit`` wheel ships) as the far end, and
runs the call's 16 kHz input through it before the session hears it.

- The far end is fed 100 ms late (``REFERENCE_DELAY_MS``): AEC3 finds echoes up to ~500 ms after
  their reference, and the echo of a WebRTC call comes back no sooner than 100 ms (the peer's
  jitter buffer, its playout and the way back), so 100-600 ms of round trip are covered.
- Frames are 10 ms, as the module requires; input that does not fill one waits for the next.
- The canceller adapts from the call's first frame, but its output replaces the input only once
  :class:`EchoDetector` has found the answer in it: the input's level following what was played,
  at one delay, for a second of the answer. A fresh AEC3 treats the caller's speech over the
  first answer as possible echo (a half-second "yeah" vanished whole), and most callers (a
  browser, which cancels its own echo; a headless client, which plays nothing) have no echo to
  remove.
- ``removed_seconds`` counts input heard while the answer played whose level the canceller cut
  by ``REMOVED_DB`` or more, once in use (the metrics' "echo suppressed").

livekit's native library starts its threads with the first canceller, in the process that makes
it (a media worker, never a forkserver); the module is imported only then. The measurements
behind the choice: docs/SESSION.md, "Echo".
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from media.rates import SPEECH_RATE, WIRE_RATE

if TYPE_CHECKING:
    from livekit import rtc

REFERENCE_DELAY_MS = 100
FRAME_MS = 10  # the audio-processing module's frame
_CAPTURE_SAMPLES = SPEECH_RATE * FRAME_MS // 1000
_RENDER_SAMPLES = WIRE_RATE * FRAME_MS // 1000
# An input frame counts as echo removed when the canceller took this much off it, and it was
# louder than the floor: speech at -50 dBFS and below is not what turns a VAD on.
REMOVED_DB = 10.0
_FLOOR = 10 ** (-50 / 20) * 32767
# The echo detector, in 10 ms frames: the input's level over the last 2 s against what was
# played 0-600 ms before it. An echo's correlation is 0.6-0.9; two voices' stays under 0.4.
_DETECT_FRAMES = 200
_MAX_LAG_FRAMES = 60
_PLAYED_KEPT = 1024  # a power of two, more than _DETECT_FRAMES + _MAX_LAG_FRAMES
_ECHO_CORRELATION = 0.5
_ESTIMATE_EVERY = 10  # frames (100 ms)
_AGREEING_ESTIMATES = 3  # in a row, with one delay (± 20 ms)
_PLAYED_RANGE_DB = 20.0  # the answer played with pauses in it: a level to follow
_SILENT_DB = -100.0


def _power_db(samples: np.ndarray) -> float:
    power = float(np.mean(np.square(samples, dtype=np.float64))) / 32767.0**2
    return 10.0 * np.log10(power) if power > 1e-10 else _SILENT_DB


class EchoDetector:
    """Whether the input holds what was played: the correlation of the input's level with the
    played level 0-600 ms before, over the last 2 s; sticky once found (the room stays the room)."""

    def __init__(self) -> None:
        self._played = np.full(_PLAYED_KEPT, _SILENT_DB)
        self._played_count = 0
        self._input_db: list[float] = []
        self._input_played_at: list[int] = []  # the played count when each input frame came
        self._frames = 0
        self._agreeing = 0
        self._lag: int | None = None
        self.present = False

    def played(self, power_db: float) -> None:
        self._played[self._played_count % _PLAYED_KEPT] = power_db
        self._played_count += 1

    def heard(self, power_db: float) -> None:
        self._input_db.append(power_db)
        self._input_played_at.append(self._played_count)
        if len(self._input_db) > _DETECT_FRAMES:
            del self._input_db[0], self._input_played_at[0]
        self._frames += 1
        if not self.present and self._frames % _ESTIMATE_EVERY == 0 and len(self._input_db) == _DETECT_FRAMES:
            self._estimate()

    def _estimate(self) -> None:
        at = np.asarray(self._input_played_at)
        lags = np.arange(_MAX_LAG_FRAMES + 1)
        index = at[None, :] - 1 - lags[:, None]  # the frame played lag frames before each input frame
        if index.min() < 0 or self._played_count - index.min() > _PLAYED_KEPT:
            return
        played = self._played[index % _PLAYED_KEPT]
        if np.ptp(played) < _PLAYED_RANGE_DB or played.max() < -50.0:
            self._agreeing = 0
            return
        heard = np.asarray(self._input_db) - np.mean(self._input_db)
        played = played - played.mean(axis=1, keepdims=True)
        norms = np.sqrt(np.sum(np.square(played), axis=1) * np.sum(np.square(heard))) + 1e-9
        correlation = played @ heard / norms
        best = int(np.argmax(correlation))
        if correlation[best] < _ECHO_CORRELATION:
            self._agreeing = 0
            return
        same_delay = self._lag is not None and abs(best - self._lag) <= 2
        self._agreeing = self._agreeing + 1 if same_delay else 1
        self._lag = best
        if self._agreeing >= _AGREEING_ESTIMATES:
            self.present = True


class EchoCanceller:
    """One call's echo canceller: ``played`` with each frame sent, ``captured`` with the input."""

    def __init__(self) -> None:
        from livekit import rtc  # the native library loads here, in the process that needs it

        self._rtc = rtc
        self._apm: rtc.AudioProcessingModule = rtc.AudioProcessingModule(echo_cancellation=True,
                                                                           high_pass_filter=True)
        silence = np.zeros(_RENDER_SAMPLES, dtype=np.int16)
        self._reference: deque[np.ndarray] = deque(silence for _ in range(REFERENCE_DELAY_MS // FRAME_MS))
        self._pending = np.zeros(0, dtype=np.int16)
        self._playing = False  # the last frame played held audio
        self.detector = EchoDetector()
        self.removed_seconds = 0.0

    def played(self, frame: np.ndarray, *, audio: bool) -> None:
        """A 48 kHz int16 frame (any whole number of 10 ms) the outbound track just sent;
        ``audio``: it held the answer's audio (not silence)."""
        self._playing = audio
        for start in range(0, frame.size - _RENDER_SAMPLES + 1, _RENDER_SAMPLES):
            self._reference.append(frame[start : start + _RENDER_SAMPLES])
            self.detector.played(_power_db(frame[start : start + _RENDER_SAMPLES]))
            delayed = self._reference.popleft()
            self._apm.process_reverse_stream(self._frame(delayed, WIRE_RATE))

    def captured(self, pcm: np.ndarray) -> np.ndarray:
        """16 kHz float32 input in; the whole 10 ms frames among what has come in out, without the
        answer's echo once there is one (the rest waits for the next chunk)."""
        pcm16 = np.clip(np.rint(np.asarray(pcm, dtype=np.float32) * 32767.0), -32768, 32767).astype(np.int16)
        samples = np.concatenate([self._pending, pcm16]) if self._pending.size else pcm16
        whole = samples.size - samples.size % _CAPTURE_SAMPLES
        self._pending = samples[whole:].copy()
        out = np.empty(whole, dtype=np.float32)
        for start in range(0, whole, _CAPTURE_SAMPLES):
            heard = samples[start : start + _CAPTURE_SAMPLES]
            self.detector.heard(_power_db(heard))
            frame = self._frame(heard, SPEECH_RATE)
            self._apm.process_stream(frame)  # adapting from the first frame, in use once there is an echo
            if not self.detector.present:
                out[start : start + _CAPTURE_SAMPLES] = heard / 32767.0
                continue
            cleaned = np.frombuffer(frame.data, dtype=np.int16)
            if self._playing:
                self._count_removed(heard, cleaned)
            out[start : start + _CAPTURE_SAMPLES] = cleaned / 32767.0
        return out

    def _frame(self, samples: np.ndarray, rate: int) -> rtc.AudioFrame:
        return self._rtc.AudioFrame(bytearray(samples.tobytes()), rate, 1, samples.size)

    def _count_removed(self, before: np.ndarray, after: np.ndarray) -> None:
        level_before = float(np.sqrt(np.mean(np.square(before, dtype=np.float64))))
        if level_before < _FLOOR:
            return
        level_after = float(np.sqrt(np.mean(np.square(after, dtype=np.float64))))
        if level_after * 10 ** (REMOVED_DB / 20) <= level_before:
            self.removed_seconds += FRAME_MS / 1000
