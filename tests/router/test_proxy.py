"""RankerProxy over stub rankers: bytes forwarded unchanged, deadlines, status codes, failover, health."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.affinity.metrics import ROUTER_INFLIGHT
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import health_status
from services.router.app import RouterApp
from services.router.config import RouterConfig
from tests.router.harness import (
    StubRanker,
    decisions,
    rank_request,
    router_config,
    running_router,
    stub_named,
    stub_rankers,
    through_router,
)
from tests.support.polling import eventually


def test_requests_are_forwarded_byte_for_byte_to_the_users_member() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        request = rank_request("alice", events=8192)
        answer = await client.Rank(request, timeout=5)
        owner = router.membership.ring.owner("alice")
        assert answer.instance == owner
        (received,) = stub_named(stubs, owner).received_by("Rank")
        assert received.request == request.SerializeToString()
        assert sum(len(stub.received) for stub in stubs) == 1

    through_router(scenario)


def test_pre_infer_and_rank_of_a_user_meet_on_one_member() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        before = decisions("Rank", "affinity"), decisions("PreInfer", "affinity")
        for i in range(20):
            user = f"user-{i}"
            signal = await client.PreInfer(ranker_pb2.PreInferRequest(user_id=user), timeout=5)
            assert signal.instance == router.membership.ring.owner(user)
            assert (await client.Rank(rank_request(user), timeout=5)).instance == signal.instance
        after = decisions("Rank", "affinity"), decisions("PreInfer", "affinity")
        assert after == (before[0] + 20, before[1] + 20)
        assert {len(stub.received_by("PreInfer")) for stub in stubs} != {0}

    through_router(scenario)


def test_a_relay_hint_routes_the_rank_to_the_named_member() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        elsewhere = list(router.membership.ring.walk("alice"))[-1]
        before = decisions("Rank", "hint")
        assert (await client.Rank(rank_request("alice", hint=elsewhere), timeout=5)).instance == elsewhere
        assert decisions("Rank", "hint") == before + 1

    through_router(scenario)


def test_deadlines_propagate_minus_the_margin_or_default() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        owner = stub_named(stubs, router.membership.ring.owner("alice"))
        await client.Rank(rank_request("alice"), timeout=2.0)
        await client.Rank(rank_request("alice"))
        with_deadline, without = (r.time_remaining for r in owner.received_by("Rank"))
        # The wire format rounds a timeout up to a few significant digits: allow 20 ms of it.
        assert 1.0 < with_deadline < 2.0 - 0.300 + 0.020
        assert 2.5 < without <= 3.0 + 0.020  # default_timeout_ms

    through_router(scenario, deadline_margin_ms=300, default_timeout_ms=3000)


def test_a_deadline_within_the_margin_is_not_forwarded() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.Rank(rank_request("alice"), timeout=0.1)
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert not any(stub.received for stub in stubs)

    through_router(scenario, deadline_margin_ms=500)


@pytest.mark.parametrize(
    ("request_bytes", "field"),
    [
        (ranker_pb2.RankRequest(candidate_item_ids=[1]).SerializeToString(), "user_id: is required"),
        (ranker_pb2.RankRequest(user_id="u" * 300).SerializeToString(), "user_id: is longer than 256 bytes"),
        (b"\xff\xff\xff", "request: is not a valid protobuf message"),
    ],
)
def test_invalid_requests_are_refused_before_any_forward(request_bytes: bytes, field: str) -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        async with grpc.aio.insecure_channel(router.address) as channel:
            for method in ("Rank", "PreInfer"):
                call = channel.unary_unary(f"/{RANKER_SERVICE}/{method}")
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await call(request_bytes, timeout=5)
                assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in error.value.details()
        assert not any(stub.received for stub in stubs)

    through_router(scenario, members=1)


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL]
)
def test_downstream_errors_keep_their_code_and_are_not_retried(code: grpc.StatusCode) -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        owner = stub_named(stubs, router.membership.ring.owner("alice"))
        owner.fail_with = code
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.Rank(rank_request("alice"), timeout=5)
        assert error.value.code() == code
        assert error.value.details() == f"{owner.name} says {code.name}"
        assert sum(len(stub.received) for stub in stubs) == 1

    through_router(scenario)


@pytest.mark.parametrize(
    "code",
    # UNAVAILABLE: no connection. CANCELLED: what a ranker that begins to shut down answers the calls it had
    # received but not yet taken up (gRPC cancels them whatever the grace period).
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED],
)
def test_a_dropped_rank_fails_over_once_and_pre_infer_does_not(code: grpc.StatusCode) -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        first, second, third = router.membership.ring.walk("alice")
        stub_named(stubs, first).fail_with = code
        before = decisions("Rank", "failover")
        assert (await client.Rank(rank_request("alice"), timeout=5)).instance == second
        assert decisions("Rank", "failover") == before + 1

        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.PreInfer(ranker_pb2.PreInferRequest(user_id="alice"), timeout=5)
        assert error.value.code() == code
        assert not stub_named(stubs, second).received_by("PreInfer")

        # Retried once only: with the failover member failing too, the caller sees its code.
        stub_named(stubs, second).fail_with = code
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.Rank(rank_request("alice"), timeout=5)
        assert error.value.code() == code
        assert not stub_named(stubs, third).received

    through_router(scenario, circuit_failures=10)


def test_a_failing_member_opens_its_circuit_and_leaves_the_ring_for_a_while() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        first, second, _ = router.membership.ring.walk("alice")
        failing = stub_named(stubs, first)
        failing.fail_with = grpc.StatusCode.UNAVAILABLE
        for _ in range(2):
            assert (await client.Rank(rank_request("alice"), timeout=5)).instance == second
        assert not router.membership.get(first).routable  # open: no more forwards to it
        served_before = len(failing.received)
        assert (await client.Rank(rank_request("alice"), timeout=5)).instance == second
        assert len(failing.received) == served_before
        failing.fail_with = None
        await eventually(lambda: router.membership.get(first).routable, timeout_s=3)
        assert (await client.Rank(rank_request("alice"), timeout=5)).instance == first

    through_router(scenario, circuit_failures=2, circuit_open_s=0.5)


def test_concurrent_requests_of_a_hot_user_spill_within_the_bound() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        for stub in stubs:
            stub.delay_s = 0.3
        owner = stub_named(stubs, router.membership.ring.owner("hot"))
        before = decisions("Rank", "spill")
        answers = await asyncio.gather(*(client.Rank(rank_request("hot"), timeout=5) for _ in range(12)))
        assert len(answers) == 12
        # The k-th concurrent request sees k-1 in flight: bound ceil(1.25 * 12 / 3) = 5 at most.
        assert 1 <= len(owner.received) <= 5
        assert decisions("Rank", "spill") - before == 12 - len(owner.received)
        assert all(ROUTER_INFLIGHT.labels(stub.name)._value.get() == 0 for stub in stubs)

    through_router(scenario)


def test_get_profile_reports_the_routable_fleet_size() -> None:
    async def scenario(router: RouterApp, client, stubs: list[StubRanker]) -> None:
        profile = await client.GetProfile(ranker_pb2.GetProfileRequest(), timeout=5)
        assert (profile.fleet_members, profile.preset, profile.instance) == (3, "stub", "ranker-0")
        await stubs[0].set_serving(False)
        await eventually(lambda: len(router.membership.routable()) == 2)
        profile = await client.GetProfile(ranker_pb2.GetProfileRequest(), timeout=5)
        assert (profile.fleet_members, profile.instance) == (2, "ranker-1")

    through_router(scenario)


def test_the_router_serves_once_a_member_is_healthy_and_is_unavailable_without_one() -> None:
    async def main() -> None:
        async with stub_rankers(2) as stubs:
            for stub in stubs:
                await stub.set_serving(False)
            config: RouterConfig = router_config(stubs)
            async with running_router(config) as router:
                await asyncio.sleep(0.3)
                loop = asyncio.get_running_loop()
                status = await loop.run_in_executor(None, health_status, router.address, RANKER_SERVICE)
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
                async with grpc.aio.insecure_channel(router.address) as channel:
                    client = ranker_pb2_grpc.RankerServiceStub(channel)
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await client.Rank(rank_request("alice"), timeout=5)
                    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "no healthy ranker among 2 members" in error.value.details()

                    await stubs[1].set_serving(True)
                    await asyncio.wait_for(router.wait_serving(), 5)
                    status = await loop.run_in_executor(None, health_status, router.address, RANKER_SERVICE)
                    assert status == health_pb2.HealthCheckResponse.SERVING
                    assert (await client.Rank(rank_request("alice"), timeout=5)).instance == "ranker-1"

    asyncio.run(main())


def test_a_request_that_comes_while_the_router_starts_waits_for_the_first_health_checks() -> None:
    """Clients redial a restarted router at once: a Rank that arrives before any member's first health
    check has answered is served when one does, not failed with UNAVAILABLE."""

    async def main() -> None:
        async with stub_rankers(1) as (stub,):
            stub.health.delay_s = 0.3  # the first check answers (SERVING) 0.3 s after the router starts
            config = router_config([stub], health_interval_s=1.0)
            async with running_router(config) as router, grpc.aio.insecure_channel(router.address) as channel:
                client = ranker_pb2_grpc.RankerServiceStub(channel)
                assert not router.membership.settled() and not router.membership.routable()
                answer = await client.Rank(rank_request("early"), timeout=5)
                assert answer.instance == "ranker-0"
                assert stub.health.late >= 1 and len(stub.received_by("Rank")) == 1
                # Once settled, nothing waits: every member away is UNAVAILABLE at once.
                stub.health.delay_s = 0.0
                await stub.set_serving(False)
                await eventually(lambda: not router.membership.routable())
                assert router.membership.settled()
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await client.Rank(rank_request("late"), timeout=5)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())
