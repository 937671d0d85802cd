"""Direct routing over real processes: the trigger and the retrieval stub, given the rankers, route their own
PreInfer and Rank (the launcher's default), so a relayed request never passes the router; with
`--routing router` every call goes through it. Checked by where the routing decisions were counted (the
mechanism), by the ring owner each user landed on, and by the Rank finding its prefix in HBM (the outcome).
"""

from __future__ import annotations

import time

import grpc
import pytest

from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc, trigger_pb2
from services.common.ring import AffinityRing
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet, FleetConfig
from tests.reliability.harness import scrape, total

USERS = [f"user-{i}" for i in range(8)]
# Generous deadlines (a busy test machine must not turn a late Admit into no relay), the trigger admits
# every request (what is measured here is where calls go, not which are worth relaying), health checked
# often so a killed ranker leaves the ring within the test.
STUB_ARGS = (
    "--history-max 256 --num-candidates 16 --admit-timeout-ms 5000 --rank-timeout-ms 20000 "
    "--preprocess-delay-ms 200 --health-interval-s 0.2"
)
DECISIONS = "relaygr_router_decisions_total"


def fleet_config(tmp_path, routing: str) -> FleetConfig:
    return FleetConfig(
        rankers=2,
        model_preset="cpu-tiny",
        base_port=0,
        metrics_base_port=0,
        log_dir=str(tmp_path / routing),
        ranker_args="--profile-lengths 32,128 --profile-repeats 1",
        routing=routing,
        trigger_args="--admit-all true --pre-infer-timeout-ms 2000 --health-interval-s 0.2",
        router_args="--health-interval-s 0.2",
        stub_args=STUB_ARGS,
    )


def recommend(fleet: Fleet, user_id: str) -> recommend_pb2.RecommendResponse:
    with grpc.insecure_channel(fleet.address(STUB)) as channel:
        return recommend_pb2_grpc.RecommendServiceStub(channel).Recommend(
            recommend_pb2.RecommendRequest(user_id=user_id, top_k=3), timeout=60
        )


def decisions(fleet: Fleet, service: str, method: str, **labels: str) -> float:
    return total(scrape(fleet.endpoints()[service].metrics_port), DECISIONS, method=method, **labels)


def ring_owner(fleet: Fleet, user_id: str) -> str:
    return next(AffinityRing(fleet.ranker_names).walk(user_id))


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def every_member_routable(fleet: Fleet, service: str) -> bool:
    samples = scrape(fleet.endpoints()[service].metrics_port)
    return total(samples, "relaygr_router_member_healthy") == len(fleet.ranker_names)


def relay_each_user(fleet: Fleet) -> list[recommend_pb2.RecommendResponse]:
    """One Recommend per user; each is relayed to its ring owner and ranked from HBM there."""
    answers = [recommend(fleet, user) for user in USERS]
    for user, answer in zip(USERS, answers, strict=True):
        assert answer.admitted and answer.admit_reason == trigger_pb2.ADMIT_REASON_ADMITTED, user
        assert answer.instance == ring_owner(fleet, user), user
        assert answer.cache_source == common_pb2.CACHE_SOURCE_HBM, user
    return answers


def test_direct_routing_relays_every_user_to_its_ring_owner_without_the_router(tmp_path):
    with Fleet(fleet_config(tmp_path, "direct")) as fleet:
        for service in (TRIGGER, STUB, ROUTER):
            wait_until(lambda service=service: every_member_routable(fleet, service))
        relay_each_user(fleet)
        n = len(USERS)
        # The trigger placed every PreInfer on the ring, the stub sent every Rank to its hint; the router
        # decided nothing.
        assert decisions(fleet, TRIGGER, "PreInfer", decision="affinity") == n
        assert decisions(fleet, STUB, "Rank", decision="hint") == n
        assert decisions(fleet, STUB, "Rank") == n
        assert decisions(fleet, ROUTER, "PreInfer") == decisions(fleet, ROUTER, "Rank") == 0

        # A ranker killed: the stub's and the trigger's own health checks take it off their rings, and
        # every user is relayed to and ranked on the survivor.
        fleet.kill_ranker("ranker-1")
        for service in (TRIGGER, STUB):
            wait_until(
                lambda service=service: (
                    total(
                        scrape(fleet.endpoints()[service].metrics_port),
                        "relaygr_router_member_healthy",
                        member="ranker-1",
                    )
                    == 0
                )
            )
        for user in USERS:
            answer = recommend(fleet, f"{user}-after")
            assert answer.instance == "ranker-0"
            assert answer.cache_source == common_pb2.CACHE_SOURCE_HBM


@pytest.mark.slow
def test_routing_through_the_router_places_users_the_same_way(tmp_path):
    with Fleet(fleet_config(tmp_path, "router")) as fleet:
        wait_until(lambda: every_member_routable(fleet, ROUTER))
        relay_each_user(fleet)
        n = len(USERS)
        assert decisions(fleet, ROUTER, "PreInfer", decision="affinity") == n
        assert decisions(fleet, ROUTER, "Rank", decision="hint") == n
        assert decisions(fleet, TRIGGER, "PreInfer") == decisions(fleet, STUB, "Rank") == 0
