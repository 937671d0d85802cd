"""Faults and change under load: a crashed ranker, a rolling restart, a restarted router or trigger.

Each test runs a local fleet (three cpu-tiny rankers, router, trigger, retrieval stub) with open-loop load
on two front doors at once: Rank calls to the router and Recommend calls to the retrieval stub. Ranking
is idempotent, so the promise is zero failed calls on both, whatever happens to one service at a time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2_grpc
from services.affinity.ring import AffinityRing
from services.launcher.fleet import ROUTER, STUB, TRIGGER, Fleet
from tests.reliability.harness import (
    STUB_ARGS,
    codes,
    failures,
    fleet_config,
    rank_load,
    recommend_load,
    user_rank,
)
from tests.support.metrics import increase, scrape, total, value
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

RATE = 12.0  # per front door, requests per second: well within the fleet's capacity
KILL_RATE = 25.0  # sustained: calls reach the ranker that is killed several times a second
USERS = 120


@pytest.fixture
def fleet(tmp_path) -> Iterator[Fleet]:
    # An SLO of 1 ms puts every request at risk, so the trigger admits and the relay runs.
    with Fleet(fleet_config(tmp_path / "logs", slo_ms=1.0)) as running:
        yield running


def routable_in_router(fleet: Fleet, member: str) -> bool:
    samples = scrape(fleet.children[ROUTER].metrics_port)
    return value(samples, "relaygr_router_member_healthy", member=member) == 1


def inflight_to(fleet: Fleet, member: str) -> float:
    return value(scrape(fleet.children[ROUTER].metrics_port), "relaygr_router_inflight", member=member)


def test_a_sigkilled_ranker_costs_no_failed_call_and_gets_its_arc_back(fleet: Fleet) -> None:
    # Sustained load, with the default deadlines.
    ranks = rank_load(fleet.address(ROUTER), KILL_RATE, users=USERS, seed=1).start()
    recommends = recommend_load(fleet.address(STUB), KILL_RATE, users=USERS, seed=2).start()
    try:
        time.sleep(2.0)
        before = scrape(fleet.children[ROUTER].metrics_port)
        # The crash must come while calls are in flight on the victim. A Rank takes milliseconds, so a
        # SIGKILL at a random instant mostly finds none: the victim hangs first (SIGSTOP), until the router
        # itself counts calls in flight on it, and then dies with them.
        fleet.children["ranker-1"].signal(signal.SIGSTOP)
        wait_for(lambda: inflight_to(fleet, "ranker-1") >= 2, 5, "calls in flight on ranker-1", every_s=0.01)
        killed_at = time.monotonic()
        fleet.kill_ranker("ranker-1")
        time.sleep(1.0)  # served by the others meanwhile
        fleet.restart_ranker("ranker-1")
        wait_for(lambda: routable_in_router(fleet, "ranker-1"), 10, "the router takes ranker-1 back")
        time.sleep(1.5)
    finally:
        rank_records, recommend_records = ranks.stop(), recommends.stop()
    after = scrape(fleet.children[ROUTER].metrics_port)

    assert failures(rank_records) == [] and failures(recommend_records) == []
    assert len(rank_records) > 3 * KILL_RATE and len(recommend_records) > 3 * KILL_RATE
    served_before = {r.response.instance for r in rank_records if r.intended_s < killed_at - ranks.started_at}
    assert served_before == set(fleet.ranker_names)
    # The mechanism: calls to the dead ranker failed at the router and were failed over, not lucky timing.
    assert increase(before, after, "relaygr_router_member_failures_total", member="ranker-1") > 0
    failovers = increase(before, after, "relaygr_router_decisions_total", method="Rank", decision="failover")
    assert failovers > 0
    print(f"failovers {failovers:.0f}, calls {len(rank_records)} Rank + {len(recommend_records)} Recommend")

    # Ranker-1's users (by the ring, as the router places them without a hint) are its own again.
    owned = [u for u in range(USERS) if AffinityRing(fleet.ranker_names).owner(f"user-{u}") == "ranker-1"]
    assert len(owned) > USERS // 6
    with grpc.insecure_channel(fleet.address(ROUTER)) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        assert {stub.Rank(user_rank(u), timeout=10).instance for u in owned} == {"ranker-1"}


def test_a_rolling_restart_with_sigterm_costs_no_failed_call(fleet: Fleet) -> None:
    ranks = rank_load(fleet.address(ROUTER), RATE, users=USERS, seed=3).start()
    recommends = recommend_load(fleet.address(STUB), RATE, users=USERS, seed=4).start()
    exit_codes = {}
    try:
        time.sleep(1.0)
        for name in fleet.ranker_names:
            fleet.kill_ranker(name, signal.SIGTERM)
            exit_codes[name] = fleet.children[name].popen.returncode
            fleet.restart_ranker(name)
            wait_for(lambda name=name: routable_in_router(fleet, name), 10, f"the router takes {name} back")
        time.sleep(1.0)
    finally:
        rank_records, recommend_records = ranks.stop(), recommends.stop()

    assert exit_codes == dict.fromkeys(fleet.ranker_names, 0)  # each drained and exited by itself
    assert failures(rank_records) == [] and failures(recommend_records) == []
    # Not even a retry was needed: each ranker kept serving until the router had seen it NOT_SERVING.
    router = scrape(fleet.children[ROUTER].metrics_port)
    assert total(router, "relaygr_router_member_failures_total") == 0
    assert total(router, "relaygr_router_decisions_total", decision="failover") == 0
    assert len(rank_records) > 3 * RATE and len(recommend_records) > 3 * RATE
    # Every restarted ranker serves again: a Rank for a user of each one's arc (by the ring, as the router
    # places users without a hint) is served by that ranker. Asked directly, not read off the last second
    # of the load, whose dozen users may all fall on two of the three arcs.
    ring = AffinityRing(fleet.ranker_names)
    owners = {
        name: next(u for u in range(USERS) if ring.owner(f"user-{u}") == name) for name in fleet.ranker_names
    }
    with grpc.insecure_channel(fleet.address(ROUTER)) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        served = {name: stub.Rank(user_rank(user), timeout=10).instance for name, user in owners.items()}
    assert served == {name: name for name in fleet.ranker_names}


@pytest.fixture
def routed_fleet(tmp_path) -> Iterator[Fleet]:
    """The fleet with the trigger and the stub calling the rankers through the router (`--routing router`),
    for the router's own faults: with direct routing, the default, the router carries no Recommend."""
    with Fleet(fleet_config(tmp_path / "logs", slo_ms=1.0, routing="router")) as running:
        yield running


