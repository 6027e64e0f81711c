"""semantic_vad's second opinion: do the *words* said so far make a complete turn?

The end-of-turn model hears prosody only; after "Please put the" a voice whose pitch falls may
sound finished (it scored 0.92-0.99 on held-out synthetic voices), while no English sentence ends
on "the". A ``TextJudge`` answers from the words: P(the utterance so far is a complete turn).

``EngineTextJudge`` is the real one, Qwen3-Omni itself on the engine, no second model:
1. its own ASR writes down the utterance so far (``TurnRequest.transcription``: the ASR prompt of
   Qwen3-Omni's README, text only, greedy — the input transcription's path);
2. the Thinker reads that transcript as an open user message (``TurnRequest.end_of_turn``:
   ``<|im_start|>user\\n{transcript}``) and the engine returns its probability of
   ``<|im_end|>`` next, i.e. of the user's message ending there (the idea of LiveKit's text
   turn detector, with the conversation model itself as the language model).

On the dev model its words are noise; tests use a stand-in that reads a given transcript
(tests/words.py) behind the same interface.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.contract import Engine, EngineError, TranscriptionHint, TurnDone, TurnRequest
from pipeline.conversation import UserAudio


@dataclass(frozen=True)
class WordsVerdict:
    transcript: str
    complete: float | None  # P(a complete turn); None: no words to judge (nothing was transcribed)


class TextJudge(Protocol):
    """Judges an utterance by its words; the session runs it beside the end-of-turn model."""

    async def judge(self, pcm: np.ndarray) -> WordsVerdict:
        """``pcm``: the utterance so far, 16 kHz mono float32, trailing silence included."""
        ...


class EngineTextJudge:
    """Qwen3-Omni's ASR, then the Thinker's P(``<|im_end|>``) after the transcript (two engine turns)."""

    def __init__(self, engine: Engine, hint: TranscriptionHint | None = None) -> None:
        self._engine = engine
        self._hint = hint

    async def judge(self, pcm: np.ndarray) -> WordsVerdict:
        transcript = (await self._run(TurnRequest.transcription(UserAudio(pcm), self._hint))).text.strip()
        if not transcript:
            return WordsVerdict("", None)
        done = await self._run(TurnRequest.end_of_turn(transcript))
        if done.end_of_turn_probability is None:
            raise EngineError("The engine scored no end of turn.", code="engine_protocol_error")
        return WordsVerdict(transcript, done.end_of_turn_probability)

    async def _run(self, request: TurnRequest) -> TurnDone:
        async with contextlib.aclosing(self._engine.run_turn(request)) as turn:
            async for event in turn:
                if isinstance(event, TurnDone):
                    return event
        raise EngineError("The engine ended a turn without TurnDone.", code="engine_protocol_error")
