"""TriggerService over real gRPC: a cpu-tiny ranker and the router in front of it as processes, the trigger
in-process with `--router` at the router.

The relay overhead is calibrated from the ranker's own measured curve so that relay pays for the long
history and not for the short one, whatever the speed of the machine running the tests.
"""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import REGISTRY

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc, trigger_pb2, trigger_pb2_grpc
from services.common.contract import TRIGGER_SERVICE as SERVICE_NAME
from services.launcher.procs import Processes, free_port
from services.trigger.fleet_profile import FleetProfile
from tests.trigger.harness import CANDIDATES, SHORT_TERM, admit_request, events, trigger

INSTANCE = "ranker-a"
SHORT, LONG = 8, 512
HBM_BUDGET_MB = 2  # holds a few 512-event prefixes of cpu-tiny (256 KiB each), not an 8192-event one
KV_BYTES_512 = 512 * 512  # cpu-tiny: 512 KV bytes per token


@dataclasses.dataclass(frozen=True)
class Fleet:
    router: str
    overhead_ms: float  # between what relay saves SHORT and what it saves LONG
    long_pre_infer_ms: float  # the predicted pre-inference of LONG


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Fleet:
    with Processes(log_dir=tmp_path_factory.mktemp("logs")) as procs:
        # Stalls on these two shared cores can hold up a whole point of the warm-up curve: a longer
        # profile length, three repeats per point and a router started only after the warm-up keep them
        # from flattening the curve.
        ranker = procs.start(
            INSTANCE,
            "services.ranker",
            "relaygr.v1.RankerService",
            ["--model-preset", "cpu-tiny", "--instance-name", INSTANCE, "--hbm-budget-mb", str(HBM_BUDGET_MB),
             "--profile-lengths", "32,128,512,2048", "--profile-repeats", "3",
             # Judged undisturbed: these tests read a known curve (a provisional one is test_fleet_start's).
             "--profile-disturbed-ratio", "1e9"],
        )  # fmt: skip
        ranker.wait_healthy(120)
        members = f"{INSTANCE}={ranker.address}"
        router = procs.start("router", "services.router", "relaygr.v1.RankerService", ["--rankers", members])
        router.wait_healthy(60)
        with grpc.insecure_channel(router.address) as channel:
            profile = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(ranker_pb2.GetProfileRequest())
        fitted = FleetProfile.from_response(profile)

        def saved_ms(length: int) -> float:
            return fitted.pre_infer.compute_ms(length, 0, 0)  # what relay moves off the critical path

        assert saved_ms(LONG) > saved_ms(SHORT), (
            f"relay saves nothing more at {LONG}: {profile.latency_curve}"
        )
        assert fitted.members == (INSTANCE,)
        yield Fleet(
            router.address,
            overhead_ms=(saved_ms(SHORT) + saved_ms(LONG)) / 2,
            long_pre_infer_ms=fitted.pre_infer.predict_ms(LONG, 0, 0),
        )


def decisions(reason: str) -> float:
    labels = {"decision": "admit" if reason == "admitted" else "reject", "reason": reason}
    return REGISTRY.get_sample_value("relaygr_trigger_decisions_total", labels) or 0.0


def test_an_eight_event_history_gains_nothing_at_the_default_relay_overhead(fleet):
    # What relay would move off the critical path is the 8-event prefix's own computation, microseconds
    # on any device, never the 2 ms round trip: refused however the warm-up measured the curve.
    async def scenario():
        async with trigger(fleet.router) as (_, stub, _):
            request = admit_request("user-eight", 8)
            request.num_candidates = 64
            answer = await stub.Admit(request)
            assert (answer.admitted, answer.reason) == (False, trigger_pb2.ADMIT_REASON_NO_GAIN)

    asyncio.run(scenario())


