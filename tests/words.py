"""Stand-in text judges for semantic VAD: ``TranscriptJudge`` reads a given transcript and judges it
by rule; ``HeldJudge`` answers only once released, counting the checks in flight.

The real judge (``app.realtime.turn_taking.EngineTextJudge``) has Qwen3-Omni transcribe the
utterance and score P(``<|im_end|>``) after the text; on the dev model both are noise. ``TranscriptJudge``
is given the transcript (the test's or the bench's knowledge of what was said so far) and answers like a sensible language model would on clear cases, by a fixed English rule
written before any fixture was scored, not fitted to them:

- the last word is one after which an English sentence does not end (an article, a
  preposition, a conjunction, a possessive, a modal or auxiliary verb, a filler):
  ``INCOMPLETE`` (0.02), whatever punctuation an ASR put after it ("Please put the.");
- else a sentence-final mark (. ? !): ``COMPLETE`` (0.9);
- else ``UNSURE`` (0.5): "We went to the park" may go on or not.
"""

from __future__ import annotations

import asyncio

import numpy as np

from app.realtime.turn_taking import WordsVerdict

INCOMPLETE, UNSURE, COMPLETE = 0.02, 0.5, 0.9
DANGLING_WORDS = frozenset(
    # articles and determiners
    "a an the this that these those every each some any no my your his her its our their".split()
    # prepositions
    + "to for of in on at by with from about into onto over under between through during after before "
      "than like as".split()
    # conjunctions and relative words
    + "and but or nor so because if when while although though unless until whether where which who whose "
      "that".split()
    # modal and auxiliary verbs, and the copula's forms that need a complement when they end a statement
    + "could would should can will must might may shall is are was were am be been being have has had "
      "do does did".split()
    # fillers
    + "um uh er erm".split()
)


def complete_probability(transcript: str) -> float:
    words = transcript.lower().replace("…", " ").split()
    if not words:
        return UNSURE
    last = words[-1].strip(".,;:!?\"'()")
    if last in DANGLING_WORDS:
        return INCOMPLETE
    if transcript.rstrip().endswith((".", "?", "!")):
        return COMPLETE
    return UNSURE


class TranscriptJudge:
    """``app.realtime.turn_taking.TextJudge`` that hears ``transcript`` (a test sets what was said
    so far) and judges it by ``complete_probability``; ``judged`` records each transcript judged."""

    def __init__(self, transcript: str) -> None:
        self.transcript = transcript
        self.judged: list[str] = []

    async def judge(self, pcm: np.ndarray) -> WordsVerdict:
        self.judged.append(self.transcript)
        return WordsVerdict(self.transcript, complete_probability(self.transcript))


class HeldJudge:
    """A text judge that answers only once released, counting the checks in flight."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sizes: list[int] = []  # samples of each utterance judged
        self.running = self.most_running = self.cancelled = 0

    async def judge(self, pcm: np.ndarray) -> WordsVerdict:
        self.sizes.append(pcm.size)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.release.wait()
            return WordsVerdict("Hm", 0.5)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
