"""The router's hedged Rank: a member that has not answered in half the Rank's time gets company.

A member cut off the network answers nothing and refuses nothing until its health checks have timed out
`--health-timeouts` times; every Rank sent to it meanwhile would wait out its whole deadline. The proxy
sends a Rank still unanswered after half its time to the failover member as well and returns the first
answer. Stub rankers answer late on request (`delay_s`) to stand for such a member.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from relaygr.v1 import ranker_pb2_grpc
from services.affinity.metrics import ROUTER_INFLIGHT
from services.router.app import RouterApp
from tests.router.harness import StubRanker, decisions, rank_request, stub_named, through_router
from tests.support.polling import eventually

Client = ranker_pb2_grpc.RankerServiceStub
RANK_TIMEOUT_S = 1.0  # the retrieval stub's default Rank deadline: the hedge goes out after ~0.5 s


def test_a_rank_unanswered_in_half_its_time_is_answered_by_the_failover_member() -> None:
    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        first, second, third = router.membership.ring.walk("alice")
        silent = stub_named(stubs, first)
        silent.delay_s = 0.9  # within the deadline, but later than the hedge's answer
        before = decisions("Rank", "failover")
        started = time.monotonic()
        answer = await client.Rank(rank_request("alice"), timeout=RANK_TIMEOUT_S)
        took = time.monotonic() - started

        assert answer.instance == second
        assert 0.45 < took < 0.85  # hedged at half the time, answered at once by the failover member
        assert decisions("Rank", "failover") == before + 1
        assert [len(silent.received), len(stub_named(stubs, second).received)] == [1, 1]
        assert not stub_named(stubs, third).received
        # The overtaken forward was cancelled: nothing stays in flight on the silent member.
        await eventually(lambda: ROUTER_INFLIGHT.labels(first)._value.get() == 0, timeout_s=1)

    through_router(scenario)


def test_a_rank_answered_within_half_its_time_is_not_hedged() -> None:
    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        first, second, _ = router.membership.ring.walk("alice")
        stub_named(stubs, first).delay_s = 0.2
        before = decisions("Rank", "failover")
        assert (await client.Rank(rank_request("alice"), timeout=RANK_TIMEOUT_S)).instance == first
        assert decisions("Rank", "failover") == before
        assert not stub_named(stubs, second).received

    through_router(scenario)


def test_a_busy_member_that_answers_other_calls_is_waited_for_not_hedged() -> None:
    """Slow because busy, not gone: a hedge would only double the load where there is least room."""

    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        ring = router.membership.ring
        first, second, _ = ring.walk("alice")
        neighbour = next(f"bob-{i}" for i in range(1000) if ring.owner(f"bob-{i}") == first)
        busy = stub_named(stubs, first)
        busy.delay_s = 0.7  # read when a request arrives: alice's Rank takes 0.7 s ...
        before = decisions("Rank", "failover")
        alice = asyncio.ensure_future(client.Rank(rank_request("alice"), timeout=RANK_TIMEOUT_S))
        await asyncio.sleep(0.05)
        busy.delay_s = 0.0  # ... while the same member answers other Ranks every 50 ms
        while not alice.done():
            assert (await client.Rank(rank_request(neighbour), timeout=RANK_TIMEOUT_S)).instance == first
            await asyncio.sleep(0.05)

        assert (await alice).instance == first
        assert decisions("Rank", "failover") == before
        assert not stub_named(stubs, second).received

    through_router(scenario)


def test_a_failed_hedge_leaves_the_rank_to_the_first_member() -> None:
    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        first, second, _ = router.membership.ring.walk("alice")
        stub_named(stubs, first).delay_s = 0.7
        stub_named(stubs, second).fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
        answer = await client.Rank(rank_request("alice"), timeout=RANK_TIMEOUT_S)
        assert answer.instance == first
        assert len(stub_named(stubs, second).received) == 1  # the hedge went out, and failed

    through_router(scenario)


def test_when_both_attempts_fail_the_caller_gets_the_failover_members_error() -> None:
    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        first, second, third = router.membership.ring.walk("alice")
        stub_named(stubs, first).delay_s = 0.7
        stub_named(stubs, first).fail_with = grpc.StatusCode.INTERNAL
        stub_named(stubs, second).fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.Rank(rank_request("alice"), timeout=RANK_TIMEOUT_S)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.value.details() == f"{second} says RESOURCE_EXHAUSTED"
        assert not stub_named(stubs, third).received  # one hedge at most

    through_router(scenario, circuit_failures=10)


def test_a_single_member_is_waited_for_without_a_hedge() -> None:
    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        (only,) = stubs
        only.delay_s = 0.7
        before = decisions("Rank", "failover")
        assert (await client.Rank(rank_request("alice"), timeout=RANK_TIMEOUT_S)).instance == only.name
        assert decisions("Rank", "failover") == before
        assert len(only.received) == 1

    through_router(scenario, members=1)


def test_a_cancelled_rank_cancels_both_of_its_attempts() -> None:
    async def scenario(router: RouterApp, client: Client, stubs: list[StubRanker]) -> None:
        first, second, _ = router.membership.ring.walk("alice")
        for name in (first, second):
            stub_named(stubs, name).delay_s = 5.0
        call = client.Rank(rank_request("alice"), timeout=2.0)  # hedged after ~1 s
        await eventually(lambda: len(stub_named(stubs, second).received) == 1, timeout_s=1.8)
        assert ROUTER_INFLIGHT.labels(first)._value.get() == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for name in (first, second):
            await eventually(lambda name=name: ROUTER_INFLIGHT.labels(name)._value.get() == 0, timeout_s=2)

    through_router(scenario)
