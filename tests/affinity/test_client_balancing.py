"""Client-side balancing over router replicas, as the deployed trigger and retrieval stub dial them: one
channel from `dial()` to a target that lists several routers.

Each in-process router forwards to a stub ranker of its own, so what a stub received is what its router
served. With `round_robin` the calls spread over both routers; with `pick_first` one router takes them
all. A router that joins a DNS name after the client resolved it gets traffic once the routers'
connection age sends the client a GOAWAY and it re-resolves; with no age limit it gets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.common.config import ServiceConfig
from services.common.server import dial
from services.router.app import RouterApp
from tests.affinity.loopback_dns import LoopbackDns
from tests.router.harness import StubRanker, router_config, running_router

CALLS = 40
ROUTERS_NAME = "routers.relaygr.test"


@contextlib.asynccontextmanager
async def two_routers(**settings: object) -> AsyncIterator[tuple[list[StubRanker], list[RouterApp]]]:
    """Routers on 127.0.0.1 and 127.0.0.2 sharing one port, each over its own stub ranker."""
    stubs = [StubRanker("ranker-0"), StubRanker("ranker-0")]
    for stub in stubs:
        await stub.start()
    try:
        async with running_router(router_config([stubs[0]], **settings)) as first:
            second_config = router_config([stubs[1]], host="127.0.0.2", port=first.grpc.port, **settings)
            async with running_router(second_config) as second:
                for router in (first, second):
                    await asyncio.wait_for(router.wait_serving(), 5)
                yield stubs, [first, second]
    finally:
        for stub in stubs:
            await stub.stop()


async def rank(client: ranker_pb2_grpc.RankerServiceStub, i: int) -> None:
    await client.Rank(ranker_pb2.RankRequest(user_id=f"user-{i}", request_id=f"req-{i}"), timeout=5)


def ranks_served(stubs: list[StubRanker]) -> list[int]:
    return [len(stub.received_by("Rank")) for stub in stubs]


def calls_per_router(lb_policy: str) -> list[int]:
    """How many of CALLS Ranks each router served, dialled as `ipv4:` both routers with `lb_policy`."""

    async def main() -> list[int]:
        async with two_routers() as (stubs, routers):
            port = routers[0].grpc.port
            target = f"ipv4:127.0.0.1:{port},127.0.0.2:{port}"
            async with dial(target, ServiceConfig(lb_policy=lb_policy)) as channel:
                client = ranker_pb2_grpc.RankerServiceStub(channel)
                for i in range(CALLS):
                    await rank(client, i)
            return ranks_served(stubs)

    return asyncio.run(main())


def test_round_robin_spreads_calls_over_every_router() -> None:
    served = calls_per_router("round_robin")
    assert sum(served) == CALLS
    assert min(served) >= CALLS // 4, served  # each router took a real share, not a stray call


def test_pick_first_sends_every_call_to_one_router() -> None:
    assert sorted(calls_per_router("pick_first")) == [0, CALLS]


def calls_after_a_router_joins(max_connection_age_s: float) -> tuple[list[int], list[int], int]:
    """Ranks each router served while DNS listed only the first, then over 3 s after the second joined
    the name, and how many Ranks failed; the routers limit connection age to `max_connection_age_s`."""

    async def main() -> tuple[list[int], list[int], int]:
        settings = dict(max_connection_age_s=max_connection_age_s, max_connection_age_grace_s=1.0)
        with LoopbackDns() as names:
            async with two_routers(**settings) as (stubs, routers):
                names.set(ROUTERS_NAME, "A", ["127.0.0.1"])
                target = names.target(ROUTERS_NAME, routers[0].grpc.port)
                failed = 0
                async with dial(target, ServiceConfig()) as channel:
                    client = ranker_pb2_grpc.RankerServiceStub(channel)
                    for i in range(10):
                        await rank(client, i)
                    before = ranks_served(stubs)
                    names.set(ROUTERS_NAME, "A", ["127.0.0.1", "127.0.0.2"])  # a new replica is ready
                    deadline, i = time.monotonic() + 3.0, 10
                    while time.monotonic() < deadline:
                        try:
                            await rank(client, i)
                        except grpc.aio.AioRpcError:
                            failed += 1
                        i += 1
                        await asyncio.sleep(0.02)
                after = [total - earlier for total, earlier in zip(ranks_served(stubs), before, strict=True)]
                return before, after, failed

    return asyncio.run(main())


def test_a_router_joining_the_name_gets_traffic_once_connections_age_out() -> None:
    before, after, failed = calls_after_a_router_joins(max_connection_age_s=1.0)
    assert before == [10, 0]
    assert after[1] >= 10, after  # re-resolved on the GOAWAY and spread onto the newcomer
    assert failed == 0


def test_without_a_connection_age_the_joining_router_gets_nothing() -> None:
    """The control: a healthy connection is never re-resolved, so the new replica stays idle."""
    before, after, failed = calls_after_a_router_joins(max_connection_age_s=0)
    assert before == [10, 0]
    assert after[0] > 50 and after[1] == 0, after
    assert failed == 0
