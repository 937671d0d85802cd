"""The fleet across hosts: rankers on two test hosts, router, trigger and retrieval stub on a third, found
by DNS as in Kubernetes; direct routing as the manifests deploy it, a host dropping off the network, and its
return.

The hosts are network namespaces on one switch (tests/hosts/netns.py), each with its own private address
and ports; a fourth runs the cluster DNS (dnsmasq) with the records a headless Service gets: an A record
per pod (`ranker-0.ranker-headless.relaygr.svc.cluster.local`) and the SRV record of the port named
`grpc`. Every service is started as a deployment starts it, with the names the manifests use
(deploy/base/*.env): the trigger and the retrieval stub route their own PreInfer and Rank calls to the
rankers (direct routing: the router's policy in their own process), knowing the rankers only by
`--rankers-srv`, as the router does; the stub knows the trigger only by its `dns:///trigger-headless…`
target. The router still runs, for callers from outside the fleet, and no call of the fleet passes through
it. Every process routes with its default settings throughout.

From inside h3, a driver (tests/hosts/driver.py) sends open-loop Recommend load to the retrieval stub and
reads the services' metrics, while the test:
1. checks discovery: the SRV record lists both rankers; the router has them as members named by it, and
   so have the trigger and the stub, each by its own metrics;
2. checks affinity: pre-inferred users are ranked from HBM, the trigger placing each PreInfer on the ring
   and the stub routing each Rank by the relay hint the trigger answered;
3. cuts h2 off the switch while the load runs (packets dropped, no reset: harder than a killed process):
   no Recommend fails (a failed Rank fails its Recommend), the stub and the trigger each take ranker-1 off
   their ring after its health checks time out, Ranks caught on ranker-1 meanwhile were hedged by the stub
   onto ranker-0, and ranker-1's users are ranked on ranker-0, by the responses and by ranker-0's own
   count;
4. plugs h2 in again: ranker-1 is a member again, of the stub, the trigger and the router, and ranks its
   users again, from HBM.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import shlex
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.affinity.ring import AffinityRing
from services.common.contract import RANKER_SERVICE, RECOMMEND_SERVICE, TRIGGER_SERVICE
from tests.hosts import netns
from tests.hosts.driver import Driver
from tests.hosts.netns import HostedService, HostNetwork
from tests.reliability.harness import RANKER_ARGS, STUB_ARGS, TRIGGER_ARGS
from tests.support.metrics import Samples, increase, total
from tests.support.polling import wait_for

pytestmark = pytest.mark.slow

CLUSTER_DOMAIN = "cluster.local"
ZONE = f"relaygr.svc.{CLUSTER_DOMAIN}"
SEARCH = (ZONE, f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN)  # a pod's in namespace relaygr
RANKER_SRV = f"_grpc._tcp.ranker-headless.{ZONE}"
TRIGGER_TARGET = f"dns:///trigger-headless.{ZONE}:50052"
RANKER_HOSTS = {"ranker-0": "h1", "ranker-1": "h2"}
RANKERS = sorted(RANKER_HOSTS)
FRONT = "h3"  # router, trigger, retrieval stub, and the driver
ROUTING = ("retrieval-stub", "trigger")  # the processes that route the fleet's calls (direct routing)
DNS = "dns"
# The manifests' ports: each host has ports of its own, as each pod has.
RANKER_PORT, ROUTER_PORT, TRIGGER_PORT, STUB_PORT = 50051, 50050, 50052, 50053
RANKER_METRICS, ROUTER_METRICS, TRIGGER_METRICS, STUB_METRICS = 9101, 9100, 9102, 9103
STARTUP_TIMEOUT_S = 120.0

RATE = 20.0  # Recommends per second: well within two cpu-tiny rankers' capacity
USERS = 60
AFFINITY_S = 4.0  # load before the cut
AWAY_S = 3.0  # load after the stub and the trigger took ranker-1 off, before h2 is plugged in again
BACK_S = 4.0  # load after they took ranker-1 back


def pod(name: str, service: str) -> str:
    """A pod's DNS name under its headless Service."""
    return f"{name}.{service}.{ZONE}"


@dataclasses.dataclass
class AcrossHosts:
    network: HostNetwork
    driver: Driver
    services: dict[str, HostedService]

    def scrape(self, name: str) -> Samples:
        return self.driver.scrape(self.services[name].metrics_url)


