"""RoutingPolicy: relay hint first, then the bounded-load ring, failover clockwise, each with its decision."""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Awaitable, Callable

import pytest

from services.affinity.membership import Membership
from services.affinity.routing import RoutingDecision, RoutingPolicy
from services.common.errors import Unavailable
from tests.router.harness import StubRanker, router_config, stub_rankers
from tests.support.polling import eventually

USERS = [f"user-{i}" for i in range(50)]


def with_policy(
    scenario: Callable[[RoutingPolicy, list[StubRanker]], Awaitable[None]], **overrides: object
) -> None:
    """Runs `scenario` against a policy over three healthy stub rankers."""

    async def main() -> None:
        async with stub_rankers(3) as stubs:
            config = router_config(stubs, **overrides)
            membership = Membership.from_config(config, config)
            await membership.start()
            try:
                await eventually(lambda: len(membership.routable()) == 3)
                await scenario(RoutingPolicy(membership), stubs)
            finally:
                await membership.close()

    asyncio.run(main())


def test_without_hint_a_user_goes_to_its_ring_owner() -> None:
    async def scenario(policy: RoutingPolicy, _: list[StubRanker]) -> None:
        for user in USERS:
            route = policy.choose(user)
            assert route.member.name == policy.membership.ring.owner(user)
            assert route.decision == RoutingDecision.AFFINITY
            assert policy.choose(user).member is route.member  # stable while nothing changes

    with_policy(scenario)


def test_a_hint_wins_over_the_ring_while_its_member_is_routable() -> None:
    async def scenario(policy: RoutingPolicy, stubs: list[StubRanker]) -> None:
        ring = policy.membership.ring
        for user in USERS[:10]:
            elsewhere = list(ring.walk(user))[-1]
            route = policy.choose(user, hint=elsewhere)
            assert (route.member.name, route.decision) == (elsewhere, RoutingDecision.HINT)

        route = policy.choose("alice", hint="ranker-9")  # not a member
        assert (route.member.name, route.decision) == (ring.owner("alice"), RoutingDecision.HINT_UNAVAILABLE)

        hinted = next(stub for stub in stubs if stub.name != ring.owner("alice"))
        await hinted.set_serving(False)
        await eventually(lambda: not policy.membership.get(hinted.name).routable)
        route = policy.choose("alice", hint=hinted.name)
        assert (route.member.name, route.decision) == (ring.owner("alice"), RoutingDecision.HINT_UNAVAILABLE)

    with_policy(scenario)


def test_a_loaded_owner_spills_to_the_next_member_clockwise() -> None:
    async def scenario(policy: RoutingPolicy, _: list[StubRanker]) -> None:
        first, second, _third = policy.membership.ring.walk("alice")
        policy.membership.get(first).in_flight = 4  # bound = ceil(1.25 * 5 / 3) = 3
        route = policy.choose("alice")
        assert (route.member.name, route.decision) == (second, RoutingDecision.SPILL)
        policy.membership.get(first).in_flight = 2  # bound = ceil(1.25 * 3 / 3) = 2
        assert policy.choose("alice").member.name == second
        policy.membership.get(first).in_flight = 1
        policy.membership.get(second).in_flight = 1  # bound = ceil(1.25 * 3 / 3) = 2
        assert policy.choose("alice").decision == RoutingDecision.AFFINITY

    with_policy(scenario, load_floor=0)


def test_below_the_load_floor_a_member_never_spills() -> None:
    async def scenario(policy: RoutingPolicy, _: list[StubRanker]) -> None:
        first, second, _third = policy.membership.ring.walk("alice")
        policy.membership.get(first).in_flight = 3  # pure bound: ceil(1.25 * 4 / 3) = 2; the floor is 4
        assert policy.choose("alice").decision == RoutingDecision.AFFINITY
        policy.membership.get(first).in_flight = 4
        assert (policy.choose("alice").member.name, policy.choose("alice").decision) == (
            second,
            RoutingDecision.SPILL,
        )

    with_policy(scenario, load_floor=4)


