"""Coalesced PreInfers over real gRPC: an in-process trigger routing directly to an in-process ranker, both on
loopback. The calls are counted on the ranker's side, by its gRPC server metrics: what reached it, not what
the trigger meant to send."""

from __future__ import annotations

import asyncio
import contextlib

from relaygr.v1 import common_pb2, ranker_pb2, trigger_pb2
from tests.ranker.harness import running_ranker
from tests.support.metrics import metric
from tests.trigger.harness import admit_request, trigger

ADMITTED, REFUSED = trigger_pb2.ADMIT_REASON_ADMITTED, trigger_pb2.ADMIT_REASON_RANKER_REFUSED
# A window no busy test machine outlasts between Admits sent together, within the harness's 2 s timeout.
WINDOW_MS = 1000.0
LENGTH = 64


def ranker_calls(method: str) -> float:
    """Calls of `method` the ranker's server has started (the trigger serves another service)."""
    labels = {"grpc_type": "unary", "grpc_service": "relaygr.v1.RankerService", "grpc_method": method}
    return metric("grpc_server_started_total", **labels)


@contextlib.asynccontextmanager
async def fleet(ranker: dict | None = None, **settings):
    """A ranker and a trigger routing directly to it, admitting everything; the trigger's `settings` on top
    of a coalescing window of WINDOW_MS and a relay window that no pre-inference here misses."""
    async with running_ranker(**(ranker or {})) as r:
        members = f"ranker-a=127.0.0.1:{r.app.grpc.port}"
        settings = {"pre_infer_batch_window_ms": WINDOW_MS, "relay_window_ms": 60_000.0, **settings}
        async with trigger("127.0.0.1:1", rankers=members, admit_all=True, **settings) as (_, stub, _):
            yield r, stub


async def admit_together(stub, users: list[str], seed: int = 0) -> list[trigger_pb2.AdmitResponse]:
    return await asyncio.gather(
        *(stub.Admit(admit_request(user, LENGTH, seed=seed + i)) for i, user in enumerate(users))
    )


def test_admits_within_the_window_reach_the_ranker_as_one_pre_infer_batch():
    async def scenario():
        async with fleet() as (r, stub):
            batches, singles = ranker_calls("PreInferBatch"), ranker_calls("PreInfer")
            accepted = metric("relaygr_pre_infer_total", outcome="accepted")
            users = [f"user-{i}" for i in range(5)]
            answers = await admit_together(stub, users)
            assert [(a.reason, a.relay_instance) for a in answers] == [(ADMITTED, "ranker-a")] * 5
            assert ranker_calls("PreInferBatch") == batches + 1
            assert ranker_calls("PreInfer") == singles
            assert metric("relaygr_pre_infer_total", outcome="accepted") == accepted + 5
            await r.settle()
            assert {key.user_id for key in r.cache.entries} == set(users)

    asyncio.run(scenario())


def test_with_the_window_zero_they_reach_it_as_single_pre_infers():
    async def scenario():
        async with fleet(pre_infer_batch_window_ms=0.0) as (r, stub):
            batches, singles = ranker_calls("PreInferBatch"), ranker_calls("PreInfer")
            answers = await admit_together(stub, ["w1", "w2", "w3"])
            assert [a.reason for a in answers] == [ADMITTED] * 3
            assert (ranker_calls("PreInferBatch"), ranker_calls("PreInfer")) == (batches, singles + 3)
            await r.settle()

    asyncio.run(scenario())


def test_a_prefix_that_would_miss_its_rank_goes_alone():
    """A relay window of 1 ms: any pre-inference plus the batch window outlasts it, so each goes alone."""

    async def scenario():
        async with fleet(relay_window_ms=1.0) as (r, stub):
            batches, singles = ranker_calls("PreInferBatch"), ranker_calls("PreInfer")
            alone = metric("relaygr_trigger_pre_infer_alone_total", reason="would_miss_rank")
            answers = await admit_together(stub, ["m1", "m2", "m3"])
            assert [a.reason for a in answers] == [ADMITTED] * 3
            assert (ranker_calls("PreInferBatch"), ranker_calls("PreInfer")) == (batches, singles + 3)
            assert metric("relaygr_trigger_pre_infer_alone_total", reason="would_miss_rank") == alone + 3
            await r.settle()

    asyncio.run(scenario())


def test_a_batch_the_ranker_refuses_refunds_each_admission():
    """The ranker takes batches of 2 at most; the trigger sends 3 together: the call fails INVALID_ARGUMENT,
    and each Admit is RANKER_REFUSED with its admission refunded (the same prefix is no duplicate)."""

    async def scenario():
        async with fleet(ranker={"max_pre_infer_batch": 2}) as (r, stub):
            code = {"code": "INVALID_ARGUMENT"}
            failures = metric("relaygr_trigger_pre_infer_failures_total", **code)
            users = ["f1", "f2", "f3"]
            first = await admit_together(stub, users)
            assert [(a.reason, a.relay_instance) for a in first] == [(REFUSED, "")] * 3
            assert metric("relaygr_trigger_pre_infer_failures_total", **code) == failures + 3
            again = await admit_together(stub, users)
            assert [a.reason for a in again] == [REFUSED] * 3  # tried again, not refused as a duplicate
            assert r.cache.productions == {} and r.cache.entries == {}

    asyncio.run(scenario())


def test_an_entry_the_ranker_refuses_fails_its_admit_and_the_others_are_admitted():
    """An action type past the model's vocabulary is the ranker's to refuse (the trigger does not know it)."""

    async def scenario():
        async with fleet() as (r, stub):
            batches = ranker_calls("PreInferBatch")
            bad = admit_request("bad", LENGTH, seed=9)
            bad.long_term.action_types[0] = 99
            answers = await asyncio.gather(
                stub.Admit(admit_request("good-1", LENGTH, seed=1)),
                stub.Admit(bad),
                stub.Admit(admit_request("good-2", LENGTH, seed=2)),
            )
            assert [a.reason for a in answers] == [ADMITTED, REFUSED, ADMITTED]
            assert ranker_calls("PreInferBatch") == batches + 1
            await r.settle()
            assert {key.user_id for key in r.cache.entries} == {"good-1", "good-2"}

    asyncio.run(scenario())


def test_a_rank_after_a_coalesced_pre_infer_hits_hbm():
    async def scenario():
        async with fleet() as (r, stub):
            requests = [admit_request(f"rank-{i}", LENGTH, seed=20 + i) for i in range(3)]
            answers = await asyncio.gather(*(stub.Admit(request) for request in requests))
            await r.settle()
            for request, answer in zip(requests, answers, strict=True):
                ranked = await r.stub.Rank(
                    ranker_pb2.RankRequest(
                        user_id=request.user_id,
                        long_term=request.long_term,
                        short_term=common_pb2.BehaviorSequence(item_ids=[1, 2], action_types=[0, 1]),
                        candidate_item_ids=[5, 6, 7],
                        relay_instance=answer.relay_instance,
                    )
                )
                assert ranked.cache_source == common_pb2.CACHE_SOURCE_HBM

    asyncio.run(scenario())