@pytest.fixture
def across(tmp_path) -> Iterator[AcrossHosts]:
    missing = netns.unavailable()
    if missing:
        pytest.skip(f"the across-hosts test needs {missing}")
    network = HostNetwork(["h1", "h2", FRONT, DNS], tmp_path / "logs")
    with network:
        address = {name: host.address for name, host in network.hosts.items()}
        network.start_dns(
            DNS,
            SEARCH,
            a_records={
                **{pod(name, "ranker-headless"): [address[host]] for name, host in RANKER_HOSTS.items()},
                f"ranker-headless.{ZONE}": [address[host] for host in RANKER_HOSTS.values()],
                # The router's Service, for callers from outside the fleet: nothing in it looks this up.
                f"router-headless.{ZONE}": [address[FRONT]],
                f"trigger-headless.{ZONE}": [address[FRONT]],
            },
            srv_records={RANKER_SRV: [(pod(name, "ranker-headless"), RANKER_PORT) for name in RANKERS]},
        )
        driver = Driver(network.start_client(FRONT, "tests.hosts.driver", "driver"))
        yield AcrossHosts(network, driver, start_fleet(network, driver))
    assert network.leftovers() == []


def start_fleet(network: HostNetwork, driver: Driver) -> dict[str, HostedService]:
    """Rankers on h1 and h2, then router, trigger and retrieval stub on h3, each once the rankers serve
    (as seen from h3, across the switch), and the stub once the trigger does."""
    # The DNS server answers before anything that looks names up starts.
    wait_for(lambda: answers(driver, RANKER_SRV), 10, "the DNS server answers")
    services: dict[str, HostedService] = {}
    for name, host in RANKER_HOSTS.items():
        services[name] = network.start_service(
            host, name, "services.ranker", RANKER_SERVICE, RANKER_PORT, RANKER_METRICS,
            ["--instance-name", name, "--model-preset", "cpu-tiny", *shlex.split(RANKER_ARGS)],
        )  # fmt: skip
    for name in RANKER_HOSTS:
        wait_serving(driver, services[name])
    # Only the SRV name, for the router as for the trigger and the stub below: the members, their names and
    # addresses all come from DNS. Default routing settings everywhere, as the manifests set none.
    services["router"] = network.start_service(
        FRONT, "router", "services.router", RANKER_SERVICE, ROUTER_PORT, ROUTER_METRICS,
        ["--rankers-srv", RANKER_SRV],
    )  # fmt: skip
    wait_serving(driver, services["router"])
    # An SLO of 1 ms puts every request at risk, so the trigger admits and the relay runs.
    services["trigger"] = network.start_service(
        FRONT, "trigger", "services.trigger", TRIGGER_SERVICE, TRIGGER_PORT, TRIGGER_METRICS,
        ["--rankers-srv", RANKER_SRV, "--slo-ms", "1", *shlex.split(TRIGGER_ARGS)],
    )  # fmt: skip
    wait_serving(driver, services["trigger"])
    services["retrieval-stub"] = network.start_service(
        FRONT, "retrieval-stub", "services.retrieval_stub", RECOMMEND_SERVICE, STUB_PORT, STUB_METRICS,
        ["--rankers-srv", RANKER_SRV, "--trigger", TRIGGER_TARGET, *shlex.split(STUB_ARGS)],
    )  # fmt: skip
    wait_serving(driver, services["retrieval-stub"])
    return services


def answers(driver: Driver, name: str) -> bool:
    try:
        return bool(driver.srv(name))
    except RuntimeError:
        return False


def wait_serving(driver: Driver, service: HostedService) -> None:
    process = service.process

    def serving() -> bool:
        if not process.alive():
            raise RuntimeError(f"{service.name} exited with {process.popen.returncode}; {process.log_tail()}")
        return driver.serving(service.address, process.service)

    wait_for(serving, STARTUP_TIMEOUT_S, f"{service.name} serves on {service.address}")


def ranks_ok(samples: Samples) -> float:
    return total(samples, "grpc_server_handled_total", grpc_method="Rank", grpc_code="OK")


def routable(samples: Samples) -> list[str]:
    """The members a routing process has on its ring now, by its own metrics."""
    return sorted(
        dict(s)["member"] for (n, s), v in samples.items() if n == "relaygr_router_member_healthy" and v == 1
    )


def members(samples: Samples) -> list[str]:
    """Every member a routing process knows, routable or not."""
    return sorted(dict(s)["member"] for n, s in samples if n == "relaygr_router_member_healthy")


def decisions(samples: Samples, method: str, *kinds: str) -> float:
    """A routing process's decisions for `method`, of the given kinds (every kind when none is given)."""
    if not kinds:
        return total(samples, "relaygr_router_decisions_total", method=method)
    return sum(total(samples, "relaygr_router_decisions_total", method=method, decision=k) for k in kinds)


