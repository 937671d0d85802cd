"""Every container's environment, as Kubernetes would build it, parses with its service's own config
loader, and the settings agree with the manifests and with each other: ports, probes, the addresses a
service dials, drain timing, the trigger's budgets against the rankers' HBM, memory against the tiers."""

from __future__ import annotations

import pytest
import yaml

from services.common.cpus import budget_of
from tests.deploy.configs import loaded_configs, workload_kind
from tests.deploy.manifests import DEPLOY, NAMESPACE, OVERLAYS, named, objects, workloads
from tests.deploy.pods import container_ports, containers, pod_spec, quantity

MIB = 2**20
NODE_CORES = 64  # a node with more cores than any pod's limit
EXPECTED_DEVICE = {
    "cpu": ("cpu-small", "cpu"),
    "nvidia": ("gpu-dlrmv3", "cuda"),
    "nvidia-shared": ("gpu-dlrmv3", "cuda"),
    "ascend": ("gpu-dlrmv3", "npu"),
}


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> str:
    return request.param


def test_every_container_environment_parses_with_its_services_config_loader(overlay):
    configs = {name: type(config).__name__ for name, config in loaded_configs(overlay).items()}
    assert configs == {
        "ranker": "RankerConfig",
        "router": "RouterConfig",
        "trigger": "TriggerConfig",
        "retrieval-stub": "RetrievalStubConfig",
    }


def test_every_service_listens_where_its_pod_and_probes_say(overlay):
    manifests = objects(f"overlays/{overlay}")
    for name, config in loaded_configs(overlay).items():
        (container,) = containers(named(manifests, workload_kind(name), name))
        ports = container_ports(container)
        assert config.host == "0.0.0.0", name
        assert (config.port, config.metrics_port) == (ports["grpc"], ports["metrics"]), name
        assert config.health_port == ports["health"] not in (config.port, config.metrics_port), name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == config.health_port, (name, probe)


def test_every_address_a_service_dials_is_a_fleet_service_port(overlay):
    """Clients dial `dns:///<headless Service>.<namespace>.svc.cluster.local:<port>`; the router, the
    trigger and the retrieval stub find the rankers by the SRV records of their headless Service's `grpc`
    port (direct routing for the latter two; test_balancing.py says more)."""
    manifests = objects(f"overlays/{overlay}")
    configs = loaded_configs(overlay)
    targets = {"retrieval-stub": [configs["retrieval-stub"].trigger]}
    suffix = f".{NAMESPACE}.svc.cluster.local"
    for caller, addresses in targets.items():
        for address in addresses:
            host, _, port = address.removeprefix("dns:///").rpartition(":")
            assert address.startswith("dns:///") and host.endswith(suffix), (caller, address)
            service = named(manifests, "Service", host.removesuffix(suffix))
            assert int(port) in {p["port"] for p in service["spec"]["ports"]}, (caller, address)
    ranker = named(manifests, "StatefulSet", "ranker")
    for name in ("router", "trigger", "retrieval-stub"):
        assert configs[name].srv_name() == f"_grpc._tcp.{ranker['spec']['serviceName']}{suffix}", name
    headless = named(manifests, "Service", ranker["spec"]["serviceName"])
    (grpc_port,) = [p["port"] for p in headless["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc_port == configs["ranker"].port


def test_rankers_run_the_overlays_model_on_its_device(overlay):
    ranker = loaded_configs(overlay)["ranker"]
    assert (ranker.model_preset, ranker.device) == EXPECTED_DEVICE[overlay]
    assert ranker.hbm_budget_mb > 0 and ranker.dram_budget_mb > 0


def test_ranker_torch_threads_agree_with_its_cpu_request(overlay):
    """The intra-op threads a ranker runs in its pod (--torch-threads where the overlay sets it, else the
    CPUs its cgroup quota, limits.cpu, pays for on a node of many cores) are the CPUs it requests: torch's
    own default, one per node core, would contend under the quota."""
    manifests = objects(f"overlays/{overlay}")
    (container,) = containers(named(manifests, "StatefulSet", "ranker"))
    resources = container["resources"]
    in_pod = budget_of(NODE_CORES, (quantity(resources["limits"]["cpu"]), "cgroup_v2")).cpus
    threads = loaded_configs(overlay)["ranker"].torch_threads or in_pod
    assert threads == quantity(resources["requests"]["cpu"]) <= in_pod


def test_every_drain_fits_the_termination_grace(overlay):
    """A ranker's preStop starts its drain at deletion (SIGTERM to PID 1, the ranker itself: no shared
    process namespace), so that its cache handoff runs while the routers move its users: the drain and the
    handoff, then the in-flight calls' grace, fit the termination grace period. The other services' preStop
    sleeps until their callers have noticed, then SIGTERM drains for drain_grace_s."""
    manifests = objects(f"overlays/{overlay}")
    for name, config in loaded_configs(overlay).items():
        workload = named(manifests, workload_kind(name), name)
        (container,) = containers(workload)
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        grace = pod_spec(workload)["terminationGracePeriodSeconds"]
        if name == "ranker":
            assert command == ["sh", "-c", "kill -TERM 1"] and not pod_spec(workload).get(
                "shareProcessNamespace"
            )
            drain_s = max(config.drain_min_s, config.drain_grace_s / 2)  # it waits on leases at most this
            assert drain_s > config.lease_ttl_ms / 1000
            assert grace >= max(drain_s, config.handoff_budget_s) + config.drain_grace_s, name
        else:
            assert command[0] == "sleep" and grace >= int(command[1]) + config.drain_grace_s, name


def test_trigger_budgets_fit_the_fleet(overlay):
    """A prefix counts as a duplicate for as long as the rankers lease it, and the trigger's HBM brake is a
    share of each ranker's budget as that ranker measures its leased bytes (every trigger replica's
    admissions included), so replicas share one bound that fits in the tier."""
    configs = loaded_configs(overlay)
    ranker, trigger = configs["ranker"], configs["trigger"]
    assert trigger.lease_window_ms == ranker.lease_ttl_ms
    assert 0 < trigger.hbm_lease_fraction <= 1


def test_ranker_memory_holds_its_host_memory_tiers(overlay):
    """DRAM is host memory; so is the HBM tier of a CPU ranker. A GiB stays for the model and runtime."""
    manifests = objects(f"overlays/{overlay}")
    ranker = loaded_configs(overlay)["ranker"]
    (container,) = containers(named(manifests, "StatefulSet", "ranker"))
    host_tiers_mb = ranker.dram_budget_mb + (ranker.hbm_budget_mb if ranker.device == "cpu" else 0)
    assert quantity(container["resources"]["limits"]["memory"]) >= (host_tiers_mb + 1024) * MIB


def test_trigger_slo_matches_the_alerting_rules(overlay):
    rules = yaml.safe_load((DEPLOY / "monitoring" / "rules.yaml").read_text())
    exprs = {r.get("alert") or r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    slo_s = float(exprs["RelayGRRankP99OverSLO"].rpartition(">")[2])
    assert loaded_configs(overlay)["trigger"].slo_ms == slo_s * 1000
    assert f'le="{slo_s:g}"' in exprs["relaygr:rank_slo_compliance:ratio_rate5m"]


def test_services_do_not_receive_kubernetes_service_links(overlay):
    # Service links inject variables such as ROUTER_PORT=tcp://…; harmless to RELAYGR_* parsing, but
    # they change with every Service in the namespace, so they are off.
    for workload in workloads(objects(f"overlays/{overlay}")):
        assert pod_spec(workload)["enableServiceLinks"] is False
