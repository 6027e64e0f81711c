"""Speech level: other voices in the room are not the user's speech.

Silero scores a window by its spectrum, not its level, so a television, a colleague across the
room or the babble of a café are speech to it as much as the user is. :class:`SpeechLevelGate`
takes a window the VAD called speech away from it (its probability becomes 0) when its level
says it is not the user's:

- below ``floor_dbfs`` (-36 dBFS): the user speaks into the microphone at -30 to -15 dBFS
  (a browser's automatic gain holds speech near -26); a voice 10-20 dB below that is across the
  room. A client that sends quieter speech lowers it (or turns it off: null);
- less than ``over_background_db`` (12 dB) above the room's steady level, the 10th percentile of
  the last 8 s of windows: babble and other people talking at once fill every window, while a
  user's speech stands out of them, and the pauses between words and breaths bring the estimate
  down again. The full margin holds while other voices are about (the VAD heard speech outside
  the user's utterances in a quarter of the last 8 s: babble, a television); over a background
  the VAD does not take for speech (a fan, traffic, brown noise) half of it does, because a
  steady noise does not start turns by itself and speech 10 dB over it must. Speech already under
  way needs three quarters of the margin to go on (a hysteresis, as the VAD's own threshold has):
  a speaker's softer words do not end their turn;
- more than ``under_user_db`` (15 dB) below the user's own level, learnt from the windows of
  their confirmed speech (once 1 s of it has been heard): another voice quieter than the user's
  does not start speech (within an utterance, the pauses between words are the speaker's).

A window's level is its RMS over 32 ms, held for ``HOLD_WINDOWS`` so that the soft ends of
words are judged with the syllable before them. Each rule is off when its value is None.
Measurements: docs/SESSION.md, "Other voices".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

BACKGROUND_WINDOWS = 250  # 8 s of 32 ms windows: holds a breath or a pause even in a monologue
BACKGROUND_PERCENTILE = 10
IN_SPEECH_MARGIN = 0.75  # of over_background_db, once an utterance is under way
# Babble keeps the VAD in speech in 83-99 % of its windows, one talker with pauses in 68-81 %,
# steady noise and music in none; a user's onsets (250 ms a sentence) stay well under 25 %.
VOICES_ABOUT_FRACTION = 0.25
VOICES_KNOWN_WINDOWS = 62  # 2 s outside utterances before the room is judged free of voices
QUIET_ROOM_MARGIN = 0.5  # of over_background_db, when no other voices are about
IN_SPEECH_FLOOR_DB = 6.0  # below floor_dbfs, once an utterance is under way
IN_SPEECH_GRACE_WINDOWS = 5  # ~160 ms: longer than the pause between two words
UNSURE_BELOW = 0.05  # under the threshold, over its hysteresis (0.15 below it)
HOLD_WINDOWS = 3  # ~100 ms: a syllable's soft end is judged with the syllable
USER_WINDOWS_BEFORE_TRUSTED = 31  # 1 s of the user's speech before their level is a rule
USER_LEVEL_WEIGHT = 0.02  # each speech window moves the user's level 2 % of the way (~1.5 s memory)
_SILENT_DBFS = -100.0


@dataclass(frozen=True)
class LevelRules:
    """The gate's thresholds; None turns a rule off."""

    floor_dbfs: float | None = -36.0
    over_background_db: float | None = 12.0
    under_user_db: float | None = 15.0


def window_dbfs(window: np.ndarray) -> float:
    power = float(np.mean(np.square(window, dtype=np.float64)))
    return 10.0 * np.log10(power) if power > 0 else _SILENT_DBFS


