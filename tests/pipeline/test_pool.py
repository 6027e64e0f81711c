"""LeastLoadedPool's routing: ordinary turns by ordinary load, preemptible ones by spare slots."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from pipeline.contract import (
    EngineCapabilities,
    EngineHealth,
    GenerationDone,
    GenerationEvent,
    GenerationRequest,
    Usage,
)
from pipeline.conversation import Conversation, UserText
from pipeline.pool import LeastLoadedPool
from tests.fakes import FULL_CAPABILITIES


class Member:
    def __init__(self, name: str, *, load: int, spare: int, alive: bool = True, holding: tuple[str, ...] = (),
                 capabilities: EngineCapabilities = FULL_CAPABILITIES, restarts: int = 0, queue_depth: int = 0) -> None:
        self.name = name
        self.capabilities = capabilities
        self.load = load
        self.spare = spare
        self.alive = alive
        self.holding = set(holding)  # preemptible turns it runs
        self.turns: list[GenerationRequest] = []
        self.restarts = restarts
        self.queue_depth = queue_depth

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "alive": self.alive}

    def health(self) -> EngineHealth:
        return EngineHealth(alive=self.alive, restarts=self.restarts, queue_depth=self.queue_depth)

    async def run_generation(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.turns.append(request)
        yield GenerationDone(text="", usage=Usage(0, 0, 0), finish_reason="stop")

    async def promote(self, preemptible_id: str) -> bool:
        return preemptible_id in self.holding

    async def close(self) -> None:
        return None


def request(preemptible_id: str | None = None) -> GenerationRequest:
    return GenerationRequest(conversation=Conversation(items=(UserText("hi"),)), preemptible_id=preemptible_id)


async def test_an_ordinary_turn_goes_to_the_fewest_ordinary_turns_and_a_preemptible_one_to_the_most_spare_slots():
    # a: 1 ordinary turn and 7 preemptible ones in 8 slots; b: 3 ordinary turns, 5 slots free.
    a, b = Member("a", load=1, spare=0), Member("b", load=3, spare=5)
    pool = LeastLoadedPool([a, b])
    [_ async for _ in pool.run_generation(request())]
    [_ async for _ in pool.run_generation(request("spec_1"))]

    assert [turn.preemptible_id for turn in a.turns] == [None]  # a committed turn preempts rather than waits
    assert [turn.preemptible_id for turn in b.turns] == ["spec_1"]


async def test_a_preemptible_turn_skips_a_member_that_is_down():
    down, up = Member("down", load=0, spare=8, alive=False), Member("up", load=0, spare=2)
    pool = LeastLoadedPool([down, up])
    [_ async for _ in pool.run_generation(request("spec_1"))]
    assert not down.turns and len(up.turns) == 1


async def test_promote_is_answered_by_the_member_running_the_turn():
    pool = LeastLoadedPool([Member("a", load=0, spare=1), Member("b", load=0, spare=1, holding=("spec_2",))])
    assert await pool.promote("spec_2")
    assert not await pool.promote("spec_3")


def test_a_pool_can_do_what_every_member_can():
    no_calls = EngineCapabilities(function_calls=False, forced_function_calls=False, end_of_turn_scores=True, images=True,
                                  preemptible_generations=True)
    no_images = EngineCapabilities(function_calls=True, forced_function_calls=True, end_of_turn_scores=True, images=False,
                                   preemptible_generations=True)
    pool = LeastLoadedPool([Member("a", load=0, spare=1, capabilities=no_calls),
                            Member("b", load=0, spare=1, capabilities=no_images)])
    assert pool.capabilities == EngineCapabilities(function_calls=False, forced_function_calls=False, end_of_turn_scores=True,
                                                   images=False, preemptible_generations=True)


def test_a_pool_of_members_that_can_do_everything_can_too():
    pool = LeastLoadedPool([Member("a", load=0, spare=1), Member("b", load=0, spare=1)])
    assert pool.capabilities == FULL_CAPABILITIES


def test_a_pools_health_is_alive_while_one_member_is_and_adds_up_its_members():
    pool = LeastLoadedPool([Member("a", load=0, spare=1, restarts=1, queue_depth=2),
                            Member("b", load=0, spare=1, alive=False, restarts=2, queue_depth=3)])
    health = pool.health()
    assert (health.alive, health.restarts, health.queue_depth) == (True, 3, 5)
    assert health.members == ({"name": "a", "alive": True}, {"name": "b", "alive": False})
    assert not health.every_member_alive
    pool.engines[1].alive = False
    pool.engines[0].alive = False
    assert not pool.health().alive
