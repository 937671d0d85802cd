"""Direct routing over real processes: the trigger and the retrieval stub, given the rankers, route their own
PreInfer and Rank (the launcher's default), so a relayed request never passes the router; with
`--routing router` every call goes through it. Checked by where the routing decisions were counted (the
mechanism), by the ring owner each user landed on, and by the Rank finding its prefix in HBM (the outcome).
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from relaygr.v1 import (
    common_pb2,
    ranker_pb2,
    ranker_pb2_grpc,
    recommend_pb2,
    recommend_pb2_grpc,
    trigger_pb2,
    trigger_pb2_grpc,
)
from services.affinity.ring import AffinityRing
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet, FleetConfig
from tests.support.metrics import scrape, total
from tests.support.polling import wait_for
from tests.support.requests import history, pre_infer_request, sequence

USERS = [f"user-{i}" for i in range(8)]
# Generous deadlines (a busy test machine must not turn a late Admit into no relay), the trigger admits
# every request (what is measured here is where calls go, not which are worth relaying) and keeps every
# prefix on its ring owner: the fleet's relay window is 200 ms, but the trigger's own flag overrides it
# with 0 for the trigger alone (a ranker's reported queue is its own warm-up curve's prediction, and a curve
# measured while the whole fleet starts on two cores can keep an idle owner "busy" past the window;
# placement by the queues has its own test below), health checked often so a killed ranker leaves the ring
# within the test.
STUB_ARGS = (
    "--history-max 256 --num-candidates 16 --admit-timeout-ms 5000 --rank-timeout-ms 20000 "
    "--health-interval-s 0.2"
)
TRIGGER_ARGS = "--admit-all true --pre-infer-timeout-ms 2000 --health-interval-s 0.2"
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
        relay_window_ms=200.0,
        trigger_args=f"{TRIGGER_ARGS} --relay-window-ms 0",
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


def healthy(fleet: Fleet, service: str, **member: str) -> float:
    """How many members (of those `member` names) `service` routes to now, by its own metrics."""
    return total(scrape(fleet.endpoints()[service].metrics_port), "relaygr_router_member_healthy", **member)


def every_member_routable(fleet: Fleet, service: str) -> bool:
    return healthy(fleet, service) == len(fleet.ranker_names)


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
            wait_for(lambda service=service: every_member_routable(fleet, service), 30, f"{service}'s ring")
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
            off_ring = f"ranker-1 off {service}'s ring"
            wait_for(lambda service=service: healthy(fleet, service, member="ranker-1") == 0, 30, off_ring)
        for user in USERS:
            answer = recommend(fleet, f"{user}-after")
            assert answer.instance == "ranker-0"
            assert answer.cache_source == common_pb2.CACHE_SOURCE_HBM


@pytest.mark.slow
def test_routing_through_the_router_places_users_the_same_way(tmp_path):
    with Fleet(fleet_config(tmp_path, "router")) as fleet:
        wait_for(lambda: every_member_routable(fleet, ROUTER), 30, "the router's ring")
        relay_each_user(fleet)
        n = len(USERS)
        assert decisions(fleet, ROUTER, "PreInfer", decision="affinity") == n
        assert decisions(fleet, ROUTER, "Rank", decision="hint") == n
        assert decisions(fleet, TRIGGER, "PreInfer") == decisions(fleet, STUB, "Rank") == 0


def test_a_prefix_its_owner_cannot_have_ready_in_the_window_is_placed_on_the_next_member(tmp_path):
    """The trigger's placement by the rankers' queues, over real processes: with ranker-0's pre-inference
    queue filled far past the relay window (PreInfers sent to it directly, as other triggers' would be), a
    user whose ring owner is ranker-0 has its prefix computed on ranker-1, and its Rank follows the hint there
    and is served from HBM. The trigger counted that PreInfer as a spill. The queue is the ranker's own
    prediction (its warm-up curve, noisy on a busy machine), so the margins are wide: a window of 400 ms
    against a queue predicted at 1500 ms or more, and really of 40 prefixes of 2048 events."""
    config = dataclasses.replace(
        fleet_config(tmp_path, "direct"),
        relay_window_ms=400.0,
        trigger_args=TRIGGER_ARGS,
        ranker_args="--profile-lengths 256,2048 --profile-repeats 3 --max-pending-pre-infer 4096 "
        "--max-pre-infer-backlog-ms 100000 --hbm-budget-mb 2048",
    )
    with Fleet(config) as fleet:
        for service in (TRIGGER, STUB):
            wait_for(lambda service=service: every_member_routable(fleet, service), 30, f"{service}'s ring")
        busy, idle = fleet.ranker_names
        first, second = [
            user for user in (f"user-{i}" for i in range(100)) if ring_owner(fleet, user) == busy
        ][:2]
        with grpc.insecure_channel(fleet.address(busy)) as channel:
            ranker = ranker_pb2_grpc.RankerServiceStub(channel)
            backlog, flood = 0.0, 0
            while backlog < 1500.0 or flood < 40:  # predicted, and really: 40 prefixes of 2048 events
                flood += 1
                assert flood <= 1000, backlog
                answer = ranker.PreInfer(
                    pre_infer_request(f"flood-{flood}", history(flood, 2048)), timeout=30
                )
                assert answer.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED, answer
                backlog = answer.load.pre_infer_backlog_ms
        # The trigger learns ranker-0's queue from the answer to its next PreInfer there...
        with grpc.insecure_channel(fleet.address(TRIGGER)) as channel:
            admitted = trigger_pb2_grpc.TriggerServiceStub(channel).Admit(
                trigger_pb2.AdmitRequest(
                    user_id=first, long_term=sequence(history(1, 64)), num_candidates=8, short_term_length=16
                ),
                timeout=30,
            )
        assert (admitted.admitted, admitted.relay_instance) == (True, busy)
        # ...and places the next prefix of a ranker-0 user on ranker-1, where its Rank finds it.
        answer = recommend(fleet, second)
        assert answer.admitted and answer.instance == idle
        assert answer.cache_source == common_pb2.CACHE_SOURCE_HBM
        assert decisions(fleet, TRIGGER, "PreInfer", decision="spill") == 1
        assert decisions(fleet, TRIGGER, "PreInfer", decision="affinity") == 1
        assert decisions(fleet, STUB, "Rank", decision="hint") == 1
