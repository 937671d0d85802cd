"""The NetworkPolicies allow the fleet's own paths and nothing else, evaluated over every pair of pods
and every port they expose, plus Prometheus, cluster DNS and strangers inside and outside the namespace."""

from __future__ import annotations

import itertools

import pytest

from tests.deploy.manifests import (
    NAMESPACE,
    OVERLAYS,
    container_ports,
    containers,
    objects,
    of_kind,
    pod_labels,
    workloads,
)
from tests.deploy.network_policy import Pod, allowed

FLEET_PATHS = {
    ("retrieval-stub", "trigger", 50052),
    ("retrieval-stub", "router", 50050),
    ("trigger", "router", 50050),
    ("router", "ranker", 50051),
}
PROMETHEUS = Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
KUBE_DNS = Pod("coredns-1", "kube-system", {"k8s-app": "kube-dns"})
NEIGHBOUR = Pod("neighbour", NAMESPACE, {"app.kubernetes.io/name": "neighbour"})
OUTSIDER = Pod("outsider", "default", {"app.kubernetes.io/name": "router"})  # a lookalike elsewhere


def fleet(tree: str) -> tuple[list[dict], dict[str, Pod], dict[str, dict[str, int]]]:
    """The tree's policies, its pods by workload name, and each pod's named ports."""
    manifests = objects(tree)
    pods, ports = {}, {}
    for workload in workloads(manifests):
        name = workload["metadata"]["name"]
        pods[name] = Pod(name, workload["metadata"]["namespace"], pod_labels(workload))
        ports[name] = {k: v for c in containers(workload) for k, v in container_ports(c).items()}
    return of_kind(manifests, "NetworkPolicy"), pods, ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_fleets_own_paths_are_open_between_its_pods(overlay):
    policies, pods, ports = fleet(f"overlays/{overlay}")
    open_paths = {
        (source, destination, port)
        for source, destination in itertools.permutations(pods, 2)
        for port in ports[destination].values()
        if allowed(policies, pods[source], pods[destination], port)
    }
    assert open_paths == FLEET_PATHS


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
    # Opening the router to ghz opens it to nothing else.
    assert not allowed(policies, NEIGHBOUR, pods["router"], 50050)
