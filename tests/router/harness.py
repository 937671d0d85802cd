"""In-process harness for the router's mechanics: model-free stub rankers and polling.

`StubRanker` is a RankerService on 127.0.0.1 that answers with its own name as `instance`, records the
raw bytes and the remaining deadline of every request it receives, and can be told to fail with a status
code, to answer slowly, or to report NOT_SERVING. The real ranker is exercised by test_router_fleet.py.
`through_router` runs a scenario against an in-process router in front of such stubs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.affinity.discovery import DnsLookup, srv_lookup
from services.affinity.metrics import ROUTER_DECISIONS
from services.common.contract import RANKER_SERVICE
from services.router.app import RouterApp
from services.router.config import RouterConfig
from tests.support import requests
from tests.support.polling import eventually


@dataclasses.dataclass(frozen=True)
class Received:
    method: str
    request: bytes
    time_remaining: float | None


class _Health(health.aio.HealthServicer):
    """The standard health service, whose Check can be made to answer late."""

    delay_s = 0.0
    late = 0  # checks answered with a delay

    async def Check(self, request, context):
        if self.delay_s:
            self.late += 1
            await asyncio.sleep(self.delay_s)
        return await super().Check(request, context)


class StubRanker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.received: list[Received] = []
        self.fail_with: grpc.StatusCode | None = None
        self.delay_s = 0.0
        self.health = _Health()
        self.server = grpc.aio.server()
        handlers = {
            method: grpc.unary_unary_rpc_method_handler(self._handler(method))
            for method in ("PreInfer", "Rank", "GetProfile")
        }
        generic = grpc.method_handlers_generic_handler(RANKER_SERVICE, handlers)
        self.server.add_generic_rpc_handlers((generic,))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def received_by(self, method: str) -> list[Received]:
        return [r for r in self.received if r.method == method]

    async def start(self) -> None:
        await self.server.start()
        await self.set_serving(True)

    async def stop(self) -> None:
        await self.server.stop(0)

    async def set_serving(self, serving: bool) -> None:
        statuses = health_pb2.HealthCheckResponse
        await self.health.set(RANKER_SERVICE, statuses.SERVING if serving else statuses.NOT_SERVING)

    def _handler(self, method: str):
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            self.received.append(Received(method, request, context.time_remaining()))
            await asyncio.sleep(self.delay_s)
            if self.fail_with is not None:
                await context.abort(self.fail_with, f"{self.name} says {self.fail_with.name}")
            if method == "PreInfer":
                return ranker_pb2.PreInferResponse(
                    outcome=ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED, instance=self.name
                ).SerializeToString()
            if method == "Rank":
                return ranker_pb2.RankResponse(
                    scores=[0.5], cache_source=common_pb2.CACHE_SOURCE_MISS, instance=self.name
                ).SerializeToString()
            return ranker_pb2.GetProfileResponse(
                preset="stub", instance=self.name, fleet_members=1
            ).SerializeToString()

        return handle


@contextlib.asynccontextmanager
async def stub_rankers(count: int) -> AsyncIterator[list[StubRanker]]:
    """`count` started stubs named ranker-0.., stopped on exit."""
    stubs = [StubRanker(f"ranker-{i}") for i in range(count)]
    for stub in stubs:
        await stub.start()
    try:
        yield stubs
    finally:
        for stub in stubs:
            await stub.stop()


def router_config(stubs: list[StubRanker], **overrides: object) -> RouterConfig:
    """An in-process router over `stubs` on free ports, checking health every 50 ms."""
    members = ",".join(f"{stub.name}={stub.address}" for stub in stubs)
    settings = dict(port=0, metrics_port=-1, rankers=members, health_interval_s=0.05, drain_grace_s=0.5)
    return RouterConfig(**{**settings, **overrides})


@contextlib.asynccontextmanager
async def running_router(config: RouterConfig, lookup: DnsLookup = srv_lookup) -> AsyncIterator[RouterApp]:
    """A started in-process router, stopped on exit; `lookup` answers its --rankers-srv lookups."""
    router = RouterApp(config, lookup)
    await router.start()
    try:
        yield router
    finally:
        await router.stop()


Scenario = Callable[[RouterApp, ranker_pb2_grpc.RankerServiceStub, list[StubRanker]], Awaitable[None]]


def through_router(scenario: Scenario, members: int = 3, **overrides: object) -> None:
    """Runs `scenario` with an in-process router over `members` healthy stubs and a client stub to it."""

    async def main() -> None:
        async with stub_rankers(members) as stubs:
            config = router_config(stubs, **overrides)
            async with running_router(config) as router, grpc.aio.insecure_channel(router.address) as channel:
                await asyncio.wait_for(router.wait_serving(), 5)
                await eventually(lambda: len(router.membership.routable()) == members)
                await scenario(router, ranker_pb2_grpc.RankerServiceStub(channel), stubs)

    asyncio.run(main())


def decisions(method: str, decision: str) -> float:
    return ROUTER_DECISIONS.labels(method, decision)._value.get()


def rank_request(user: str, hint: str = "", events: int = 64) -> ranker_pb2.RankRequest:
    """A Rank of `user` with `events` long-term events, carrying relay hint `hint`."""
    return requests.rank_request(user, range(1000, 1000 + events), [7, 8], [11, 12, 13], hint)


def stub_named(stubs: list[StubRanker], name: str) -> StubRanker:
    return next(stub for stub in stubs if stub.name == name)