def test_the_fleet_across_hosts_keeps_affinity_and_loses_no_rank_when_a_host_drops_off(
    across: AcrossHosts,
) -> None:
    network, driver, services = across.network, across.driver, across.services
    front = network.hosts[FRONT].address
    router = services["router"]

    # 1. Discovery: the cluster DNS lists both rankers, and the router found them there by name, as did
    # the trigger and the stub, which route to them themselves.
    assert driver.srv(RANKER_SRV) == [(f"{pod(name, 'ranker-headless')}.", RANKER_PORT) for name in RANKERS]
    wait_for(lambda: driver.members(router.address) == RANKERS, 10, "the router has both rankers as members")
    for name in ROUTING:
        wait_for(
            lambda name=name: routable(across.scrape(name)) == RANKERS,
            10,
            f"the {name} routes to both rankers",
        )

    def member_healthy(name: str) -> dict[str, float]:
        """Whether the stub and the trigger have ranker `name` on their ring (1) or not (0)."""
        return {process: total(across.scrape(process), "relaygr_router_member_healthy", member=name)
                for process in ROUTING}  # fmt: skip

    started = driver.start_load(services["retrieval-stub"].address, RATE, USERS, seed=1)
    try:
        time.sleep(AFFINITY_S)
        before_cut = {name: across.scrape(name) for name in ROUTING}
        cut_at = time.monotonic()
        network.cut("h2")
        gone_at = wait_for(lambda: set(member_healthy("ranker-1").values()) == {0}, 15,
                        "the stub and the trigger take ranker-1 off")  # fmt: skip
        at_gone = {name: across.scrape(name) for name in ("retrieval-stub", "ranker-0")}
        time.sleep(AWAY_S)
        mended_at = time.monotonic()
        network.mend("h2")
        back_at = wait_for(lambda: set(member_healthy("ranker-1").values()) == {1}, 30,
                        "the stub and the trigger take ranker-1 back")  # fmt: skip
        at_back = across.scrape("ranker-1")
        time.sleep(BACK_S)
    finally:
        records = driver.stop_load()
    timeline = {"started": started, "cut": cut_at, "gone": gone_at, "mended": mended_at, "back": back_at}
    (network.log_dir / "records.json").write_text(json.dumps({"timeline": timeline, "records": records}))
    at_end = {name: across.scrape(name) for name in ("router", *ROUTING, *RANKERS)}
    stub, trigger = at_end["retrieval-stub"], at_end["trigger"]
    owner = AffinityRing(RANKERS).owner  # where the stub and the trigger place a user without a hint

    def sent(since: float, until_: float = float("inf")) -> list[dict[str, Any]]:
        """The records of the Recommends sent between two instants (time.monotonic())."""
        return [r for r in records if since - started <= r["intended_s"] < until_ - started]

    before = sent(started, cut_at)  # both rankers on the network
    admitted = [r for r in before if r["admitted"]]
    from_hbm = [r for r in admitted if r["cache_source"] == "hbm"]
    caught = [r for r in sent(cut_at, gone_at) if owner(r["user"]) == "ranker-1"]  # sent into the cut
    away = sent(gone_at, mended_at)  # ranker-1 off the ring
    moved = [r for r in away if owner(r["user"]) == "ranker-1"]
    # Its users pre-inferred since: a DUPLICATE of a prefix admitted on ranker-0 during the cut keeps that
    # hint for the trigger's lease window, so the admitted ones tell where the ring puts them now.
    returned = [r for r in sent(back_at) if owner(r["user"]) == "ranker-1" and r["admitted"]]
    on_ranker_1 = [r for r in returned if r["instance"] == "ranker-1" and r["cache_source"] == "hbm"]
    # Failover decisions are the stub's second attempts: hedges of a silent member's Rank, retries after
    # UNAVAILABLE. Every other decision is a Rank's first attempt.
    hedged = decisions(at_gone["retrieval-stub"], "Rank", "failover") - decisions(
        before_cut["retrieval-stub"], "Rank", "failover"
    )
    first_attempts = decisions(stub, "Rank") - decisions(stub, "Rank", "failover")
    rank_calls = total(stub, "relaygr_recommend_latency_seconds_count", stage="rank")
    answered = sum(ranks_ok(at_end[name]) for name in RANKERS)
    print(
        f"{len(records)} Recommends; before the cut {len(from_hbm)} of {len(admitted)} admitted of "
        f"{len(before)} from HBM; cut at {cut_at - started:.1f}s, ranker-1 off the stub's and the "
        f"trigger's rings {gone_at - cut_at:.1f}s later, meanwhile {hedged:.0f} Ranks hedged, ranker-1's "
        f"users' Recommends took up to {max((r['latency_s'] for r in caught), default=0) * 1000:.0f} ms; "
        f"away {len(moved)} of {len(away)} were ranker-1's; mended at {mended_at - started:.1f}s, back "
        f"{back_at - mended_at:.1f}s later, then {len(on_ranker_1)} of {len(returned)} of its pre-inferred "
        f"users' on it from HBM; the stub routed {first_attempts:.0f} Ranks in "
        f"{decisions(stub, 'Rank'):.0f} attempts, the rankers answered {answered:.0f} OK"
    )

    # No Recommend failed, so no Rank did.
    assert [r for r in records if r["code"] != "OK"] == [], collections.Counter(r["code"] for r in records)
    assert len(records) > 0.7 * RATE * (time.monotonic() - started - 2.0)
    # The stub routed every Rank itself: one first attempt per Recommend ranked, each answered OK by a
    # ranker (a hedged one perhaps by both), and the rankers answered no more Ranks than the stub sent.
    assert first_attempts == rank_calls == len(records)
    assert len(records) <= answered <= decisions(stub, "Rank")
    # ranker-0 stayed on the network: it failed none of the stub's calls.
    assert total(stub, "relaygr_router_member_failures_total", member="ranker-0") == 0
    # The trigger routed every admitted Recommend's PreInfer itself (an Admit the stub gave up on may
    # still have been admitted), by the ring: a PreInfer carries no hint.
    assert sum(r["admitted"] for r in records) <= decisions(trigger, "PreInfer") <= len(records)
    assert decisions(trigger, "PreInfer") == decisions(trigger, "PreInfer", "affinity", "spill")
    # The router serves callers from outside the fleet: no call of the fleet went through it.
    for method in ("Rank", "PreInfer"):
        assert total(at_end["router"], "grpc_server_handled_total", grpc_method=method) == 0
        assert decisions(at_end["router"], method) == 0

    # 2. Affinity: the relay's users are ranked from HBM, on both rankers, through the trigger's hints,
    # which the stub followed.
    assert len(admitted) >= 0.5 * len(before)
    assert len(from_hbm) >= 0.5 * len(admitted), collections.Counter(r["cache_source"] for r in admitted)
    assert {r["instance"] for r in from_hbm} == set(RANKERS)
    assert decisions(before_cut["trigger"], "PreInfer", "affinity") > 0
    assert decisions(before_cut["retrieval-stub"], "Rank", "hint") >= 0.5 * len(admitted)

    # 3. Cut off. Ranks sent to ranker-1 got no answer and were hedged onto ranker-0 (the mechanism)...
    assert hedged > 0 and caught and {r["instance"] for r in caught} == {"ranker-0"}
    # ...until the stub took ranker-1 off: then ranker-0 ranked everyone, ranker-1's users included, by
    # the responses and by ranker-0's own count.
    assert away and {r["instance"] for r in away} == {"ranker-0"}
    assert len(moved) >= 0.25 * len(away)
    assert increase(at_gone["ranker-0"], at_end["ranker-0"], "grpc_server_handled_total",
                    grpc_method="Rank", grpc_code="OK") >= len(away)  # fmt: skip

    # 4. Back: ranker-1 is a member again, of every process that routes, and its users pre-inferred since
    # are ranked on it from HBM.
    assert driver.members(router.address) == RANKERS
    for name in ROUTING:
        assert members(at_end[name]) == routable(at_end[name]) == RANKERS, name
    assert returned and len(on_ranker_1) >= 0.8 * len(returned)
    assert ranks_ok(at_end["ranker-1"]) > ranks_ok(at_back)  # by its own count

    # The names were looked up in the cluster DNS from h3: the SRV record by the router, the trigger and
    # the stub, the pods' names by each of them dialling its members, the trigger's headless Service by
    # the stub; the router's by nobody, as no process of the fleet calls it. (Reverse lookups of h3's
    # address are answered with the router's name, the first A record of that address: only queries for
    # the name count.)
    queries = network.dns_log()
    assert f"query[SRV] {RANKER_SRV} from {front}" in queries
    for name in RANKERS:
        assert f"query[A] {pod(name, 'ranker-headless')} from {front}" in queries
    assert f"query[A] trigger-headless.{ZONE} from {front}" in queries
    assert re.findall(r"query\[\w+\] router-headless\.\S*", queries) == []
