"""What the listener heard of an answer: played audio → codec frames → voiced Thinker tokens.

Qwen3-Omni's Talker speaks one codec frame (80 ms, 1,920 samples at 24 kHz) per step and
consumes one Thinker answer token per frame: the step that makes frame ``f`` (0-based) has been
fed answer tokens ``0..f``. The Thinker runs ahead of the audio (its text streams out long
before Code2Wav has decoded the frames that speak it), so text *generated* says nothing about
text *heard*; the frames played do. The engine reports, per ``AudioChunk``, the frames the chunk
completes and the answer tokens voiced by all frames up to its end
(``AudioChunk.text_tokens_voiced``). :class:`VoicedAudio` keeps those marks on the item's own
sample clock, and :meth:`VoicedAudio.tokens_heard` maps samples played to tokens heard:

- whole chunks played: the tokens their frames voiced;
- part of a chunk played: its frames are taken in proportion to its samples played, rounded
  down (a frame counts once all of it has played), each voicing the next token, up to what
  the whole chunk voices.

An engine that does not count frames (``frames == text_tokens_voiced == 0`` on every chunk)
gets the same rule with frames estimated from its audio, one per 1,920 samples, each voicing one
of the tokens released before that audio was written.
docs/SESSION.md ("History as heard") has the edge cases.
"""

from __future__ import annotations

from dataclasses import dataclass

from media.rates import VOICE_RATE

CODEC_FRAME_MS = 80  # one Talker step
CODEC_FRAME_SAMPLES = VOICE_RATE * CODEC_FRAME_MS // 1000


@dataclass(frozen=True)
class VoicedMark:
    """Cumulative, at the end of one chunk: samples written, codec frames, answer tokens voiced."""

    samples: int
    frames: int
    voiced: int


_START = VoicedMark(0, 0, 0)


class VoicedAudio:
    """One answer's audio as written, chunk by chunk, with the Thinker tokens its frames voice."""

    def __init__(self) -> None:
        self._marks: list[VoicedMark] = []
        self._engine_counts_frames = False

    @property
    def samples(self) -> int:
        return self._marks[-1].samples if self._marks else 0

    @property
    def voiced(self) -> int:
        """Tokens voiced by all the audio written so far."""
        return self._marks[-1].voiced if self._marks else 0

    def add(self, samples: int, *, frames: int, text_tokens_voiced: int, tokens_released: int) -> None:
        """One chunk of ``samples``; ``frames``/``text_tokens_voiced`` as in ``AudioChunk``;
        ``tokens_released``: text deltas the engine had released when the chunk came."""
        last = self._marks[-1] if self._marks else _START
        total = last.samples + samples
        self._engine_counts_frames = self._engine_counts_frames or frames > 0 or text_tokens_voiced > 0
        if self._engine_counts_frames:
            mark = VoicedMark(total, last.frames + frames, max(last.voiced, text_tokens_voiced))
        else:
            estimated = total // CODEC_FRAME_SAMPLES
            mark = VoicedMark(total, estimated, max(last.voiced, min(estimated, tokens_released)))
        self._marks.append(mark)

    def tokens_heard(self, heard_samples: int) -> int:
        """Answer tokens voiced by the frames within the first ``heard_samples`` samples."""
        previous = _START
        for mark in self._marks:
            if heard_samples >= mark.samples:
                previous = mark
                continue
            span = mark.samples - previous.samples
            into = max(heard_samples - previous.samples, 0)
            frames = into * (mark.frames - previous.frames) // span  # whole frames of this chunk played
            return min(previous.voiced + frames, mark.voiced)
        return previous.voiced
