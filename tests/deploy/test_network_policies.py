"""The NetworkPolicies allow the fleet's own paths and nothing else, evaluated over every pair of pods
and every port they expose, plus Prometheus, cluster DNS and strangers inside and outside the namespace.
The paths are those the services' own settings dial: the trigger and the retrieval stub route to the
rankers directly, and no fleet pod calls the router, which serves callers from outside the fleet."""

from __future__ import annotations

import pytest

from tests.deploy.compose import composed
from tests.deploy.configs import loaded_configs
from tests.deploy.manifests import NAMESPACE, OVERLAYS, Manifest, named, objects, of_kind, workloads
from tests.deploy.network_policy import FLEET_PATHS, Pod, allowed, open_paths
from tests.deploy.pods import container_ports, containers, pod_labels, selects

COMPONENTS = ("tls", "tracing", "autoscaling", "keda")
PROMETHEUS = Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
KUBE_DNS = Pod("coredns-1", "kube-system", {"k8s-app": "kube-dns"})
NEIGHBOUR = Pod("neighbour", NAMESPACE, {"app.kubernetes.io/name": "neighbour"})
OUTSIDER = Pod("outsider", "default", {"app.kubernetes.io/name": "router"})  # a lookalike elsewhere


def fleet(tree: str) -> tuple[list[dict], dict[str, Pod], dict[str, dict[str, int]]]:
    """The tree's policies, its pods by workload name, and each pod's named ports."""
    return fleet_of(objects(tree))


def fleet_of(manifests: list[Manifest]) -> tuple[list[dict], dict[str, Pod], dict[str, dict[str, int]]]:
    pods, ports = {}, {}
    for workload in workloads(manifests):
        name = workload["metadata"]["name"]
        pods[name] = Pod(name, workload["metadata"]["namespace"], pod_labels(workload))
        ports[name] = {k: v for c in containers(workload) for k, v in container_ports(c).items()}
    return of_kind(manifests, "NetworkPolicy"), pods, ports


def serving(manifests: list[Manifest], host: str) -> tuple[str, Manifest]:
    """The workload behind a Service name `<service>.<namespace>.svc.cluster.local`, and the Service."""
    service = named(manifests, "Service", host.removesuffix(f".{NAMESPACE}.svc.cluster.local"))
    selector = {"matchLabels": service["spec"]["selector"]}
    (workload,) = [w for w in workloads(manifests) if selects(selector, pod_labels(w))]
    return workload["metadata"]["name"], service


