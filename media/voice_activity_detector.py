"""Server VAD over a stream: any-size 16 kHz chunks in, ``DetectorEvent``s out.

``VoiceActivityDetector`` cuts the chunks into silero's 512-sample windows, scores them through a
``VadStream`` and feeds the (window, probability) pairs to a ``TurnCommitBuffer``
(``media.commit_buffer``). The timing rules (where speech starts and ends, the silence wait,
segments, forced ends, semantic VAD's checks): docs/SESSION.md, "Turn detection".
"""

from __future__ import annotations

import numpy as np

from media.commit_buffer import TurnCommitBuffer, samples_to_ms
from media.detector_events import DetectorEvent
from media.detector_params import TurnDetectionParams
from media.speech_level import SpeechLevelGate
from media.vad import WINDOW_SAMPLES, SpeechModel


class VoiceActivityDetector:
    """Any-size 16 kHz float32 chunks → 512-sample windows → silero VAD → the level gate
    (``media.speech_level``: other voices in the room) → TurnCommitBuffer.

    One per session. Samples that do not fill a window wait for the next chunk.
    """

    def __init__(self, vad: SpeechModel, params: TurnDetectionParams) -> None:
        self._stream = vad.new_stream()
        self._buffer = TurnCommitBuffer(params)
        self._levels = SpeechLevelGate()
        self._pending = np.zeros(0, dtype=np.float32)

    @property
    def params(self) -> TurnDetectionParams:
        return self._buffer.params

    @property
    def in_speech(self) -> bool:
        return self._buffer.in_speech

    @property
    def hearing_speech(self) -> bool:
        return self._buffer.hearing_speech

    @property
    def speech_onset_sample(self) -> int | None:
        return self._buffer.speech_onset

    @property
    def position(self) -> int:
        """16 kHz samples the detector has taken in (whole windows, and samples pushed unscored)."""
        return self._buffer.position

    @property
    def speech_heard_until(self) -> int | None:
        """Where the current utterance's last speech window ends; None between utterances."""
        return self._buffer.speech_heard_until

    @property
    def audio_start_ms(self) -> int:
        return samples_to_ms(self._buffer.audio_start)

    @property
    def utterance_samples(self) -> int:
        """Samples of the utterance so far (since the last segment) while in confirmed speech; else 0."""
        return self._buffer.utterance_samples

    def utterance_audio(self) -> np.ndarray:
        """The utterance so far, as a commit now would hold it (partial transcripts)."""
        return self._buffer.utterance_audio()

    def forget_before(self, position: int) -> None:
        """Drop buffered audio before input sample ``position``; speech begun before it is dropped."""
        self._buffer.forget_before(position)

    def update(self, params: TurnDetectionParams) -> None:
        """New parameters apply from the next window; an utterance in progress carries on."""
        self._buffer.params = params

    def decide(self, check_id: int, probability: float) -> list[DetectorEvent]:
        """The end-of-turn model's answer to an ``EndOfTurnCheck`` (see ``TurnCommitBuffer.decide``)."""
        return self._buffer.decide(check_id, probability)

    def decide_words(self, check_id: int, probability: float | None) -> list[DetectorEvent]:
        """The text judge's answer to a check that asked for the words (``TurnCommitBuffer.decide_words``)."""
        return self._buffer.decide_words(check_id, probability)

    def push(self, pcm: np.ndarray) -> list[DetectorEvent]:
        if pcm.ndim != 1 or not np.issubdtype(pcm.dtype, np.floating):
            raise ValueError(f"expected 1-D float 16 kHz mono PCM, got {pcm.dtype} array of shape {pcm.shape}")
        samples = np.concatenate([self._pending, pcm.astype(np.float32, copy=False)])
        whole = samples.size - samples.size % WINDOW_SAMPLES
        events: list[DetectorEvent] = []
        params = self._buffer.params
        for start in range(0, whole, WINDOW_SAMPLES):
            window = samples[start : start + WINDOW_SAMPLES]
            probability = self._levels.admit(window, self._stream.probability(window), params.levels,
                                             threshold=params.threshold, in_speech=self._buffer.in_speech)
            events.extend(self._buffer.push(window, probability))
            if probability >= params.threshold and self._buffer.in_speech:
                self._levels.heard_user(window)
        self._pending = samples[whole:]
        if self._pending.size:
            # They may complete server VAD's wait now, not when their window is complete.
            events.extend(self._buffer.push_unscored(self._pending))
        return events

    def reset(self) -> None:
        """Drop buffered audio and speech state (input_audio_buffer.clear, half-duplex discard).

        The VAD's recurrent state and the partial window are kept: they describe the
        continuous input stream, and zeroing the model mid-stream makes its next
        ~100 ms of probabilities unreliable.
        """
        self._buffer.reset()
