"""Noise suppression: the user's 16 kHz input cleaned before the VAD and the model hear it.

:class:`NoiseSuppressor` runs WebRTC's own noise suppressor (with its high-pass filter) from the
``webrtc-noise-gain`` wheel: the audio-processing module that browsers apply to a microphone,
built for 10 ms frames of 16 kHz PCM16, about 0.15 % of a core per call. Chunks of any size go
in; whole 10 ms frames come out, the rest waits for the next chunk (a 20 ms WebRTC frame is two
whole frames, so nothing waits in a call). The level follows OpenAI's ``noise_reduction`` types:

- ``near_field`` (a headset or a phone held close): moderate suppression, 12 dB;
- ``far_field`` (a laptop or a room microphone): high suppression, 18 dB.

Automatic gain is left off: it would lift a distant voice toward the user's level, and turn
taking tells voices apart by level. Why this denoiser, and the others measured: docs/SESSION.md,
"Noise reduction".
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from webrtc_noise_gain import AudioProcessor

from media.rates import SPEECH_RATE

NoiseReduction = Literal["near_field", "far_field"]

FRAME_SAMPLES = SPEECH_RATE // 100  # WebRTC's audio processing takes 10 ms frames
# webrtc-noise-gain's levels: 1 = 6 dB, 2 = 12 dB, 3 = 18 dB, 4 = 21 dB of suppression.
SUPPRESSION_LEVEL: dict[NoiseReduction, int] = {"near_field": 2, "far_field": 3}
_NO_AUTO_GAIN = 0


class NoiseSuppressor:
    """One input stream's noise suppressor; its state (the noise estimate) follows the stream."""

    def __init__(self, kind: NoiseReduction) -> None:
        self.kind = kind
        self._processor = AudioProcessor(_NO_AUTO_GAIN, SUPPRESSION_LEVEL[kind])
        self._pending = np.zeros(0, dtype=np.int16)

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """16 kHz float32 mono in; the whole 10 ms frames among what has come in, cleaned, out."""
        pcm16 = np.clip(np.rint(np.asarray(pcm, dtype=np.float32) * 32767.0), -32768, 32767).astype(np.int16)
        samples = np.concatenate([self._pending, pcm16]) if self._pending.size else pcm16
        whole = samples.size - samples.size % FRAME_SAMPLES
        self._pending = samples[whole:].copy()
        if whole == 0:
            return np.zeros(0, dtype=np.float32)
        data = samples[:whole].tobytes()
        step = FRAME_SAMPLES * 2
        cleaned = b"".join(self._processor.Process10ms(data[start : start + step]).audio
                           for start in range(0, len(data), step))
        return np.frombuffer(cleaned, dtype=np.int16).astype(np.float32) / 32767.0