def test_long_history_is_admitted_and_its_rank_hits_hbm_short_gains_nothing(fleet):
    async def scenario():
        async with trigger(fleet.router, relay_overhead_ms=fleet.overhead_ms) as (_, stub, _):
            before = {r: decisions(r) for r in ("admitted", "no_gain", "duplicate")}

            short = await stub.Admit(admit_request("user-short", SHORT))
            assert (short.admitted, short.reason, short.relay_instance) == (
                False, trigger_pb2.ADMIT_REASON_NO_GAIN, "",
            )  # fmt: skip

            request = admit_request("user-long", LONG, seed=1)
            admitted = await stub.Admit(request)
            assert (admitted.admitted, admitted.reason, admitted.relay_instance) == (
                True, trigger_pb2.ADMIT_REASON_ADMITTED, INSTANCE,
            )  # fmt: skip

            again = await stub.Admit(request)
            assert (again.admitted, again.reason, again.relay_instance) == (
                False, trigger_pb2.ADMIT_REASON_DUPLICATE, INSTANCE,
            )  # fmt: skip

            async with grpc.aio.insecure_channel(fleet.router) as channel:
                ranked = await ranker_pb2_grpc.RankerServiceStub(channel).Rank(
                    ranker_pb2.RankRequest(
                        user_id="user-long",
                        request_id="r-1",
                        long_term=request.long_term,
                        short_term=events(SHORT_TERM, seed=2),
                        candidate_item_ids=list(range(CANDIDATES)),
                        relay_instance=admitted.relay_instance,
                    )
                )
            assert ranked.cache_source == common_pb2.CACHE_SOURCE_HBM
            assert ranked.instance == INSTANCE
            assert len(ranked.scores) == CANDIDATES
            assert {r: decisions(r) - before[r] for r in before} == {
                "admitted": 1, "no_gain": 1, "duplicate": 1,
            }  # fmt: skip

    asyncio.run(scenario())


def test_the_hbm_brake_reads_the_bytes_the_ranker_reports(fleet):
    async def scenario():
        # A share of the ranker's 2 MiB that holds one 512-event prefix of cpu-tiny (256 KiB), not two.
        settings = {"relay_overhead_ms": fleet.overhead_ms, "hbm_lease_fraction": 0.2}
        async with trigger(fleet.router, **settings) as (server, stub, _):
            first = await stub.Admit(admit_request("user-f1", LONG, seed=3))
            assert first.reason == trigger_pb2.ADMIT_REASON_ADMITTED
            # The answer carried the ranker's report: its budget, and the prefix's bytes held for it.
            fleet_load = server.plane.fleet
            assert fleet_load.hbm_capacity_bytes(INSTANCE) == HBM_BUDGET_MB * 1024 * 1024
            assert KV_BYTES_512 * 0.9 <= fleet_load.leased_bytes(INSTANCE) <= KV_BYTES_512
            second = await stub.Admit(admit_request("user-f2", LONG, seed=4))
            assert (second.admitted, second.reason) == (False, trigger_pb2.ADMIT_REASON_HBM_LIMIT)
            pressure = REGISTRY.get_sample_value("relaygr_trigger_brake_pressure", {"brake": "hbm"})
            assert pressure == pytest.approx(2 * KV_BYTES_512 / (0.2 * HBM_BUDGET_MB * 1024 * 1024), rel=0.1)

    asyncio.run(scenario())


def test_the_backlog_brake_refuses_only_a_prefix_queued_behind_a_full_backlog(fleet):
    """A prefix longer than the bound is admitted with nothing queued ahead of it: it saves its Rank what it
    finishes. One queued behind a backlog that fills the bound would not start before its Rank: refused."""

    async def scenario():
        bound = fleet.long_pre_infer_ms / 2
        settings = {"relay_overhead_ms": fleet.overhead_ms, "max_backlog_ms": bound}
        async with trigger(fleet.router, **settings) as (server, stub, _):
            longer = await stub.Admit(admit_request("user-b1", LONG, seed=5))
            assert (longer.admitted, longer.reason) == (True, trigger_pb2.ADMIT_REASON_ADMITTED)
            # The ranker reports a backlog that drains (at real time) for far longer than this test runs.
            server.plane.fleet.observe(
                ranker_pb2.LoadReport(instance=INSTANCE, pre_infer_backlog_ms=bound * 1e4)
            )
            backlog = server.plane.fleet.pre_infer_backlog_ms(INSTANCE)
            refused = await stub.Admit(admit_request("user-b2", LONG, seed=6))
            assert (refused.admitted, refused.reason) == (False, trigger_pb2.ADMIT_REASON_BACKLOG_LIMIT)
            assert server.plane.fleet.pre_infer_backlog_ms(INSTANCE) <= backlog  # it reserved nothing

    asyncio.run(scenario())


