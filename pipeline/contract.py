"""What one generation takes and what it yields: the contract between the session and any engine.

A generation is the engine's unit of work: one request, its events, one ``GenerationDone`` (a
user's turn is the session's word). Generations are *ordinary* (committed: a visitor waits for
them) or *preemptible* (``GenerationRequest.preemptible_id`` set: work that may be thrown away,
such as an answer started speculatively before its user turn was committed,
``app.realtime.speculation``). The rules every engine keeps (``Engine``):

- a preemptible generation starts only with spare capacity, else it is refused at once (its
  first ``anext`` raises ``EngineError`` with code ``no_spare_capacity``); it never waits in a
  queue;
- an ordinary generation never waits for a preemptible one: when it needs a slot that a
  preemptible generation holds, that one is cancelled in the engine and its consumer gets
  ``EngineError`` with code ``preempted``;
- ``Engine.promote(preemptible_id)`` makes a running preemptible generation ordinary from then
  on: it runs to its end like any committed one. It answers False when the generation is no
  longer running preemptibly (it ended, was preempted or refused, or never existed); its last
  event, or its error, is then already on its way to the consumer.

What counts as capacity is each engine's (``pipeline.local.transformers_engine.TransformersEngine``:
fewer generations than ``max_batch``; ``pipeline.vllm_omni.vllm_omni_engine.VllmOmniEngine``: a
documented rule, since a vLLM-Omni server does not say how full it is).

What an engine can do is on the engine (``Engine.capabilities``, :class:`EngineCapabilities`), for
whoever decides before a generation exists: the session refuses or turns off what its engine
lacks, and the server builds nothing that needs it. A generation that asks for what its engine
lacks is its caller's mistake (no session sends one), not a failure the engine owes a code for.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

import numpy as np

from pipeline.conversation import Conversation, UserAudio, UserText

Voice = Literal["ethan", "chelsie", "aiden"]
VOICES: tuple[Voice, ...] = ("ethan", "chelsie", "aiden")
# "respond": answer the conversation. "transcribe": write down what its one user clip says
# (Qwen3-Omni's own ASR prompt, pipeline.local.prompt.PromptRenderer.render_request). "end_of_turn":
# how likely its one user text is a whole message (GenerationDone.end_of_turn_probability; no text).
GenerationTask = Literal["respond", "transcribe", "end_of_turn"]

# A transcript's length bound: fast speech is ~4 words (~6 tokens) a second in English and ~6
# characters a second in Chinese; 10 tokens a second plus 16 leaves room and still stops a
# model that repeats itself.
TRANSCRIPTION_TOKENS_PER_SECOND = 10
TRANSCRIPTION_MIN_TOKENS = 16
TRANSCRIPTION_MAX_TOKENS = 4096


@dataclass(frozen=True)
class TranscriptionHint:
    """What the client said about the audio to transcribe (``audio.input.transcription``)."""

    language: str | None = None  # ISO-639-1, e.g. "en"
    prompt: str | None = None  # free text: vocabulary, names, style


# The sampling temperature of an answer when the client sets none (OpenAI's session default).
DEFAULT_TEMPERATURE = 0.8


@dataclass(frozen=True)
class GenerationRequest:
    conversation: Conversation
    voice: Voice = "ethan"
    temperature: float = DEFAULT_TEMPERATURE
    # None: until the Thinker stops by itself ("inf" in the protocol).
    max_output_tokens: int | None = None
    output_audio: bool = True
    task: GenerationTask = "respond"
    hint: TranscriptionHint | None = None  # task "transcribe" only
    # The answer's text, forced through the real tokenizer instead of sampled (the dev model's
    # scripted replies, ``omni-rtc serve --dev-replies``); it continues any forced call opening.
    forced_reply: str | None = None
    # Set: a preemptible generation, named so that ``Engine.promote`` can make it ordinary (the module
    # docstring has the rules); unique among the engine's generations. None: an ordinary generation.
    preemptible_id: str | None = None

    @classmethod
    def transcription(cls, clip: UserAudio, hint: TranscriptionHint | None = None) -> GenerationRequest:
        """Transcribe one clip: text only (no Talker), greedy (Qwen's evaluation setting), bounded."""
        max_tokens = TRANSCRIPTION_MIN_TOKENS + int(clip.seconds * TRANSCRIPTION_TOKENS_PER_SECOND)
        return cls(
            conversation=Conversation(items=(clip,)),
            temperature=0.0,
            max_output_tokens=min(max_tokens, TRANSCRIPTION_MAX_TOKENS),
            output_audio=False,
            task="transcribe",
            hint=hint or TranscriptionHint(),
        )

    @classmethod
    def end_of_turn(cls, text: str) -> GenerationRequest:
        """The Thinker's P(``<|im_end|>``) right after ``text`` as an open user message: one
        forward pass, no token generated (``GenerationDone.end_of_turn_probability``)."""
        return cls(conversation=Conversation(items=(UserText(text),)), temperature=0.0, max_output_tokens=1,
                   output_audio=False, task="end_of_turn")


@dataclass(frozen=True)
class TextDelta:
    """Answer text as it is released. ``tokens``: the Thinker tokens it completes; more than one
    when a character's UTF-8 bytes span tokens and were held back until whole (the session maps
    audio heard to tokens, then tokens to text)."""

    text: str
    tokens: int = 1


@dataclass(frozen=True)
class AudioChunk:
    """Float32 mono PCM at 24 kHz, in order; chunks concatenate to the generation's waveform.

    ``frames``: the codec frames (80 ms of speech each) this chunk completes. A chunk holds
    only final samples, so its PCM is not exactly ``frames * 1920`` long: the first chunk lacks
    a fixed tail that needs the next frame, and the chunk after it starts with that tail.
    Which answer tokens a listener heard is the session's to work out from the samples it
    played (``app.realtime.history``): the Talker is fed one token per frame but speaks ~3-4 a
    second, so frames do not tell tokens.
    """

    pcm: np.ndarray
    frames: int = 0


@dataclass(frozen=True)
class FunctionCallStarted:
    """The answer began function call ``index`` (0-based, in the answer) of function ``name``.

    From the first call on the answer's speech is over: the Talker was fed none of the call's
    markup and no text after it. Each call streams as one ``FunctionCallStarted``, its
    arguments' ``FunctionCallDelta``s, then one ``FunctionCallDone``.
    """

    index: int
    name: str


@dataclass(frozen=True)
class FunctionCallDelta:
    """More of call ``index``'s arguments, as the model writes them (JSON text)."""

    index: int
    delta: str


@dataclass(frozen=True)
class FunctionCallDone:
    """Call ``index`` as written: ``arguments`` is its deltas joined. ``closed``: the model ended
    it with ``</tool_call>`` (False: the answer stopped inside it). ``well_formed``: its body
    was ``{"name": …, "arguments": …}`` (False: delivered as written, name possibly empty)."""

    index: int
    name: str
    arguments: str
    closed: bool = True
    well_formed: bool = True


@dataclass(frozen=True)
class Usage:
    input_text_tokens: int
    input_audio_tokens: int
    output_text_tokens: int
    output_audio_tokens: int = 0  # Talker codec frames
    input_image_tokens: int = 0  # expanded <|image_pad|> tokens

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_audio_tokens + self.input_image_tokens

    @property
    def output_tokens(self) -> int:
        return self.output_text_tokens + self.output_audio_tokens


FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class GenerationTimings:
    """Seconds, measured inside the engine, from the moment the generation was submitted."""

    queue_wait: float = 0.0
    first_text: float | None = None
    first_audio: float | None = None
    total: float = 0.0


@dataclass(frozen=True)
class GenerationDone:
    """The last event of every generation that did not raise."""

    text: str
    usage: Usage
    finish_reason: FinishReason
    timings: GenerationTimings = field(default_factory=GenerationTimings)
    end_of_turn_probability: float | None = None  # task "end_of_turn" only


FunctionCallEvent = FunctionCallStarted | FunctionCallDelta | FunctionCallDone
GenerationEvent = TextDelta | AudioChunk | FunctionCallEvent | GenerationDone


@dataclass(frozen=True, kw_only=True)
class EngineCapabilities:
    """What an engine's generations can hold or do beyond answering and transcribing, which every engine
    does. A pool of engines can do what every one of its members can (``shared_by``)."""

    # Answers call the conversation's tools (``FunctionCall*`` events) and prompts hold calls and
    # their outputs: tools the model may call, and a call in the history, need it.
    function_calls: bool
    # Answers start with a call when ``tool_choice`` is ``required`` or names a function.
    forced_function_calls: bool
    # Runs task "end_of_turn" (``GenerationDone.end_of_turn_probability``): semantic_vad's text judge needs it.
    end_of_turn_scores: bool
    # Sees ``UserImage`` items (input_image, camera frames).
    images: bool
    # Takes preemptible generations (``GenerationRequest.preemptible_id``, the module docstring): speculative
    # answers and partial transcripts are made of them.
    preemptible_generations: bool

    @classmethod
    def shared_by(cls, capabilities: Iterable[EngineCapabilities]) -> EngineCapabilities:
        """What every one of ``capabilities`` can do (a generation may go to any member of a pool)."""
        every = list(capabilities)
        return cls(**{can.name: all(getattr(each, can.name) for each in every) for can in fields(cls)})


# Why a generation ended with EngineError: every code an engine, or a wrapper around one, raises.
# app.realtime.failures gives each one a client is told its fixed message.
EngineErrorCode = Literal[
    "no_spare_capacity",  # a preemptible generation refused for want of a free slot (the module docstring)
    "preempted",  # a preemptible generation cancelled for an ordinary one that needed its slot
    "engine_error",  # the engine failed the generation (an exception in it)
    "engine_unavailable",  # the engine is not running, or its server cannot be reached
    "engine_load_failed",  # the model could not be loaded
    "engine_died",  # the engine's process ended during the generation
    "engine_timeout",  # the engine produced nothing for too long (app.serving.engines)
    "engine_protocol_error",  # the engine's stream ended without GenerationDone, or was malformed
    "engine_stream_error",  # an engine server's stream broke off
    "engine_http_error",  # an engine server refused the generation
    "prompt_too_long",  # the prompt is longer than the engine takes (pipeline.token_count)
    "context_length_exceeded",  # the history is past the session's token budget (app.realtime.response)
    "turn_too_large",  # the request was too large to send to the engine's process
    "turn_event_too_large",  # an event was too large to send back from the engine's process
]
# How a preemptible generation ends when it does not run to its end: not a failure of its
# consumer, which counts them apart and tells no client.
PREEMPTIBLE_ENDS: frozenset[EngineErrorCode] = frozenset({"no_spare_capacity", "preempted"})


class EngineError(Exception):
    """A generation failed inside the engine; the engine itself serves the next one."""

    def __init__(self, message: str, *, code: EngineErrorCode = "engine_error") -> None:
        super().__init__(message)
        self.code: EngineErrorCode = code


@dataclass(frozen=True)
class EngineHealth:
    """An engine's state as health reports (``/healthz``) show it, now."""

    alive: bool  # it takes turns (a pool: at least one of its members does)
    restarts: int = 0  # its processes started again after dying (a pool: its members' together)
    queue_depth: int = 0  # ordinary turns waiting for a slot, not counting those running
    # A pool's members in order, each as its backend describes it (an engine process: device, pid,
    # state...; a vLLM-Omni server: url, reachability...), with "alive" among them. Empty: one engine.
    members: tuple[Mapping[str, Any], ...] = ()

    @property
    def every_member_alive(self) -> bool:
        """No member of a pool is down (restarting, loading, unreachable); True for one engine."""
        return all(member["alive"] for member in self.members)


class Engine(Protocol):
    """Runs generations. ``run_generation`` yields deltas and chunks and ends with exactly one
    ``GenerationDone``.

    Closing the iterator early (``aclose()``, or cancelling the task that iterates it)
    cancels the turn: compute stops within one decoding step and the engine is free
    for the next queued turn. Preemptible turns and ``promote``: the module docstring.
    ``capabilities``: what its turns can hold or do, fixed for the engine's life.
    ``health()``: its state now, cheap to ask (no I/O).
    """

    name: str
    capabilities: EngineCapabilities

    async def start(self) -> None: ...

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]: ...

    async def promote(self, preemptible_id: str) -> bool: ...

    def health(self) -> EngineHealth: ...

    async def close(self) -> None: ...