class SpeechLevelGate:
    """One input stream's level gate: each scored window in, its probability (or 0) out."""

    def __init__(self) -> None:
        self._levels: deque[float] = deque(maxlen=BACKGROUND_WINDOWS)
        self._voices: deque[bool] = deque(maxlen=BACKGROUND_WINDOWS)  # outside utterances: VAD speech?
        self._voice_windows = 0
        self._utterance_windows = 0  # windows since the current utterance began
        self._recent: deque[float] = deque(maxlen=HOLD_WINDOWS)
        self._user_dbfs: float | None = None
        self._user_windows = 0
        self._gated_run = 0  # windows taken from the VAD in a row

    @property
    def user_dbfs(self) -> float | None:
        """The user's speech level as learnt so far; None until it is trusted."""
        return self._user_dbfs if self._user_windows >= USER_WINDOWS_BEFORE_TRUSTED else None

    def background_dbfs(self) -> float:
        return float(np.percentile(self._levels, BACKGROUND_PERCENTILE)) if self._levels else _SILENT_DBFS

    @property
    def voices_about(self) -> bool:
        """Other voices may be about: the VAD heard speech in a quarter of the last 8 s of windows
        outside utterances, or fewer than 2 s of such windows are known, or an utterance has gone
        on for 8 s (the room's state is only learnt outside utterances: assume the worst)."""
        return (len(self._voices) < VOICES_KNOWN_WINDOWS or self._utterance_windows >= BACKGROUND_WINDOWS
                or self._voice_windows >= VOICES_ABOUT_FRACTION * len(self._voices))

    def admit(self, window: np.ndarray, probability: float, rules: LevelRules, *, threshold: float,
              in_speech: bool) -> float:
        """``probability``, or 0 when the window's level says the speech is someone else's;
        ``in_speech``: an utterance is under way (the background margin is lowered)."""
        level = window_dbfs(window)
        background = self.background_dbfs()
        voices_about = self.voices_about
        self._levels.append(level)
        self._recent.append(level)
        self._utterance_windows = self._utterance_windows + 1 if in_speech else 0
        if not in_speech:  # within an utterance the voice is the user's: the room's state holds
            voice = probability >= threshold
            if len(self._voices) == BACKGROUND_WINDOWS:
                self._voice_windows -= self._voices[0]
            self._voices.append(voice)
            self._voice_windows += voice
        if probability < threshold:
            return probability
        # Starting speech is judged window by window; speech under way by its last ~100 ms, with
        # lower bars (a hysteresis): a voice's peaks do not start a turn, a speaker's soft words
        # do not end one.
        held = max(self._recent) if in_speech else level
        floor, margin = rules.floor_dbfs, rules.over_background_db
        if margin is not None and not voices_about:
            margin *= QUIET_ROOM_MARGIN
        if in_speech:
            floor = None if floor is None else floor - IN_SPEECH_FLOOR_DB
            margin = None if margin is None else margin * IN_SPEECH_MARGIN
        if (floor is not None and held < floor) or (
            margin is not None and len(self._levels) == BACKGROUND_WINDOWS and held < background + margin
        ):
            return self._gated(probability, threshold, in_speech=in_speech)
        self._gated_run = 0
        user = self.user_dbfs
        # Only to start speech: within the user's own utterance, the pauses between their words
        # are theirs (gating them would end speech mid-sentence and throw a speculative answer away).
        if rules.under_user_db is not None and user is not None and not in_speech and held < user - rules.under_user_db:
            return 0.0
        return probability

    def _gated(self, probability: float, threshold: float, *, in_speech: bool) -> float:
        """A window taken from the VAD: not speech (0), or within an utterance, for its first
        ``IN_SPEECH_GRACE_WINDOWS``, unsure (neither speech nor the start of a silence): a pause
        between words stays the speaker's, babble going on past it ends the utterance."""
        self._gated_run += 1
        if in_speech and self._gated_run <= IN_SPEECH_GRACE_WINDOWS:
            return min(probability, threshold - UNSURE_BELOW)
        return 0.0

    def heard_user(self, window: np.ndarray) -> None:
        """A window of the user's confirmed speech (admitted, in an utterance): learn their level."""
        level = window_dbfs(window)
        self._user_windows += 1
        if self._user_dbfs is None:
            self._user_dbfs = level
        else:
            self._user_dbfs += USER_LEVEL_WEIGHT * (level - self._user_dbfs)
