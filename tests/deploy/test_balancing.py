"""Balancing and discovery as deployed, in every rendered overlay: the headless Services clients resolve,
the `dns:///` targets they dial with round_robin and a server connection age, the rankers' SRV records
that the router, the trigger and the retrieval stub (direct routing) discover members from with the same
ring settings, and the plaintext health-only port the probes use (and nothing else reaches)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from services.affinity.settings import AffinitySettings
from tests.deploy.configs import loaded_configs, workload_kind
from tests.deploy.manifests import NAMESPACE, OVERLAYS, Manifest, named, objects, of_kind, workloads
from tests.deploy.network_policy import Pod, allowed
from tests.deploy.pods import (
    container_ports,
    containers,
    environment,
    pod_labels,
    pod_name,
    pod_spec,
    selects,
)

DOMAIN = f"{NAMESPACE}.svc.cluster.local"
# workload -> its headless Service, whose records name its ready pods.
HEADLESS = {"ranker": "ranker-headless", "router": "router-headless", "trigger": "trigger-headless"}
PROMETHEUS = Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
# Every process that routes to the rankers, by workload; the trigger and the stub route directly.
ROUTING = ("router", "trigger", "retrieval-stub")


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> str:
    return request.param


def headless_service(manifests: list[Manifest], workload: str) -> Manifest:
    service = named(manifests, "Service", HEADLESS[workload])
    pods = pod_labels(named(manifests, workload_kind(workload), workload))
    assert selects({"matchLabels": service["spec"]["selector"]}, pods), workload
    return service


def grpc_port(service: Manifest) -> dict:
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    return port


def test_routers_triggers_and_rankers_have_headless_services_listing_only_ready_pods(overlay):
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    for workload in HEADLESS:
        service = headless_service(manifests, workload)
        assert service["spec"]["clusterIP"] == "None", workload
        assert service["spec"]["publishNotReadyAddresses"] is False, workload
        port = grpc_port(service)
        assert (port["port"], port["targetPort"], port["appProtocol"]) == (
            configs[workload].port,
            "grpc",
            "grpc",
        ), workload
    # ClusterIP Services stay for port-forward (ghz dials the routers' headless Service).
    for workload in ("router", "trigger", "retrieval-stub"):
        assert named(manifests, "Service", workload)["spec"].get("clusterIP") != "None", workload


def test_clients_dial_every_replica_by_dns_with_round_robin(overlay):
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    # The trigger and the stub route to the rankers themselves: no fleet pod dials the routers.
    dialled = {("retrieval-stub", "trigger"): configs["retrieval-stub"].trigger}
    for (caller, callee), target in dialled.items():
        service = headless_service(manifests, callee)
        expected = f"dns:///{service['metadata']['name']}.{DOMAIN}:{grpc_port(service)['port']}"
        assert target == expected, (caller, callee)
        assert configs[caller].lb_policy == "round_robin", caller
    # Every server sends long-lived connections away, so clients re-resolve and find new replicas; the
    # grace outlasts the longest call a caller makes (the stub's Rank deadline).
    for name, config in configs.items():
        assert config.max_connection_age_s > 0, name
        assert config.max_connection_age_grace_s * 1000 >= configs["retrieval-stub"].rank_timeout_ms, name


def test_outside_clients_such_as_the_ghz_job_dial_every_router_by_dns_with_round_robin(overlay):
    """The fleet's own pods no longer call the routers; their callers from outside it do, over long-lived
    gRPC connections that the ClusterIP Service would pin each to one router. The ghz Job, the in-cluster
    one, dials the routers' headless Service (one A record per ready router pod) by `dns:///` with ghz's
    round_robin strategy, in every config of it that calls the routers."""
    manifests = objects(f"overlays/{overlay}")
    service = headless_service(manifests, "router")  # selects the router pods
    assert service["spec"]["clusterIP"] == "None"
    target = f"dns:///{service['metadata']['name']}.{DOMAIN}:{grpc_port(service)['port']}"
    loadtest = objects("loadtest")
    (config_map,) = of_kind(loadtest, "ConfigMap")
    (container,) = containers(named(loadtest, "Job", "ghz"))
    mounted = {
        item["path"]: json.loads(config_map["data"][item["key"]])
        for volume in pod_spec(named(loadtest, "Job", "ghz"))["volumes"]
        for item in volume["configMap"]["items"]
        if "/" not in item["path"] and item["path"].endswith(".json")
    }
    to_routers = {path: c for path, c in mounted.items() if c["call"].startswith("relaygr.v1.RankerService.")}
    assert set(to_routers) == {"rank.json", "pre-infer.json"}
    for path, config in to_routers.items():
        assert (config["host"], config["lb-strategy"]) == (target, "round_robin"), path
    # The Job's own config is one of those it mounts; its network policy opens the router pods' port.
    assert container["args"][0].removeprefix("--config=deploy/loadtest/") in mounted
    router = named(manifests, "Deployment", "router")
    policies = of_kind(loadtest, "NetworkPolicy")
    ghz = Pod("ghz", NAMESPACE, pod_labels(named(loadtest, "Job", "ghz")))
    router_pod = Pod("router-0", NAMESPACE, pod_labels(router))
    assert allowed(policies, ghz, router_pod, container_ports(containers(router)[0])["grpc"])


def test_the_router_finds_rankers_by_the_srv_records_of_their_pods_stable_names(overlay):
    """Kubernetes answers `_grpc._tcp.<serviceName>.<namespace>.svc.<domain>` with one record per ready
    ranker whose target is `<pod>.<serviceName>.…`: the member is named by that first label, which must be
    the name the ranker reports (its --instance-name), and dialled by that name."""
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    ranker = named(manifests, "StatefulSet", "ranker")
    service = headless_service(manifests, "ranker")
    assert ranker["spec"]["serviceName"] == service["metadata"]["name"]
    assert configs["router"].srv_name() == f"_grpc._tcp.{service['metadata']['name']}.{DOMAIN}"
    assert grpc_port(service)["port"] == configs["ranker"].port
    (container,) = containers(ranker)
    assert environment(manifests, ranker, container)["RELAYGR_INSTANCE_NAME"] == pod_name(ranker)


def test_the_trigger_and_the_stub_route_directly_to_the_routers_rankers(overlay):
    """Direct routing: the trigger and the retrieval stub get the router's RELAYGR_RANKERS_SRV, so they
    route their own calls to the same members, and no router target (they would call it instead)."""
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    srv = f"_grpc._tcp.{headless_service(manifests, 'ranker')['metadata']['name']}.{DOMAIN}"
    envs = {}
    for name in ROUTING:
        workload = named(manifests, "Deployment", name)
        (container,) = containers(workload)
        envs[name] = environment(manifests, workload, container)
    assert envs["router"]["RELAYGR_RANKERS_SRV"] == srv
    for name in ("trigger", "retrieval-stub"):
        assert envs[name]["RELAYGR_RANKERS_SRV"] == envs["router"]["RELAYGR_RANKERS_SRV"] == srv, name
        assert "RELAYGR_RANKERS" not in envs[name] and "RELAYGR_ROUTER" not in envs[name], name
        config = configs[name]
        assert config.routes_directly and config.srv_name() == configs["router"].srv_name() == srv, name


def test_every_routing_process_places_users_with_the_same_ring_and_health_settings(overlay):
    """A user lands on the same ranker whoever places it, and a ranker leaves every ring alike, only if
    the router, the trigger and the stub agree on every routing setting: members, DNS refresh, virtual
    nodes, bounded load, policy, health checks and circuit."""
    configs = loaded_configs(overlay)
    # RELAYGR_RANKERS_SRV overrides --rankers (whose default differs between the router and the others).
    fields = [f.name for f in dataclasses.fields(AffinitySettings) if f.name != "rankers"]
    assert {"rankers_srv", "dns_refresh_s", "virtual_nodes", "load_factor", "routing_policy"} <= set(fields)
    assert all(configs[name].rankers_srv for name in ROUTING)
    settings = {name: {f: getattr(configs[name], f) for f in fields} for name in ROUTING}
    assert settings["trigger"] == settings["router"], overlay
    assert settings["retrieval-stub"] == settings["router"], overlay
    assert settings["router"]["routing_policy"] == "affinity"
    assert settings["router"]["dns_refresh_s"] == 5


def test_probes_use_the_plaintext_health_port_that_no_pod_can_reach(overlay):
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    policies = of_kind(manifests, "NetworkPolicy")
    pods = {
        w["metadata"]["name"]: Pod(w["metadata"]["name"], w["metadata"]["namespace"], pod_labels(w))
        for w in workloads(manifests)
    }
    for name, config in configs.items():
        (container,) = containers(named(manifests, workload_kind(name), name))
        ports = container_ports(container)
        assert config.health_port == ports["health"] not in (ports["grpc"], ports["metrics"]), name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == ports["health"], (name, probe)
        # Kubelet probes from the node, which policies always allow; the health port is plaintext, so
        # neither another pod nor Prometheus may open it.
        for source in [*pods.values(), PROMETHEUS]:
            assert not allowed(policies, source, pods[name], ports["health"]), (source.name, name)
