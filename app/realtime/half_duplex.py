"""Half-duplex listening (``interrupt_response: false``): not hearing the assistant as the user.

From a response's start until its audio has been sent, plus ``ECHO_TAIL_MS`` of input, the
session does not act on speech: the assistant's voice reaches the microphone through the
speakers. The tail suppresses echo, not the user: speech whose onset the VAD puts inside the
tail (at or after the answer's last frame) and that is still going on when the tail ends is a
quick reply and becomes a user turn; its audio starts where the speech started (less the
prefix padding, never before the answer's last frame, give or take one 32 ms VAD window). A short blip confined to the tail has
gone quiet by then and is dropped when it ends, like speech that began while the assistant spoke.
"""

from __future__ import annotations

from dataclasses import dataclass

from media.rates import SPEECH_RATE
from media.turn_detection import VoiceActivityDetector
from media.vad import WINDOW_SAMPLES

# After the assistant's audio has been sent, its tail is still in the browser's jitter buffer
# and speaker, and its echo reaches the microphone ~100-300 ms later; half-duplex keeps not
# acting on speech that starts before then.
ECHO_TAIL_MS = 400
_TAIL_SAMPLES = ECHO_TAIL_MS * SPEECH_RATE // 1000


@dataclass(frozen=True)
class Listening:
    """Listening again; ``quick_reply_start_ms`` is set when speech begun in the tail is taken as a turn."""

    quick_reply_start_ms: int | None


class HalfDuplex:
    """Whether the session is deaf now, and when and how it listens again; positions in input samples."""

    def __init__(self) -> None:
        self.deaf = False
        self._tail_start: int | None = None  # the answer's audio ended here (deaf, once idle)

    def responding(self) -> None:
        """A response starts: deaf until its audio has played and the tail has passed."""
        self.deaf = True
        self._tail_start = None

    def idle(self, input_samples: int) -> None:
        """The assistant has finished speaking (or answering without audio): the tail starts."""
        if self.deaf:
            self._tail_start = input_samples

    def off(self) -> None:
        """Barge-in or manual mode: never deaf."""
        self.deaf = False
        self._tail_start = None

    def listen_again(
        self, input_samples: int, detector: VoiceActivityDetector, user_speaking: bool
    ) -> Listening | None:
        """Called after each input chunk; ``Listening`` once the session may act on speech again."""
        tail_start = self._tail_start
        if not self.deaf or tail_start is None or input_samples < tail_start + _TAIL_SAMPLES:
            return None
        onset = detector.speech_onset_sample
        # The VAD places an onset at the start of its 32 ms window: the window holding the
        # tail's first sample counts as inside the tail.
        if onset is None or onset + WINDOW_SAMPLES <= tail_start:
            if user_speaking:
                return None  # began while the assistant spoke (or is its echo): dropped when it ends
            detector.reset()  # whatever the VAD holds began while the assistant spoke
            self.off()
            return Listening(quick_reply_start_ms=None)
        if user_speaking and not detector.hearing_speech:
            return None  # a blip in the tail, quiet now: a turn only if it resumes before it ends
        detector.forget_before(min(onset, tail_start))
        self.off()
        return Listening(quick_reply_start_ms=detector.audio_start_ms if user_speaking else None)