@pytest.mark.parametrize("service", [ROUTER, TRIGGER])
def test_a_router_or_trigger_replaced_under_load_loses_no_recommend(
    request: pytest.FixtureRequest, service: str
) -> None:
    """A rolling update of the sole router or trigger, at the default deadlines (Rank 1 s): the new process
    serves on the same port (SO_REUSEPORT) before the old one drains, as Kubernetes' surge does. The router
    is replaced in a fleet that routes through it."""
    fleet: Fleet = request.getfixturevalue("routed_fleet" if service == ROUTER else "fleet")
    recommends = recommend_load(fleet.address(STUB), RATE, users=USERS, seed=5).start()
    old = fleet.children[service]
    try:
        time.sleep(2.0)
        replaced_at = time.monotonic() - recommends.started_at
        fleet.replace(service)
        time.sleep(3.0)
    finally:
        records = recommends.stop()

    assert failures(records) == [], codes(records)
    assert len(records) > 4 * RATE
    new = fleet.children[service]
    assert new.popen.pid != old.popen.pid and new.alive()
    assert old.popen.returncode == 0  # it drained and exited by itself
    # The new process took the traffic over: it answered calls, by its own metrics.
    method = "Rank" if service == ROUTER else "Admit"
    answered = total(
        scrape(new.metrics_port), "grpc_server_handled_total", grpc_method=method, grpc_code="OK"
    )
    assert answered > 0
    # The relay works on after the swap: admitted requests rank against their pre-inferred prefix.
    after = [r.response for r in records if r.intended_s > replaced_at + 1.0]
    assert any(a.admitted for a in after)
    assert any(a.cache_source == common_pb2.CACHE_SOURCE_HBM for a in after)


@pytest.fixture
def patient_fleet(tmp_path) -> Iterator[Fleet]:
    """The fleet, routing through the router, with a Rank deadline (5 s) longer than the gap of a crashed
    sole router's restart: its
    drain (~0.45 s) plus a new process's start (~0.25 s) plus the stub's redial (a first retry after
    --reconnect-backoff-ms, growing). No process listens meanwhile, so a 1 s deadline is ridden out only
    mostly; a restart without a gap is `replace` (above), which deployments get from two replicas or surge."""
    stub_args = f"{STUB_ARGS} --rank-timeout-ms 5000"
    config = fleet_config(tmp_path / "logs", slo_ms=1.0, stub_args=stub_args, routing="router")
    with Fleet(config) as running:
        yield running


def test_a_sole_router_stopped_and_started_again_loses_no_recommend(patient_fleet: Fleet) -> None:
    fleet = patient_fleet
    recommends = recommend_load(fleet.address(STUB), RATE, users=USERS, seed=5, timeout_s=10.0).start()
    try:
        time.sleep(2.0)
        restarted_at = time.monotonic() - recommends.started_at
        fleet.kill(ROUTER, signal.SIGTERM)
        fleet.restart(ROUTER)
        time.sleep(3.0)
    finally:
        records = recommends.stop()

    assert failures(records) == [], codes(records)
    assert len(records) > 4 * RATE
    after = [r.response for r in records if r.intended_s > restarted_at + 1.0]
    assert any(a.admitted for a in after)
    assert any(a.cache_source == common_pb2.CACHE_SOURCE_HBM for a in after)


def test_a_trigger_stopped_and_started_again_costs_no_recommend_only_relay(fleet: Fleet) -> None:
    """While the trigger is away, Admit fails fast and Recommends rank without relay: misses, not errors."""
    recommends = recommend_load(fleet.address(STUB), RATE, users=USERS, seed=6).start()
    try:
        time.sleep(2.0)
        fleet.kill(TRIGGER, signal.SIGTERM)
        killed_at = time.monotonic() - recommends.started_at  # the old process has exited
        time.sleep(1.0)
        respawned_at = time.monotonic() - recommends.started_at  # the new process does not exist yet
        fleet.restart(TRIGGER)
        restarted_at = time.monotonic() - recommends.started_at
        time.sleep(3.0)
    finally:
        records = recommends.stop()

    assert failures(records) == [], codes(records)
    # Admits failed while it was away (the stub's own count), and those Recommends ranked without relay.
    assert total(scrape(fleet.children[STUB].metrics_port), "relaygr_recommend_admit_failures_total") > 0
    # Partitioned by when each Recommend was sent, not meant to be (a send that lags its schedule would slip
    # into the window): sent after the old trigger exited and before the new one was even spawned, so its
    # Admit could reach no trigger unless the stub held it for the new one's whole start-up.
    away = [r.response for r in records if killed_at < r.sent_s < respawned_at]
    assert away and not any(a.admitted for a in away)
    after = [r.response for r in records if r.intended_s > restarted_at + 1.0]
    assert any(a.admitted for a in after)
    assert any(a.cache_source == common_pb2.CACHE_SOURCE_HBM for a in after)
