"""The router as a process in front of three real cpu-tiny ranker processes, over loopback."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.affinity.ring import AffinityRing
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes, ServiceProcess
from tests.support import requests
from tests.support.metrics import scrape, value
from tests.support.polling import wait_for

RANKERS = ["ranker-0", "ranker-1", "ranker-2"]
RANKER_ARGS = [
    "--model-preset", "cpu-tiny", "--profile-lengths", "16,64", "--profile-repeats", "1",
    "--profile-candidates", "8", "--profile-short-term", "4", "--drain-grace-s", "1",
]  # fmt: skip
ROUTER_ARGS = ["--health-interval-s", "0.2", "--circuit-open-s", "2", "--drain-grace-s", "1"]
USERS = [f"user-{i}" for i in range(20)]


def start_ranker(procs: Processes, name: str, port: int | None = None) -> ServiceProcess:
    """Starts ranker `name` (its --instance-name, the member name); waits for it later."""
    args = ["--instance-name", name, *RANKER_ARGS]
    return procs.start(f"{name}-{len(procs.children)}", "services.ranker", RANKER_SERVICE, args, port=port)


def start_router(
    procs: Processes, rankers: dict[str, ServiceProcess], name: str, members: list[str]
) -> ServiceProcess:
    """Starts a router over `members` and waits until every one of them is routable: the router serves once
    one member is healthy, and these tests assert affinity, which a member not yet checked would turn into a
    failover (a first health check that times out on a busy machine leaves its member out until the next)."""
    listed = ",".join(f"{member}={rankers[member].address}" for member in members)
    router = procs.start(name, "services.router", RANKER_SERVICE, ["--rankers", listed, *ROUTER_ARGS])
    router.wait_healthy(30)
    wait_for(lambda: routable_members(router) == set(members), 30, f"{name}: all of {members} routable")
    return router


def routable_members(router: ServiceProcess) -> set[str]:
    """The members whose `relaygr_router_member_healthy` gauge reads 1 on the router's own metrics."""
    return {
        dict(labels)["member"]
        for (name, labels), value in scrape(router.metrics_port).items()
        if name == "relaygr_router_member_healthy" and value == 1
    }


class Fleet:
    """Ranker processes by member name, the router in front of all of them, and a client of the router."""

    def __init__(self, procs: Processes, rankers: dict[str, ServiceProcess], router: ServiceProcess) -> None:
        self.procs = procs
        self.rankers = rankers
        self.router = router
        self.channel = grpc.insecure_channel(router.address)
        self.client = ranker_pb2_grpc.RankerServiceStub(self.channel)

    def start_router(self, name: str, members: list[str]) -> ServiceProcess:
        return start_router(self.procs, self.rankers, name, members)

    def decisions(self, method: str, decision: str) -> float:
        samples = scrape(self.router.metrics_port)
        return value(samples, "relaygr_router_decisions_total", method=method, decision=decision)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Processes(log_dir=Path(tmp_path_factory.mktemp("fleet-logs"))) as procs:
        rankers = {name: start_ranker(procs, name) for name in RANKERS}
        for ranker in rankers.values():
            ranker.wait_healthy(120)
        fleet = Fleet(procs, rankers, start_router(procs, rankers, "router", RANKERS))
        yield fleet
        fleet.channel.close()


def long_term(user: str, length: int = 256) -> list[int]:
    seed = int(user.rsplit("-", 1)[-1]) * 1000
    return [seed + i for i in range(length)]


def pre_infer_request(user: str) -> ranker_pb2.PreInferRequest:
    return requests.pre_infer_request(user, long_term(user))


def rank_request(
    user: str, hint: str = "", candidates: tuple[int, ...] = (5, 6, 7, 8)
) -> ranker_pb2.RankRequest:
    request_id = f"{user}-{time.monotonic_ns()}"
    return requests.rank_request(user, long_term(user), [3, 4], candidates, hint, request_id=request_id)


def test_pre_infer_then_rank_through_the_router_hits_hbm_for_every_user(fleet: Fleet) -> None:
    ring = AffinityRing(RANKERS)
    for user in USERS:
        signal_ = fleet.client.PreInfer(pre_infer_request(user), timeout=10)
        assert signal_.outcome == ranker_pb2.PRE_INFER_OUTCOME_ACCEPTED
        assert signal_.instance == ring.owner(user)
        # At once, without a hint: affinity alone brings it to the prefix (still in production or ready).
        answer = fleet.client.Rank(rank_request(user), timeout=10)
        assert (answer.instance, answer.cache_source) == (ring.owner(user), common_pb2.CACHE_SOURCE_HBM), user
    assert {ring.owner(user) for user in USERS} == set(RANKERS)