def test_failover_takes_the_next_routable_member_after_the_failed_one() -> None:
    async def scenario(policy: RoutingPolicy, stubs: list[StubRanker]) -> None:
        first, second, third = policy.membership.ring.walk("alice")
        route = policy.failover("alice", failed=first)
        assert (route.member.name, route.decision) == (second, RoutingDecision.FAILOVER)
        assert policy.failover("alice", failed=second).member.name == first

        await next(stub for stub in stubs if stub.name == second).set_serving(False)
        await eventually(lambda: not policy.membership.get(second).routable)
        assert policy.failover("alice", failed=first).member.name == third

        await next(stub for stub in stubs if stub.name == third).set_serving(False)
        await eventually(lambda: not policy.membership.get(third).routable)
        assert policy.failover("alice", failed=first) is None

    with_policy(scenario)


def test_no_routable_member_is_unavailable() -> None:
    async def scenario(policy: RoutingPolicy, stubs: list[StubRanker]) -> None:
        for stub in stubs:
            await stub.set_serving(False)
        await eventually(lambda: not policy.membership.routable())
        with pytest.raises(Unavailable, match="no healthy ranker among 3 members"):
            policy.choose("alice")
        with pytest.raises(Unavailable):
            policy.least_loaded()

    with_policy(scenario)


def test_unkeyed_calls_go_to_the_least_loaded_member() -> None:
    async def scenario(policy: RoutingPolicy, _: list[StubRanker]) -> None:
        assert policy.least_loaded().name == "ranker-0"
        policy.membership.get("ranker-0").in_flight = 2
        policy.membership.get("ranker-1").in_flight = 1
        assert policy.least_loaded().name == "ranker-2"

    with_policy(scenario)


def test_the_random_policy_ignores_hints_and_the_ring_and_draws_only_routable_members() -> None:
    async def scenario(policy: RoutingPolicy, stubs: list[StubRanker]) -> None:
        drawn = RoutingPolicy(policy.membership, "random", random.Random(0))
        owner = policy.membership.ring.owner("alice")
        routes = [drawn.choose("alice", hint=owner) for _ in range(300)]
        assert {route.decision for route in routes} == {RoutingDecision.RANDOM}
        counts = collections.Counter(route.member.name for route in routes)
        assert set(counts) == {"ranker-0", "ranker-1", "ranker-2"} and min(counts.values()) > 60

        down = stubs[0]
        await down.set_serving(False)
        await eventually(lambda: not policy.membership.get(down.name).routable)
        assert down.name not in {drawn.choose("alice").member.name for _ in range(50)}

    with_policy(scenario)


def test_an_unknown_routing_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="routing policy"):
        RoutingPolicy(None, "round-robin")  # type: ignore[arg-type]


def test_a_call_placed_by_its_caller_goes_there_labelled_by_the_ring() -> None:
    """The trigger's PreInfer placed on a member by the rankers' queues: `affinity` on the user's owner,
    `spill` elsewhere, the policy's own choice when the member is unknown or not routable."""

    async def scenario(policy: RoutingPolicy, stubs: list[StubRanker]) -> None:
        owner, second, third = policy.membership.ring.walk("alice")
        assert (policy.place("alice", owner).member.name, policy.place("alice", owner).decision) == (
            owner,
            RoutingDecision.AFFINITY,
        )
        for member in (second, third):
            route = policy.place("alice", member)
            assert (route.member.name, route.decision) == (member, RoutingDecision.SPILL)
        route = policy.place("alice", "ranker-9")
        assert (route.member.name, route.decision) == (owner, RoutingDecision.AFFINITY)

        down = next(stub for stub in stubs if stub.name == second)
        await down.set_serving(False)
        await eventually(lambda: not policy.membership.get(second).routable)
        route = policy.place("alice", second)
        assert (route.member.name, route.decision) == (owner, RoutingDecision.AFFINITY)
        # With the owner down, the next routable member on the walk is the user's first: `affinity`.
        owner_stub = next(stub for stub in stubs if stub.name == owner)
        await owner_stub.set_serving(False)
        await eventually(lambda: not policy.membership.get(owner).routable)
        route = policy.place("alice", third)
        assert (route.member.name, route.decision) == (third, RoutingDecision.AFFINITY)

    with_policy(scenario)
