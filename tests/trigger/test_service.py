"""TriggerService over real gRPC: a cpu-tiny ranker and the router in front of it as processes, the trigger
in-process with `--router` at the router.

The SLO is calibrated from the ranker's own measured curve so that the long history is at risk and the
short one is not, whatever the speed of the machine running the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc, trigger_pb2, trigger_pb2_grpc
from services.common.contract import TRIGGER_SERVICE as SERVICE_NAME
from services.launcher.procs import Processes, free_port
from services.trigger.config import TriggerConfig
from services.trigger.fleet_profile import FleetProfile
from services.trigger.server import TriggerServer

INSTANCE = "ranker-a"
SHORT, LONG = 8, 512
SHORT_TERM, CANDIDATES = 16, 32
HBM_BUDGET_MB = 2  # holds a few 512-event prefixes of cpu-tiny (256 KiB each), not an 8192-event one
KV_BYTES_512 = 512 * 512  # cpu-tiny: 512 KV bytes per token


@dataclasses.dataclass(frozen=True)
class Fleet:
    router: str
    slo_ms: float  # between the predictions for SHORT and LONG, at the default risk fraction 0.5


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
             "--profile-lengths", "32,128,512,2048", "--profile-repeats", "3"],
        )  # fmt: skip
        ranker.wait_healthy(120)
        members = f"{INSTANCE}={ranker.address}"
        router = procs.start("router", "services.router", "relaygr.v1.RankerService", ["--rankers", members])
        router.wait_healthy(60)
        with grpc.insecure_channel(router.address) as channel:
            profile = ranker_pb2_grpc.RankerServiceStub(channel).GetProfile(ranker_pb2.GetProfileRequest())
        model = FleetProfile.from_response(profile).cost_model
        short_ms = model.predict_ms(SHORT, SHORT_TERM, CANDIDATES)
        long_ms = model.predict_ms(LONG, SHORT_TERM, CANDIDATES)
        assert long_ms > short_ms, f"the measured curve does not grow with length: {profile.latency_curve}"
        yield Fleet(router.address, slo_ms=short_ms + long_ms)


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


def decisions(reason: str) -> float:
    labels = {"decision": "admit" if reason == "admitted" else "reject", "reason": reason}
    return REGISTRY.get_sample_value("relaygr_trigger_decisions_total", labels) or 0.0


@contextlib.asynccontextmanager
async def trigger(router: str, **settings):
    # A generous PreInfer deadline: the ranker shares two busy cores with the test.
    config = TriggerConfig(port=0, metrics_port=-1, router=router, pre_infer_timeout_ms=2000, **settings)
    config.validate()
    server = TriggerServer(config)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield server, trigger_pb2_grpc.TriggerServiceStub(channel), health_pb2_grpc.HealthStub(channel)
    finally:
        await server.stop()


async def wait_serving(health: health_pb2_grpc.HealthStub) -> None:
    for _ in range(200):
        answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        if answer.status == health_pb2.HealthCheckResponse.SERVING:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("trigger never became SERVING")


def test_long_history_is_admitted_and_its_rank_hits_hbm_short_is_not_at_risk(fleet):
    async def scenario():
        async with trigger(fleet.router, slo_ms=fleet.slo_ms) as (_, stub, health):
            await wait_serving(health)
            before = {r: decisions(r) for r in ("admitted", "not_at_risk", "duplicate")}

            short = await stub.Admit(admit_request("user-short", SHORT))
            assert (short.admitted, short.reason, short.relay_instance) == (
                False, trigger_pb2.ADMIT_REASON_NOT_AT_RISK, "",
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
                "admitted": 1, "not_at_risk": 1, "duplicate": 1,
            }  # fmt: skip

    asyncio.run(scenario())


def test_footprint_bound_refuses_over_a_real_ranker(fleet):
    async def scenario():
        # Room for one 512-event prefix of cpu-tiny (256 KiB), not for two.
        settings = {"slo_ms": fleet.slo_ms, "footprint_budget_mb": 0.3}
        async with trigger(fleet.router, **settings) as (server, stub, health):
            await wait_serving(health)
            first = await stub.Admit(admit_request("user-f1", LONG, seed=3))
            second = await stub.Admit(admit_request("user-f2", LONG, seed=4))
            assert first.reason == trigger_pb2.ADMIT_REASON_ADMITTED
            assert (second.admitted, second.reason) == (False, trigger_pb2.ADMIT_REASON_FOOTPRINT_LIMIT)
            assert server.service.policy.footprint_bytes == KV_BYTES_512
            assert REGISTRY.get_sample_value("relaygr_trigger_footprint_bytes") == KV_BYTES_512

    asyncio.run(scenario())


def test_load_bound_refuses_over_a_real_ranker(fleet):
    async def scenario():
        # One burst of 600 tokens, refilled at 10 per second: one 512-event prefix, then none for ~40 s.
        settings = {"slo_ms": fleet.slo_ms, "pre_infer_tokens_per_s": 10.0, "pre_infer_burst_tokens": 600.0}
        async with trigger(fleet.router, **settings) as (server, stub, health):
            await wait_serving(health)
            first = await stub.Admit(admit_request("user-l1", LONG, seed=5))
            second = await stub.Admit(admit_request("user-l2", LONG, seed=6))
            assert first.reason == trigger_pb2.ADMIT_REASON_ADMITTED
            assert (second.admitted, second.reason) == (False, trigger_pb2.ADMIT_REASON_LOAD_LIMIT)
            assert server.service.policy.footprint_bytes == KV_BYTES_512  # the refused one reserved nothing

    asyncio.run(scenario())


def test_a_ranker_refusal_is_reported_and_refunded(fleet):
    async def scenario():
        # A load bound that can pay for the 8192 events, so that only the ranker can refuse them.
        settings = {"slo_ms": fleet.slo_ms, "pre_infer_tokens_per_s": 10_000.0}
        async with trigger(fleet.router, **settings) as (server, stub, health):
            await wait_serving(health)
            policy = server.service.policy
            tokens = policy.tokens_available
            # 8192 events of cpu-tiny are 4 MiB of KV: more than the ranker's whole HBM budget.
            refused = await stub.Admit(admit_request("user-huge", 8192, seed=7))
            assert (refused.admitted, refused.reason, refused.relay_instance) == (
                False, trigger_pb2.ADMIT_REASON_RANKER_REFUSED, "",
            )  # fmt: skip
            assert policy.footprint_bytes == 0
            assert policy.tokens_available == pytest.approx(tokens, abs=1.0)

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
        async with trigger(fleet.router, slo_ms=fleet.slo_ms) as (_, stub, health):
            await wait_serving(health)
            request = admit_request("user-bad", SHORT)
            spoil(request)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Admit(request)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert failure.value.details().startswith(f"{field}:")

    asyncio.run(scenario())


def test_the_trigger_runs_as_a_process_and_stops_cleanly(fleet, tmp_path):
    with Processes(log_dir=tmp_path) as procs:
        flags = ["--router", fleet.router, "--slo-ms", str(fleet.slo_ms), "--pre-infer-timeout-ms", "2000"]
        child = procs.start("trigger", "services.trigger", SERVICE_NAME, flags)
        child.wait_healthy(30)
        with grpc.insecure_channel(child.address) as channel:
            answer = trigger_pb2_grpc.TriggerServiceStub(channel).Admit(admit_request("user-p", LONG, seed=8))
        assert (answer.reason, answer.relay_instance) == (trigger_pb2.ADMIT_REASON_ADMITTED, INSTANCE)
        assert child.stop() == 0


def test_without_a_profile_the_trigger_is_not_serving_and_admit_is_unavailable():
    async def scenario():
        async with trigger(f"127.0.0.1:{free_port()}", profile_retry_s=0.05) as (_, stub, health):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.Admit(admit_request("user-early", LONG))
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())
