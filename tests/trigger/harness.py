"""An in-process trigger over real gRPC, and the Admit requests sent to it."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from relaygr.v1 import common_pb2, trigger_pb2, trigger_pb2_grpc
from services.common.contract import TRIGGER_SERVICE
from services.trigger.app import TriggerApp
from services.trigger.config import TriggerConfig

SHORT_TERM, CANDIDATES = 16, 32


def events(length: int, seed: int) -> common_pb2.BehaviorSequence:
    return common_pb2.BehaviorSequence(
        item_ids=[(seed * 7919 + i * 104729) % 1_000_003 for i in range(length)],
        action_types=[(seed + i) % 8 for i in range(length)],
        timestamps_ms=[1_700_000_000_000 + 1000 * i for i in range(length)],
    )


def admit_request(user_id: str, length: int, seed: int = 0) -> trigger_pb2.AdmitRequest:
    return trigger_pb2.AdmitRequest(
        user_id=user_id,
        long_term=events(length, seed),
        num_candidates=CANDIDATES,
        short_term_length=SHORT_TERM,
    )


@contextlib.asynccontextmanager
async def trigger(router: str, serving: bool = True, **settings):
    """A started TriggerApp with `settings` routing through `router`, and a client's Admit and health stubs;
    waits until it is SERVING (it has the rankers' profile) unless `serving` is False."""
    # A generous PreInfer deadline: the ranker shares two busy cores with the test.
    config = TriggerConfig(port=0, metrics_port=-1, router=router, pre_infer_timeout_ms=2000, **settings)
    config.validate()
    server = TriggerApp(config)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            if serving:
                await wait_serving(health)
            yield server, trigger_pb2_grpc.TriggerServiceStub(channel), health
    finally:
        await server.stop()


async def wait_serving(health: health_pb2_grpc.HealthStub) -> None:
    for _ in range(200):
        answer = await health.Check(health_pb2.HealthCheckRequest(service=TRIGGER_SERVICE))
        if answer.status == health_pb2.HealthCheckResponse.SERVING:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("trigger never became SERVING")
