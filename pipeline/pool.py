"""Several engines behind one ``pipeline.contract.Engine``: each turn goes to the least loaded.

Shared by the in-process ``TransformersEnginePool`` (one engine process per device) and the
``VllmOmniEnginePool`` (one vLLM-Omni server per URL); it imports neither, so the remote pool
loads no torch.

An ordinary turn goes to the member with the fewest ordinary turns (``load``: a preemptible
turn gives its slot up to it, ``pipeline.contract``); a preemptible one to the member with the most
``spare`` capacity, which refuses it when it has none. Since any member may get a turn, the pool
can do what every member can (``capabilities``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any, Generic, Protocol, TypeVar

from pipeline.contract import EngineCapabilities, EngineHealth, GenerationEvent, GenerationRequest


class PooledEngine(Protocol):
    name: str
    capabilities: EngineCapabilities

    @property
    def alive(self) -> bool: ...

    @property
    def load(self) -> int: ...  # ordinary turns it is decoding or holding in line

    @property
    def spare(self) -> int: ...  # preemptible turns it would take now

    def describe(self) -> dict[str, Any]: ...  # its state for health reports, "alive" among it

    def health(self) -> EngineHealth: ...

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]: ...

    async def promote(self, preemptible_id: str) -> bool: ...

    async def close(self) -> None: ...


EngineT = TypeVar("EngineT", bound=PooledEngine)


class LeastLoadedPool(Generic[EngineT]):
    """Each turn to the member with the fewest turns, a live one first (ties to the first listed);
    with none alive, to the least loaded anyway, where it fails if that one is still down."""

    def __init__(self, engines: list[EngineT]) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = engines
        self.name = engines[0].name
        self.capabilities = EngineCapabilities.shared_by(engine.capabilities for engine in engines)

    @property
    def alive(self) -> bool:
        """True while at least one member can take turns."""
        return any(engine.alive for engine in self.engines)

    def describe(self) -> list[dict[str, Any]]:
        """Each member's state, in the order given."""
        return [engine.describe() for engine in self.engines]

    def health(self) -> EngineHealth:
        """Alive while one member is; the members' restarts and waiting turns together; each member described."""
        members = [engine.health() for engine in self.engines]
        return EngineHealth(
            alive=any(member.alive for member in members),
            restarts=sum(member.restarts for member in members),
            queue_depth=sum(member.queue_depth for member in members),
            members=tuple(self.describe()),
        )

    def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._run_generation(request)

    async def _run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        # Chosen when the turn is first iterated, which is when a member counts it.
        if request.preemptible_id is not None:
            engine = max(self.engines, key=lambda engine: (engine.alive, engine.spare))
        else:
            engine = min(self.engines, key=lambda engine: (not engine.alive, engine.load))
        async with contextlib.aclosing(engine.run_generation(request)) as events:
            async for event in events:
                yield event

    async def promote(self, preemptible_id: str) -> bool:
        """The member running preemptible turn ``preemptible_id`` makes it ordinary; False: none does."""
        for engine in self.engines:
            if await engine.promote(preemptible_id):
                return True
        return False

    async def close(self) -> None:
        """Close every member; safe to call twice."""
        await asyncio.gather(*(engine.close() for engine in self.engines))