def test_a_hinted_rank_follows_its_cache_off_the_ring(fleet: Fleet) -> None:
    user = "user-101"
    elsewhere = list(AffinityRing(RANKERS).walk(user))[-1]  # as if PreInfer had spilled there
    with grpc.insecure_channel(fleet.rankers[elsewhere].address) as channel:
        signal_ = ranker_pb2_grpc.RankerServiceStub(channel).PreInfer(pre_infer_request(user), timeout=10)
    before = fleet.decisions("Rank", "hint")
    answer = fleet.client.Rank(rank_request(user, hint=signal_.instance), timeout=10)
    assert (answer.instance, answer.cache_source) == (elsewhere, common_pb2.CACHE_SOURCE_HBM)
    assert fleet.decisions("Rank", "hint") == before + 1


def test_scores_through_the_router_equal_scores_from_a_ranker_directly(fleet: Fleet) -> None:
    for user in ("user-201", "user-202", "user-203"):
        request = rank_request(user, candidates=(11, 12, 13, 14, 15))
        routed = fleet.client.Rank(request, timeout=10)
        other = next(name for name in RANKERS if name != routed.instance)  # a cold ranker computes it all
        with grpc.insecure_channel(fleet.rankers[other].address) as channel:
            direct = ranker_pb2_grpc.RankerServiceStub(channel).Rank(request, timeout=10)
        assert routed.cache_source == direct.cache_source == common_pb2.CACHE_SOURCE_MISS
        assert len(routed.scores) == 5
        assert list(routed.scores) == list(direct.scores)


def test_invalid_argument_from_a_ranker_passes_through_with_its_code(fleet: Fleet) -> None:
    request = rank_request("user-301")
    request.short_term.action_types.append(1)  # one more action type than items
    with pytest.raises(grpc.RpcError) as error:
        fleet.client.Rank(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "short_term.action_types" in error.value.details()


def test_adding_a_member_moves_about_one_nth_of_users(fleet: Fleet) -> None:
    users = [f"user-{i}" for i in range(20_000)]
    two, three = AffinityRing(RANKERS[:2]), AffinityRing(RANKERS)
    moved = [user for user in users if two.owner(user) != three.owner(user)]
    assert 0.5 / 3 < len(moved) / len(users) < 1.6 / 3
    assert {three.owner(user) for user in moved} == {"ranker-2"}

    # Live: a router over ranker-0 and ranker-1 next to the fleet's router over all three.
    smaller = fleet.start_router("router-2-members", RANKERS[:2])
    with grpc.insecure_channel(smaller.address) as channel:
        before = ranker_pb2_grpc.RankerServiceStub(channel)
        live = {user: before.Rank(rank_request(user), timeout=10).instance for user in users[:30]}
    after = {user: fleet.client.Rank(rank_request(user), timeout=10).instance for user in users[:30]}
    live_moved = {user for user in live if live[user] != after[user]}
    assert live_moved == set(moved) & set(live)
    assert 0 < len(live_moved) < 20
    assert {after[user] for user in live_moved} == {"ranker-2"}
    smaller.stop()


def test_a_killed_ranker_costs_no_failed_rank_and_gets_its_arc_back(fleet: Fleet) -> None:
    ring = AffinityRing(RANKERS)
    users = [f"user-{i}" for i in range(40)]
    answers: list[str] = []
    errors: list[grpc.RpcError] = []
    stop = threading.Event()

    def stream(offset: int) -> None:
        i = offset
        while not stop.is_set():
            try:
                answers.append(fleet.client.Rank(rank_request(users[i % len(users)]), timeout=10).instance)
            except grpc.RpcError as exc:
                errors.append(exc)
            i += 3

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        served_before_kill = len(answers)
        fleet.rankers["ranker-2"].signal(signal.SIGKILL)
        time.sleep(2.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, [e.code() for e in errors]
    assert "ranker-2" in answers[:served_before_kill]
    assert len(answers) > served_before_kill + 10
    assert "ranker-2" not in answers[-5:]

    # A Rank hinted to the dead member still succeeds, on the ring.
    owned = [user for user in users if ring.owner(user) == "ranker-2"]
    before = fleet.decisions("Rank", "hint_unavailable")
    answer = fleet.client.Rank(rank_request(owned[0], hint="ranker-2"), timeout=10)
    assert answer.instance == list(ring.walk(owned[0]))[1]
    assert fleet.decisions("Rank", "hint_unavailable") == before + 1

    # The same pod name on the same port comes back and gets exactly its users back.
    dead = fleet.rankers["ranker-2"]
    fleet.rankers["ranker-2"] = start_ranker(fleet.procs, "ranker-2", port=dead.port)
    fleet.rankers["ranker-2"].wait_healthy(120)

    def taken_back() -> bool:
        return fleet.client.Rank(rank_request(owned[0]), timeout=10).instance == "ranker-2"

    wait_for(taken_back, 10, "the router took ranker-2 back")
    assert {fleet.client.Rank(rank_request(user), timeout=10).instance for user in owned} == {"ranker-2"}