def test_a_prefix_over_the_rankers_budget_is_refused_before_any_pre_infer(fleet):
    """The ranker's refusal of a PreInfer (reported, its reservation released) is the data plane's, tested
    without a server (tests/trigger/test_dataplane.py); here, the budget it would refuse by is known to the
    trigger from the fleet profile before any ranker has reported, and no PreInfer is sent."""

    async def scenario():
        # The backlog brake is lifted out of the way: on a loaded machine the curve fitted at start-up can
        # predict more than the default 500 ms for an 8192-event prefix (BACKLOG_LIMIT would come first).
        settings = {"relay_overhead_ms": fleet.overhead_ms, "max_backlog_ms": 3_600_000.0}
        async with trigger(fleet.router, **settings) as (server, stub, _):
            fleet_load = server.plane.fleet
            before = {reason: decisions(reason) for reason in ("hbm_limit", "ranker_refused")}
            # 8192 events of cpu-tiny are 4 MiB of KV: more than the ranker's whole HBM budget, which the
            # profile stated (no PreInfer has answered, so no ranker has reported).
            assert fleet_load.hbm_capacity_bytes(INSTANCE) == HBM_BUDGET_MB * 1024 * 1024
            for _ in range(2):  # a refusal leaves no record: the same prefix is no duplicate
                refused = await stub.Admit(admit_request("user-huge", 8192, seed=7))
                assert (refused.admitted, refused.reason, refused.relay_instance) == (
                    False, trigger_pb2.ADMIT_REASON_HBM_LIMIT, "",
                )  # fmt: skip
            # The trigger's own refusals, counted as such: no PreInfer went to the ranker to be refused.
            assert decisions("hbm_limit") == before["hbm_limit"] + 2
            assert decisions("ranker_refused") == before["ranker_refused"]
            assert fleet_load.unanswered_bytes(INSTANCE) == 0 and fleet_load.leased_bytes(INSTANCE) == 0

    asyncio.run(scenario())


def clear_long_term(request: trigger_pb2.AdmitRequest) -> None:
    request.ClearField("long_term")


def drop_an_action_type(request: trigger_pb2.AdmitRequest) -> None:
    del request.long_term.action_types[-1]


@pytest.mark.parametrize(
    ("spoil", "field"),
    [
        (lambda r: setattr(r, "user_id", ""), "user_id"),
        (lambda r: setattr(r, "num_candidates", 0), "num_candidates"),
        (lambda r: setattr(r, "short_term_length", -1), "short_term_length"),
        (lambda r: setattr(r, "short_term_length", 100_000), "short_term_length"),
        (clear_long_term, "long_term.item_ids"),
        (drop_an_action_type, "long_term.action_types"),
    ],
)
def test_invalid_requests_name_the_field(fleet, spoil, field):
    async def scenario():
        async with trigger(fleet.router) as (_, stub, _):
            request = admit_request("user-bad", SHORT)
            spoil(request)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Admit(request)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert failure.value.details().startswith(f"{field}:")

    asyncio.run(scenario())


def test_the_trigger_runs_as_a_process_and_stops_cleanly(fleet, tmp_path):
    with Processes(log_dir=tmp_path) as procs:
        flags = ["--router", fleet.router, "--relay-overhead-ms", str(fleet.overhead_ms),
                 "--pre-infer-timeout-ms", "2000"]  # fmt: skip
        child = procs.start("trigger", "services.trigger", SERVICE_NAME, flags)
        child.wait_healthy(30)
        with grpc.insecure_channel(child.address) as channel:
            answer = trigger_pb2_grpc.TriggerServiceStub(channel).Admit(admit_request("user-p", LONG, seed=8))
        assert (answer.reason, answer.relay_instance) == (trigger_pb2.ADMIT_REASON_ADMITTED, INSTANCE)
        assert child.stop() == 0


def test_without_a_profile_the_trigger_is_not_serving_and_admit_is_unavailable():
    async def scenario():
        unreachable = f"127.0.0.1:{free_port()}"
        async with trigger(unreachable, serving=False, profile_retry_s=0.05) as (_, stub, health):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Admit(admit_request("user-early", LONG))
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())
