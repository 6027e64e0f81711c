"""Benchmarks only: the engine made as slow as a stated real model ("emulated speed").

The latency benchmark (``tests/bench/e2e_latency.py``) must show what speculative generations hide on a
GPU before there is one: there the model's time to first audio is hundreds of milliseconds
(vLLM-Omni reports a 631 ms mean first packet for Qwen3-Omni), on this CPU the dev model's is
tens. ``--generation '{"emulate": {"first_audio_ms": 400, "frame_ms": 30}}'`` makes the engine
hold each generation's events until a model of that speed would have produced them. It is a
``GenerationParams`` field like ``force_output_tokens``, for benchmarks and tests only: the
engine logs a warning when it runs emulated, ``/healthz`` shows the speed on each engine, and
every bench result made with it says so.

The delay is model time, kept per generation by the engine process (:class:`EmulatedGenerations`):

- A generation's clock starts when the engine process takes it into its batch (where it starts
  computing; the wait for a batch slot before that is queue time, as for any generation).
- Its first text (or function call) is released no earlier than ``first_text_ms`` after that,
  its first audio chunk no earlier than ``first_audio_ms``, and a later chunk that ends at codec
  frame ``n`` no earlier than ``first_audio_ms + (n - frames of the first chunk) * frame_ms``.
  An event the dev model computes later than its emulated time goes when computed: emulation
  only adds time. Events keep their order; a generation's ``GenerationDone`` follows its last event.
- Generations decoded together keep their own clocks: batching does not slow a generation's emulated time,
  as a GPU step for 8 rows costs about what one costs (the dev model's own compute is still
  shared on the CPU, and shows when it is the slower).
- A generation being held keeps its batch slot until its ``GenerationDone`` is released (the parent counts
  it running until then), as a real model's generation holds its slot while it computes.
- A cancel stops it at once: the generation's held events are dropped and its ``GenerationDone``
  ("cancelled") goes out at the engine's next look at its commands, mid-delay; a cancel wakes
  an engine process that sleeps until a release.
- Events are released between the engine's decoding steps, so at most one step late (~10 ms on
  the dev model); an idle engine sleeps until the next release is due.
- Answers and transcriptions only: end-of-turn scores (semantic VAD's text judge, one forward) and the engine's
  warm-up at start (``pipeline.local.warmup``) run at the dev model's own speed.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pipeline.contract import AudioChunk, GenerationDone, GenerationEvent


@dataclass(frozen=True)
class EmulatedSpeed:
    """How slow the emulated model is, in milliseconds of model time (None: the dev model's own)."""

    first_text_ms: float | None = None  # a generation's first text (or call), after it starts in the engine
    first_audio_ms: float | None = None  # its first audio chunk, after it starts in the engine
    frame_ms: float | None = None  # each codec frame after the first chunk's (1 / frames per second)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"emulate.{field.name} must be a number of milliseconds >= 0, got {value!r}")

    @classmethod
    def of(cls, value: EmulatedSpeed | Mapping[str, Any]) -> EmulatedSpeed:
        """From ``--generation``'s JSON object (unknown keys are refused)."""
        if isinstance(value, EmulatedSpeed):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"emulate must be an object such as {{\"first_audio_ms\": 400}}, got {value!r}")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown emulate options {sorted(unknown)}; expected some of {sorted(known)}")
        return cls(**value)

    def describe(self) -> dict[str, float]:
        """The speed as results and health reports label it (only the figures set)."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}


Key = TypeVar("Key", bound=Hashable)
# Release times are sums of milliseconds in float seconds: one due "now" may compare a rounding
# error later than the clock.
_ROUNDING_S = 1e-9


@dataclass
class _HeldGeneration:
    speed: EmulatedSpeed
    started: float
    held: collections.deque[tuple[float, GenerationEvent]] = dataclasses.field(default_factory=collections.deque)
    last_release: float = 0.0  # events keep their order: none is due before the one before it
    first_chunk_frames: int | None = None
    frames: int = 0


class EmulatedGenerations(Generic[Key]):
    """The engine process's generations held back to their emulated speed (see the module docstring).

    ``send`` gets each event when it is due. A generation not started here (no speed) passes through.
    """

    def __init__(self, send: Callable[[Key, GenerationEvent], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._clock = clock
        self._generations: dict[Key, _HeldGeneration] = {}

    def start(self, key: Key, speed: EmulatedSpeed | None) -> None:
        """The generation starts computing now; with no speed it is not emulated."""
        if speed is not None:
            now = self._clock()
            self._generations[key] = _HeldGeneration(speed, started=now, last_release=now)

    def offer(self, key: Key, event: GenerationEvent) -> None:
        """Send ``event`` now, or hold it until its emulated time."""
        generation = self._generations.get(key)
        if generation is None:
            self._send(key, event)
            return
        due = max(self._emulated_time(generation, event), generation.last_release)
        generation.last_release = due
        generation.held.append((due, event))
        self.release_due()

    def release_due(self) -> None:
        """Send every held event whose time has come (a generation whose ``GenerationDone`` went is forgotten)."""
        now = self._clock() + _ROUNDING_S
        for key, generation in list(self._generations.items()):
            while generation.held and generation.held[0][0] <= now:
                _, event = generation.held.popleft()
                if isinstance(event, GenerationDone):
                    del self._generations[key]
                self._send(key, event)

    def seconds_to_next(self) -> float | None:
        """How long until the next held event is due (0 if one is); None when nothing is held."""
        due = [generation.held[0][0] for generation in self._generations.values() if generation.held]
        return max(0.0, min(due) - self._clock()) if due else None

    def holds_done(self) -> list[Key]:
        """Generations whose ``GenerationDone`` is held: their decoding is over, their model time is not."""
        return [key for key, generation in self._generations.items() if generation.held and isinstance(generation.held[-1][1], GenerationDone)]

    def cancel(self, key: Key) -> GenerationDone | None:
        """Forget the generation and drop what it holds; its held ``GenerationDone``, now "cancelled", if it had one."""
        generation = self._generations.pop(key, None)
        if generation is None or not generation.held or not isinstance(generation.held[-1][1], GenerationDone):
            return None
        return dataclasses.replace(generation.held[-1][1], finish_reason="cancelled")

    def _emulated_time(self, generation: _HeldGeneration, event: GenerationEvent) -> float:
        speed = generation.speed
        if isinstance(event, AudioChunk):
            generation.frames += event.frames
            if generation.first_chunk_frames is None:
                generation.first_chunk_frames = event.frames
                return generation.started + (speed.first_audio_ms or 0.0) / 1000
            later_frames = generation.frames - generation.first_chunk_frames
            return generation.started + ((speed.first_audio_ms or 0.0) + later_frames * (speed.frame_ms or 0.0)) / 1000
        if isinstance(event, GenerationDone):
            return generation.started  # right after the events before it
        return generation.started + (speed.first_text_ms or 0.0) / 1000
