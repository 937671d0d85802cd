"""Every overlay renders, validates strictly against the Kubernetes schemas, and has the properties a
platform team expects of a well-run service: gRPC health probes, security, resources, PDBs, Services,
monitoring objects and the dashboards as ConfigMaps (drain timing and settings: test_service_config).

kubernetes-validate knows only the core kinds: it reports the prometheus-operator kinds (PodMonitor,
PrometheusRule) as "schema not found" and passes them. The test accepts exactly those two as unknown,
so a core kind can never slip through unvalidated, and checks their structure itself below.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.deploy.configs import loaded_configs
from tests.deploy.manifests import (
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    REPO_ROOT,
    named,
    objects,
    of_kind,
    render,
    workloads,
)
from tests.deploy.pods import container_ports, containers, pod_labels, pod_spec, quantity, selects
from tests.deploy.validate import (
    KUBERNETES_VERSIONS,
    kubernetes_validate,
    unvalidated_kinds,
    yamllint_rendered,
)

CRD_KINDS = {"PodMonitor", "PrometheusRule"}
# The oldest Kubernetes with GA gRPC probes, and the newest schemas kubernetes-validate has.
FLEET = {"ranker", "router", "trigger", "retrieval-stub"}
HEALTH_SERVICE = {
    "ranker": "relaygr.v1.RankerService",
    "router": "relaygr.v1.RankerService",  # the router serves the rankers' API
    "trigger": "relaygr.v1.TriggerService",
    "retrieval-stub": "relaygr.v1.RecommendService",
}
# (ClusterIP, headless) Services of each workload: the rankers are reached by their pods' names only,
# the retrieval stub by no fleet client.
SERVICES = {"ranker": (0, 1), "router": (1, 1), "trigger": (1, 1), "retrieval-stub": (1, 0)}
CONFIG_MAP_LIMIT_BYTES = 1024 * 1024
TREES = [*(f"overlays/{overlay}" for overlay in OVERLAYS), "loadtest"]


def fleet_workloads(tree: str) -> dict[str, dict]:
    return {w["metadata"]["name"]: w for w in workloads(objects(tree)) if w["metadata"]["name"] in FLEET}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_fleet_in_its_namespace(overlay):
    manifests = objects(f"overlays/{overlay}")
    assert set(fleet_workloads(f"overlays/{overlay}")) == FLEET
    assert named(manifests, "StatefulSet", "ranker")
    namespaced = [m for m in manifests if m["kind"] != "Namespace"]
    assert {m["metadata"]["namespace"] for m in namespaced} == {NAMESPACE}
    assert all(m["metadata"]["labels"]["app.kubernetes.io/part-of"] == "relaygr" for m in manifests)


@pytest.mark.parametrize("tree", TREES)
def test_core_kinds_pass_strict_schema_validation(tree, tmp_path):
    skipped = unvalidated_kinds(render(tree), tmp_path)
    kinds = {m["kind"] for m in objects(tree)}
    assert skipped == kinds & CRD_KINDS, f"unvalidated kinds: {skipped}"


def test_strict_validation_rejects_an_unknown_field(tmp_path):
    deployment = named(objects("overlays/cpu"), "Deployment", "router")
    containers(deployment)[0]["readinessProbes"] = containers(deployment)[0]["readinessProbe"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(deployment))
    done = kubernetes_validate(broken, KUBERNETES_VERSIONS[-1])
    assert done.returncode != 0 and "readinessProbes" in done.stdout


def test_yaml_sources_pass_yamllint():
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "."], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("tree", TREES)
def test_rendered_manifests_pass_yamllint(tree):
    done = yamllint_rendered(tree)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("tree", TREES)
def test_every_pod_runs_non_root_read_only_without_privileges(tree):
    for workload in workloads(objects(tree)):
        name, spec = workload["metadata"]["name"], pod_spec(workload)
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        scratch = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in containers(workload):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            assert not security.get("privileged", False), name
            if container["image"].startswith("relaygr:"):  # Python and torch write temporary files
                mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
                assert mounts.get("/tmp") in scratch, f"{name}: /tmp must be a writable emptyDir"


@pytest.mark.parametrize("tree", TREES)
def test_every_container_has_requests_within_limits(tree):
    for workload in workloads(objects(tree)):
        for container in containers(workload):
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert {"cpu", "memory"} <= requests.keys() <= limits.keys(), workload["metadata"]["name"]
            for resource, limit in limits.items():
                assert quantity(requests.get(resource, limit)) <= quantity(limit), (workload, resource)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_native_grpc_health_of_the_named_service(overlay):
    """On the plaintext health-only port, which works when the gRPC port requires mutual TLS."""
    for name, workload in fleet_workloads(f"overlays/{overlay}").items():
        (container,) = containers(workload)
        health_port = container_ports(container)["health"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": health_port, "service": HEALTH_SERVICE[name]}, (
                name,
                probe,
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned(overlay):
    for workload in workloads(objects(f"overlays/{overlay}")):
        for container in containers(workload):
            image, _, tag = container["image"].rpartition(":")
            assert image and tag and tag != "latest", container["image"]
            if workload["metadata"]["name"] in FLEET:
                assert tag.startswith("0.1.0-"), container["image"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicated_workloads_have_a_disruption_budget_that_allows_one_eviction(overlay):
    manifests = objects(f"overlays/{overlay}")
    budgets = of_kind(manifests, "PodDisruptionBudget")
    for name, workload in fleet_workloads(f"overlays/{overlay}").items():
        replicas = workload["spec"]["replicas"]
        covering = [b for b in budgets if selects(b["spec"]["selector"], pod_labels(workload))]
        if replicas == 1:
            assert not covering, f"{name}: a single replica's PDB could only block drains or allow all"
            continue
        assert len(covering) == 1, name
        spec = covering[0]["spec"]
        available = spec["minAvailable"] if "minAvailable" in spec else replicas - spec["maxUnavailable"]
        assert 1 <= available < replicas, f"{name}: keeps {available} of {replicas} available"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_expose_named_ports_and_rankers_are_headless(overlay):
    manifests = objects(f"overlays/{overlay}")
    for name, workload in fleet_workloads(f"overlays/{overlay}").items():
        (container,) = containers(workload)
        services = [
            service
            for service in of_kind(manifests, "Service")
            if selects({"matchLabels": service["spec"]["selector"]}, pod_labels(workload))
        ]
        # A ClusterIP Service (port-forward, ghz) and a headless one whose pod records clients dial.
        headless_count = sum(service["spec"].get("clusterIP") == "None" for service in services)
        assert (len(services) - headless_count, headless_count) == SERVICES[name], name
        assert container_ports(container).keys() == {"grpc", "metrics", "health"}, name
        for service in services:
            ports = {p["name"]: p for p in service["spec"]["ports"]}
            assert "grpc" in ports and ports.keys() <= {"grpc", "metrics"}, name  # no Service for health
            assert all(p["targetPort"] == port_name for port_name, p in ports.items()), name
            assert ports["grpc"]["appProtocol"] == "grpc", name
        assert any(p["name"] == "metrics" for service in services for p in service["spec"]["ports"]), name
    ranker = named(manifests, "StatefulSet", "ranker")
    headless = named(manifests, "Service", ranker["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitor_scrapes_the_metrics_port_of_every_fleet_pod(overlay):
    manifests = objects(f"overlays/{overlay}")
    (monitor,) = of_kind(manifests, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    selected = [w for w in workloads(manifests) if selects(spec["selector"], pod_labels(w))]
    assert {w["metadata"]["name"] for w in selected} == FLEET
    for workload in selected:
        # The job label of every series is the pod's name label: the dashboards select on it.
        assert pod_labels(workload)[spec["jobLabel"]] == workload["metadata"]["name"]
        for endpoint in spec["podMetricsEndpoints"]:
            assert endpoint["port"] in container_ports(containers(workload)[0])
            assert re.fullmatch(r"\d+s", endpoint["interval"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_carries_the_rule_file(overlay):
    (rule,) = of_kind(objects(f"overlays/{overlay}"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules_file = yaml.safe_load((DEPLOY / "monitoring" / "rules.yaml").read_text())
    assert rule["spec"] == {"groups": rules_file["groups"]}
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for entry in group["rules"]:
            assert ("record" in entry) != ("alert" in entry) and entry["expr"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dashboards_ship_as_labelled_config_maps(overlay):
    config_maps = [
        c
        for c in of_kind(objects(f"overlays/{overlay}"), "ConfigMap")
        if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    shipped = {key: text for c in config_maps for key, text in c["data"].items()}
    committed = {p.name: p.read_text() for p in (DEPLOY / "dashboards").glob("*.json")}
    assert shipped == committed and len(committed) == 3
    for config_map in config_maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        (board,) = (json.loads(text) for text in config_map["data"].values())
        assert config_map["metadata"]["name"] == board["uid"].replace("relaygr-", "relaygr-dashboard-", 1)


@pytest.mark.parametrize("tree", TREES)
def test_config_maps_fit_in_etcd(tree):
    for config_map in of_kind(objects(tree), "ConfigMap"):
        size = sum(len(v) for section in ("data", "binaryData") for v in config_map.get(section, {}).values())
        assert size < CONFIG_MAP_LIMIT_BYTES, config_map["metadata"]["name"]


def test_namespace_enforces_the_restricted_pod_security_standard():
    namespace = named(objects("overlays/cpu"), "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize(
    ("overlay", "resource"),
    [
        ("cpu", None),
        ("nvidia", "nvidia.com/gpu"),
        ("nvidia-shared", "nvidia.com/gpu"),  # one time-sliced replica of a GPU
        ("ascend", "huawei.com/Ascend910"),
    ],
)
def test_accelerator_overlays_give_each_ranker_one_device(overlay, resource):
    manifests = objects(f"overlays/{overlay}")
    ranker = named(manifests, "StatefulSet", "ranker")
    (container,) = containers(ranker)
    extended = {k: v for k, v in container["resources"]["limits"].items() if "/" in k}
    assert extended == ({resource: 1} if resource else {})
    spec = pod_spec(ranker)
    if resource:
        assert spec["nodeSelector"] and any(t["key"] == resource for t in spec["tolerations"])
        assert container["image"].endswith({"nvidia": "-cuda", "ascend": "-ascend"}[overlay.split("-")[0]])
    for name in FLEET - {"ranker"}:
        others = containers(fleet_workloads(f"overlays/{overlay}")[name])
        assert not any("/" in k for c in others for k in c["resources"]["limits"]), name


def test_rankers_sharing_a_gpu_hold_together_what_one_ranker_of_a_gpu_holds():
    """`nvidia-shared`: K ranker pods to a GPU, as many as the device plugin's time-slicing makes of each
    GPU and the nodes they are scheduled on advertise; their tiers and memory add up to one `nvidia`
    ranker's, and the ranker knows K (its auto budgets are 1/K)."""
    shared, whole = (loaded_configs(overlay)["ranker"] for overlay in ("nvidia-shared", "nvidia"))
    plugin = yaml.safe_load((DEPLOY / "overlays/nvidia-shared/time-slicing.yaml").read_text())
    (sliced,) = yaml.safe_load(plugin["data"]["relaygr-rankers"])["sharing"]["timeSlicing"]["resources"]
    ranker = named(objects("overlays/nvidia-shared"), "StatefulSet", "ranker")
    k = shared.device_sharers
    assert k > 1 and sliced == {"name": "nvidia.com/gpu", "replicas": k}
    assert pod_spec(ranker)["nodeSelector"]["nvidia.com/gpu.replicas"] == str(k)
    assert ranker["spec"]["replicas"] % k == 0  # whole GPUs' worth of members
    assert (
        k * shared.hbm_budget_mb == whole.hbm_budget_mb and k * shared.dram_budget_mb == whole.dram_budget_mb
    )
    (one,) = containers(named(objects("overlays/nvidia"), "StatefulSet", "ranker"))
    (each,) = containers(ranker)
    for bound in ("requests", "limits"):  # each its own host CPUs: one process per ranker is the point
        assert k * quantity(each["resources"][bound]["memory"]) == quantity(one["resources"][bound]["memory"])
