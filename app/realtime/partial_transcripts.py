"""Partial transcripts: the user's words while they speak, each partial superseded by the next.

With input transcription on (``audio.input.transcription``, its ``partials`` not false), while the
user speaks (server or semantic VAD: from ``speech_started`` to the commit) the session transcribes
the utterance so far, about every second of it, and sends what it heard as
``conversation.item.input_audio_transcription.delta`` events for the item ``speech_started``
announced, before that item exists. The final transcription after the commit
(``app.realtime.transcription``) then goes on from what the partials said. docs/SESSION.md
"Partial transcripts" is the client's side; the rules here:

- **What a partial is**: Qwen3-Omni's ASR turn (``TurnRequest.transcription``) over the item's
  audio so far, as a commit now would hold it (since the last 30 s segment: a partial transcribes
  at most one segment), started as a *preemptible* engine turn (``pipeline.contract``): only on spare
  capacity (else refused at once), cancelled for any committed turn that needs its slot
  (``preempted``), never promoted. It never waits in a queue and never delays a committed turn.
- **When**: the first once the item holds ``PARTIAL_INTERVAL_MS`` of audio (its prefix padding
  included), then after each further step of audio: 1 s, or a quarter of the audio so far once
  that is longer (past 4 s), so that what an utterance's partials transcribe in all stays within
  ~5x its audio, not its square. Only while speech is heard: none starts in a trailing silence
  (the speculative answer's own transcription takes over there), nor on digital silence.
- **One in flight per session**: a partial due while the previous one still runs supersedes it
  (cancelled in the engine, its result never shown), and the step doubles with each one
  superseded in a row (up to 8x), so that an engine slower than the cadence still shows some;
  the commit, ``input_audio_buffer.clear``, transcription or partials turned off and the close
  cancel the one in flight. A cancelled, refused, preempted or failed partial sends nothing.
- **What a client gets** (one event per partial that ends by itself with a new hypothesis):
  ``delta`` keeps OpenAI's meaning, text appended to what the item's deltas said before, which a
  client that concatenates them (LiveKit) shows: the words of the newest hypothesis that the
  previous one agreed on, past what was already sent (LocalAgreement-2, as whisper_streaming's:
  Macháček, Dabre and Bojar, "Turning Whisper into Real-Time Transcription System", 2023; words
  compared whole, a CJK character as a word), often ``""``. Two extensions: ``partial`` (true) and
  ``transcript``, the whole hypothesis, which replaces the previous event's (the page shows it).
  ``PartialText`` keeps that state per item part: the final transcription's deltas append only
  what it says past the partials' agreed words when it starts with them, else nothing more
  (``.completed`` carries the final text, as always).
- The audio part's ``content_index`` is the one a commit now would give it (after the camera
  frames the item would take); when a new frame changes it, that part's text starts over.

Each partial is reported (``on_outcome``): ``started``, then one of ``done``, ``superseded``,
``cancelled``, ``refused``, ``preempted`` or ``failed``, with the engine seconds it ran (its
start to its end or cancel; 0 for a refusal).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.realtime.held_turn import HeldTurn
from app.realtime.protocol import ConversationItemInputAudioTranscriptionDeltaEvent, new_id
from app.realtime.session_config import InputTranscription
from app.realtime.turn_taking import SpeechSoFar
from media.rates import SPEECH_RATE
from pipeline.contract import NO_SPARE_CAPACITY, PREEMPTED, Engine, TurnRequest
from pipeline.conversation import UserAudio

logger = logging.getLogger(__name__)

# The cadence: "every second or so of speech" (issue 35). Qwen3-Omni's audio encoder makes 12.5
# tokens a second, so a second adds ~13 audio tokens and, in English, 2-3 words.
PARTIAL_INTERVAL_MS = 1_000
# Past 4 s the step is this share of the audio so far: each partial transcribes the whole
# utterance, so with fixed 1 s steps a 30 s segment's partials would transcribe 465 s of audio;
# with this rule 13 partials transcribe ~140 s (~5x the audio, at most).
STEP_SHARE = 0.25
MAX_BACKOFF_DOUBLINGS = 3  # superseded partials in a row double the step, up to 8x

# One word, as partial hypotheses are compared: its leading space and a run of non-space
# characters, or one CJK character (Chinese and Japanese put no spaces between words); trailing space.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)|\s+$")

# (outcome, engine seconds): "started", then "done", "superseded", "cancelled", "refused",
# "preempted" or "failed".
PartialObserver = Callable[[str, float], None]


def words(text: str) -> list[str]:
    """``text`` cut into words as hypotheses are compared; they join back to ``text``."""
    return _WORD.findall(text)


def agreed_prefix(older: str, newer: str) -> str:
    """The words two hypotheses start with alike (LocalAgreement-2's commit)."""
    agreed: list[str] = []
    for a, b in zip(words(older), words(newer), strict=False):
        if a != b:
            break
        agreed.append(a)
    return "".join(agreed)


@dataclass
class PartialText:
    """What one item part's transcription deltas have said (``shown``: their concatenation, what
    a client that appends them shows) and the newest partial hypothesis (``latest``)."""

    content_index: int
    shown: str = ""
    latest: str | None = None

    def partial(self, hypothesis: str) -> str | None:
        """The ``delta`` of a new partial hypothesis: the words the previous one agreed on past
        what was shown (often ""); None: nothing new to tell (the same text again, or a first empty one)."""
        previous, self.latest = self.latest, hypothesis
        if hypothesis == (previous or ""):
            return None
        agreed = "" if previous is None else agreed_prefix(previous, hypothesis)
        return self._extend(agreed) or ""

    def final(self, text: str) -> str | None:
        """The ``delta`` of the final transcription's text so far: what it says past ``shown`` when
        it starts with it; None otherwise (nothing new yet, or it revises what the partials said:
        the ``.completed`` transcript tells the client)."""
        return self._extend(text)

    def _extend(self, text: str) -> str | None:
        if len(text) <= len(self.shown) or not text.startswith(self.shown):
            return None
        delta, self.shown = text[len(self.shown):], text
        return delta


class PartialTranscripts:
    """One session's partial transcripts: the item being spoken, the partial in flight, the cadence.

    ``content_index``: the audio part's index a commit now would give it. ``close()`` cancels the
    partial in flight and awaits every one it started (safe twice).
    """

    def __init__(self, engine: Engine, emit: Callable[[Any], None], content_index: Callable[[], int], *,
                 session_id: str, on_outcome: PartialObserver | None = None) -> None:
        self._engine = engine
        self._emit = emit
        self._content_index = content_index
        self._session_id = session_id
        self._on_outcome = on_outcome
        self._item_id: str | None = None  # the item being spoken
        self._text: PartialText | None = None  # what its partials have said
        self._next_due = 0  # its audio, in samples, at which the next partial is due
        self._superseded = 0  # partials superseded in a row
        self._current: HeldTurn | None = None
        self._stopping: list[HeldTurn] = []  # cancelled, maybe still stopping in the engine
        self._closed = False

    def __len__(self) -> int:
        """Partial turns still running (stats)."""
        return int(self._current is not None) + sum(not held.stopped for held in self._stopping)

    def heard(self, speech: SpeechSoFar | None, settings: InputTranscription | None) -> None:
        """After each piece of input: the item being spoken (None: none) and the session's transcription."""
        if self._closed:
            return
        if speech is None:
            if self._item_id is not None:
                self.stop()  # dropped without a commit (input_audio_buffer.clear, a turn detection change)
            return
        if speech.item_id != self._item_id:
            self.stop()
            self._item_id = speech.item_id
            self._next_due = PARTIAL_INTERVAL_MS * SPEECH_RATE // 1000
        if settings is None or not settings.partials:
            self._cancel("cancelled")
            return
        if speech.hearing and speech.samples >= self._next_due:
            self._start(speech, settings)

    def committed(self, item_id: str) -> PartialText | None:
        """``item_id`` was committed: its partial in flight is cancelled; what its partials said
        is handed to the final transcription."""
        text = self._text if item_id == self._item_id else None
        self.stop()
        return text

    def stop(self) -> None:
        """The utterance is over (committed or dropped): nothing of it is transcribed partially any more."""
        self._cancel("cancelled")
        self._item_id = None
        self._text = None
        self._superseded = 0

    async def close(self) -> None:
        self._closed = True
        self.stop()
        stopping, self._stopping = self._stopping, []
        for held in stopping:
            await held.close()

    def _start(self, speech: SpeechSoFar, settings: InputTranscription) -> None:
        if self._current is not None:
            self._superseded += 1
            self._cancel("superseded")
        pcm = speech.audio()
        step = max(PARTIAL_INTERVAL_MS * SPEECH_RATE // 1000, int(pcm.size * STEP_SHARE))
        # From the point it was due (the audio comes in 20 ms pieces, or more: no drift), unless
        # it started later than that by a step or more (after a pause).
        anchor = self._next_due if pcm.size - self._next_due < step else pcm.size
        self._next_due = anchor + step * 2 ** min(self._superseded, MAX_BACKOFF_DOUBLINGS)
        if not np.any(pcm):
            return  # digital silence (a muted microphone) holds no words
        request = dataclasses.replace(TurnRequest.transcription(UserAudio(pcm), settings.hint()),
                                      preemptible_id=new_id("partial"))
        self._report("started", 0.0)
        self._current = HeldTurn(self._engine, request, name=f"partial transcript {speech.item_id}",
                                 on_end=self._ended)

    def _ended(self, held: HeldTurn) -> None:
        """A partial ended by itself: shown if it has a transcript, else forgotten."""
        if held is not self._current:
            return
        self._current = None
        code = held.engine_code
        if code == NO_SPARE_CAPACITY:
            self._report("refused", 0.0)
            return
        if code == PREEMPTED:
            self._report("preempted", held.engine_seconds())
            return
        done = held.done
        if done is None:
            logger.warning("session %s: a partial transcript failed (%r); the final transcription is unaffected",
                           self._session_id, held.error)
            self._report("failed", held.engine_seconds())
            return
        self._superseded = 0
        self._report("done", held.engine_seconds())
        self._show(done.text)

    def _show(self, hypothesis: str) -> None:
        assert self._item_id is not None
        index = self._content_index()
        if self._text is None or self._text.content_index != index:
            self._text = PartialText(index)
        delta = self._text.partial(hypothesis)
        if delta is not None:
            self._emit(ConversationItemInputAudioTranscriptionDeltaEvent(
                item_id=self._item_id, content_index=index, delta=delta, partial=True, transcript=hypothesis,
            ))

    def _cancel(self, outcome: str) -> None:
        held, self._current = self._current, None
        if held is None:
            return
        self._report(outcome, held.engine_seconds())
        held.cancel()
        self._stopping = [other for other in self._stopping if not other.stopped]
        self._stopping.append(held)

    def _report(self, outcome: str, engine_seconds: float) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome, engine_seconds)
