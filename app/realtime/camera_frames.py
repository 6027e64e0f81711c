"""Camera frames for user turns: which sampled frames join the utterance being committed.

The call samples its video track (``media.video.VideoSampler``) at the session's rates
(``session.video``) and hands each kept frame to the session, which keeps them here. While the
user speaks (from ``speech_started`` to the utterance's commit) the newest ``frames_per_turn``
are kept; before that only the newest ``frames_per_turn + 1`` frames seen while idle. A commit
``take``s the frames of its utterance, in time order: the last one seen before speech started,
then those seen while it was spoken. A segment of a long utterance takes what arrived since
the previous segment. A commit without speech detection (manual commits, the idle timeout)
takes the newest idle frames. Frames never start a turn by themselves.

Frames a client pushes itself (DashScope's ``input_image_buffer.append``, as its SDK's
``append_video`` sends them, up to 2 a second) are kept the same way, at most one per sampling
interval (``speaking_fps`` while the user speaks, ``idle_fps`` otherwise, as the call's camera is
sampled); the others are dropped before they are decoded (*decided*: a turn then sees frames spread
over its utterance, as with the camera, not only its last second or two).

Memory is bounded: at most ``frames_per_turn + 1`` JPEGs of at most the session's pixel budget.
"""

from __future__ import annotations

import math
from collections import deque

from app.realtime.session_config import VideoInput
from media.frames import FramePlan, SampledFrame
from pipeline.conversation import UserImage
from pipeline.images import fitted_size


class TurnFrames:
    """The recent camera frames of one session and whether the user is speaking."""

    def __init__(self) -> None:
        self.speaking = False
        self._idle: deque[UserImage] = deque()  # seen while not speaking, newest last
        self._before: UserImage | None = None  # the last idle frame when speech started
        self._during: deque[UserImage] = deque()  # seen while speaking, since speech or the last take
        self._pushed_at = -math.inf  # when the last pushed frame was kept (the loop's monotonic clock)

    def __len__(self) -> int:
        return len(self._idle) + len(self._during) + (self._before is not None)

    def plan(self, video: VideoInput) -> FramePlan | None:
        """How often to sample the camera now and at what size; None: no frame is wanted now."""
        fps = video.speaking_fps if self.speaking else video.idle_fps
        if fps <= 0 or video.frames_per_turn == 0:
            return None
        max_pixels = video.max_pixels
        return FramePlan(1.0 / fps, lambda width, height: fitted_size(width, height, max_pixels=max_pixels))

    def wants_pushed(self, video: VideoInput, now: float) -> bool:
        """Whether a frame a client pushes at ``now`` is to be kept: one per sampling interval."""
        plan = self.plan(video)
        return plan is not None and now - self._pushed_at >= plan.interval_s

    def add_pushed(self, frame: UserImage, video: VideoInput, now: float) -> None:
        self._pushed_at = now
        self.add(frame, video.frames_per_turn)

    def keep(self, frame: SampledFrame, video: VideoInput) -> None:
        """A frame the call sampled, kept as an image at the session's pixel budget."""
        self.add(UserImage(frame.data, frame.width, frame.height, video.max_pixels), video.frames_per_turn)

    def add(self, frame: UserImage, frames_per_turn: int) -> None:
        if frames_per_turn == 0:
            return
        if self.speaking:
            _push(self._during, frame, frames_per_turn)
        else:
            _push(self._idle, frame, frames_per_turn + 1)

    def speech_started(self) -> None:
        self.speaking = True
        self._before = self._idle[-1] if self._idle else None
        self._idle.clear()
        self._during.clear()

    def speech_ended(self) -> None:
        """The utterance was committed or dropped: later frames are idle ones."""
        self.speaking = False
        self._before = None
        self._during.clear()

    def take(self, frames_per_turn: int) -> tuple[UserImage, ...]:
        """The frames of the utterance being committed (see the module docstring), oldest first."""
        taken = self.peek(frames_per_turn)
        if frames_per_turn and self.speaking:
            self._before = None
            self._during.clear()
        elif frames_per_turn:
            self._idle.clear()
        return taken

    def peek(self, frames_per_turn: int) -> tuple[UserImage, ...]:
        """What ``take`` would return now, taking nothing (a speculative answer's frames)."""
        if frames_per_turn == 0:
            return ()
        if self.speaking:
            before = () if self._before is None else (self._before,)
            return (*before, *list(self._during)[-frames_per_turn:])
        return tuple(list(self._idle)[-(frames_per_turn + 1) :])


def _push(frames: deque[UserImage], frame: UserImage, keep: int) -> None:
    frames.append(frame)
    while len(frames) > keep:
        frames.popleft()
