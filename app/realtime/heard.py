"""What the listener heard of an answer: audio played → answer tokens heard.

Qwen3-Omni's Talker is *fed* one answer token per codec frame (12.5 a second) but *speaks*
at a person's pace, ~3-4 tokens a second, and goes on speaking after the text has been fed:
frames do not map to tokens one to one, and the Thinker's text runs far ahead of the audio.
The rule (*decided*; docs/MODEL.md "Heard text" has its measured error) takes only what every
engine gives: the samples played, the answer's samples, and its tokens.

- **The answer's audio is complete** (its response ended by itself: every frame it will
  have is written): its audio speaks its text from start to end at an even pace, so the
  tokens heard are the text's share of the audio played, ``tokens * played // samples``
  (rounded down: a token counts once all of its share has played).
- **It is not** (cut while still generating: the total is unknown): the tokens a voice
  speaks in the time played, at ``SPEAKING_TOKENS_PER_SECOND``, never more than the text
  released so far.

An engine that reports codec frames and one that reports none (a remote engine that streams
PCM) get the same rule.
"""

from __future__ import annotations

from media.rates import VOICE_RATE

# A trained Talker's pace: English speech at ~150 words a minute is ~2.5 words, ~3.3 Qwen
# tokens a second; Chinese at ~4-5 characters a second is ~3-4 tokens. Used only while an
# answer's total audio is unknown.
SPEAKING_TOKENS_PER_SECOND = 3.5


def tokens_heard(played_samples: int, *, audio_samples: int, tokens: int, complete: bool) -> int:
    """Answer tokens heard when the first ``played_samples`` of its audio were played.

    ``audio_samples``: the answer's audio written so far; ``tokens``: its text tokens released
    so far; ``complete``: that audio and text are the whole answer.
    """
    if played_samples <= 0 or tokens <= 0:
        return 0
    if complete:
        if played_samples >= audio_samples:
            return tokens
        return tokens * played_samples // audio_samples
    return min(tokens, int(played_samples * SPEAKING_TOKENS_PER_SECOND) // VOICE_RATE)