def dialled_paths(overlay: str) -> set[tuple[str, str, int]]:
    """(caller, callee, port) for every connection the fleet's services are configured to open, from the
    settings each one's own config loader parses out of its rendered environment: a service that routes
    to the rankers (the router; the trigger and the stub when given RELAYGR_RANKERS_SRV; the rankers
    themselves, for the cache handoff) dials each SRV target on the port of the headless Service's `grpc`
    records; otherwise the stub and the trigger dial their `router` target. The stub also dials its
    `trigger` target (relay on)."""
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    assert configs["router"].routes_directly and configs["router"].rankers_srv
    paths = set()
    assert configs["ranker"].routes_directly, "the rankers know their ring (RELAYGR_RANKERS_SRV)"
    for caller in ("router", "trigger", "retrieval-stub", "ranker"):
        config = configs[caller]
        if config.routes_directly:
            # _grpc._tcp.<service>.<namespace>.svc.cluster.local lists <service>'s port named grpc.
            labels = config.srv_name().split(".")
            assert labels[:2] == ["_grpc", "_tcp"], config.rankers_srv
            callee, service = serving(manifests, ".".join(labels[2:]))
            (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]
            paths.add((caller, callee, port))
        else:
            host, _, port = config.router.removeprefix("dns:///").rpartition(":")
            paths.add((caller, serving(manifests, host)[0], int(port)))
    stub = configs["retrieval-stub"]
    assert stub.relay
    host, _, port = stub.trigger.removeprefix("dns:///").rpartition(":")
    paths.add(("retrieval-stub", serving(manifests, host)[0], int(port)))
    return paths


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_fleets_own_paths_are_open_between_its_pods(overlay):
    assert open_paths(*fleet(f"overlays/{overlay}")) == FLEET_PATHS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_open_paths_are_exactly_those_the_services_settings_dial(overlay):
    """Direct routing as deployed: the trigger and the retrieval stub dial the rankers, not the router."""
    dialled = dialled_paths(overlay)
    assert dialled == open_paths(*fleet(f"overlays/{overlay}")) == FLEET_PATHS
    assert {("trigger", "ranker", 50051), ("retrieval-stub", "ranker", 50051)} <= dialled
    assert not {path for path in dialled if path[1] == "router"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_trigger_and_the_stub_reach_the_rankers_but_not_the_router(overlay):
    policies, pods, ports = fleet(f"overlays/{overlay}")
    assert ports["ranker"]["grpc"] == 50051 and ports["router"]["grpc"] == 50050
    for caller in ("trigger", "retrieval-stub", "router"):
        assert allowed(policies, pods[caller], pods["ranker"], 50051), caller
        # The ranker's other ports stay closed to them: metrics is Prometheus's, health the kubelet's.
        for port in (ports["ranker"]["metrics"], ports["ranker"]["health"]):
            assert not allowed(policies, pods[caller], pods["ranker"], port), (caller, port)
    for caller in ("trigger", "retrieval-stub"):
        assert not allowed(policies, pods[caller], pods["router"], 50050), caller


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_component_changes_the_fleets_paths(overlay, component):
    """TLS, tracing and autoscaling of routers, triggers or rankers leave the paths between the pods as
    they are (tracing adds egress to the collector only, test_tracing.py)."""
    assert open_paths(*fleet_of(composed(f"overlays/{overlay}", component))) == FLEET_PATHS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_reaches_every_metrics_port_and_nothing_else(overlay):
    policies, pods, ports = fleet(f"overlays/{overlay}")
    for name, pod in pods.items():
        assert allowed(policies, PROMETHEUS, pod, ports[name]["metrics"]), name
        assert not allowed(policies, PROMETHEUS, pod, ports[name]["grpc"]), name
        assert not allowed(policies, pod, PROMETHEUS, 9090), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_resolves_names_through_cluster_dns_only(overlay):
    policies, pods, _ = fleet(f"overlays/{overlay}")
    for name, pod in pods.items():
        assert allowed(policies, pod, KUBE_DNS, 53, "UDP") and allowed(policies, pod, KUBE_DNS, 53, "TCP"), (
            name
        )
        assert not allowed(policies, pod, KUBE_DNS, 443), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_strangers_neither_reach_nor_are_reached(overlay):
    policies, pods, ports = fleet(f"overlays/{overlay}")
    for name, pod in pods.items():
        for stranger in (NEIGHBOUR, OUTSIDER):
            for port in ports[name].values():
                assert not allowed(policies, stranger, pod, port), (stranger.name, name, port)
            assert not allowed(policies, pod, stranger, 50050), (name, stranger.name)


def test_the_ghz_job_reaches_the_router_and_the_retrieval_stub_only():
    fleet_policies, pods, ports = fleet("overlays/cpu")
    loadtest_policies, loadtest_pods, _ = fleet("loadtest")
    policies = fleet_policies + loadtest_policies
    ghz = loadtest_pods["ghz"]
    reachable = {
        (name, port)
        for name, pod in pods.items()
        for port in ports[name].values()
        if allowed(policies, ghz, pod, port)
    }
    assert reachable == {("router", 50050), ("retrieval-stub", 50053)}
    assert allowed(policies, ghz, KUBE_DNS, 53, "UDP")
    # Opening the router to ghz opens it to nothing else, the fleet's own pods included.
    for source in (NEIGHBOUR, pods["trigger"], pods["retrieval-stub"], pods["ranker"]):
        assert not allowed(policies, source, pods["router"], 50050), source.name
    assert open_paths(policies, pods, ports) == FLEET_PATHS
