"""The tracing component (deploy/components/tracing) as rendered in overlays/cpu-tracing and composed with
every overlay: one ConfigMap gives all four workloads the collector's endpoint and the sample ratio, which
their own config loaders parse; one patch in an overlay (the one deploy/README.md documents) moves the whole
fleet to another collector; and the NetworkPolicies let every fleet pod, and only those, reach the
collector's OTLP/gRPC port wherever the endpoint points, while opening nothing else.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse

import pytest
import yaml

from services.common.config import ENV_PREFIX, env_name, load
from tests.deploy.compose import composed
from tests.deploy.configs import config_class
from tests.deploy.manifests import DEPLOY, NAMESPACE, OVERLAYS, objects, of_kind, render, workloads
from tests.deploy.network_policy import FLEET_PATHS, Pod, allowed, open_paths
from tests.deploy.pods import container_ports, containers, environment, pod_labels
from tests.deploy.validate import (
    unvalidated_kinds,
    yamllint_rendered,
)

TREE = "overlays/cpu-tracing"
FLEET = ("ranker", "router", "trigger", "retrieval-stub")
COMPONENT = DEPLOY / "components" / "tracing"
ENDPOINT, RATIO = "RELAYGR_OTLP_ENDPOINT", "RELAYGR_TRACE_SAMPLE_RATIO"
ANOTHER_COLLECTOR = "http://collector.telemetry.svc.cluster.local:4317"
NEIGHBOUR = Pod("neighbour", NAMESPACE, {"app.kubernetes.io/name": "neighbour"})
GHZ = Pod("ghz-x2k8q", NAMESPACE, {"app.kubernetes.io/name": "ghz", "app.kubernetes.io/part-of": "relaygr"})


def component_settings() -> dict[str, str]:
    """The component's tracing.env: its default endpoint and ratio."""
    settings = {}
    for line in (COMPONENT / "tracing.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key] = value
    assert settings.keys() == {ENDPOINT, RATIO}, settings
    return settings


def fleet_environments(manifests) -> dict[str, dict[str, str]]:
    """{workload: its container's environment as Kubernetes builds it}, for the four fleet workloads."""
    found = {}
    for workload in workloads(manifests):
        (container,) = containers(workload)
        found[workload["metadata"]["name"]] = environment(manifests, workload, container)
    assert set(found) == set(FLEET), set(found)
    return found


def fleet_configs(manifests) -> dict[str, object]:
    """{workload: its settings as its service's own config loader parses the rendered environment}."""
    configs = {}
    for workload in workloads(manifests):
        (container,) = containers(workload)
        module = container["command"][2]
        cls = config_class(module)
        env = environment(manifests, workload, container)
        unknown = {k for k in env if k.startswith(ENV_PREFIX)} - {
            env_name(f.name) for f in dataclasses.fields(cls)
        }
        assert not unknown, unknown
        configs[workload["metadata"]["name"]] = load(cls, [*container["command"][3:]], env)
    return configs


def collector_pod(endpoint: str) -> tuple[Pod, int]:
    """The pod an in-cluster endpoint (`http://<service>.<namespace>.svc…:<port>`) reaches, and its port."""
    url = urllib.parse.urlsplit(endpoint)
    service, namespace, *rest = url.hostname.split(".")
    assert rest[:1] == ["svc"], f"not an in-cluster Service name: {endpoint}"
    labels = {"app.kubernetes.io/name": "opentelemetry-collector", "app.kubernetes.io/instance": service}
    return Pod(f"{service}-7d9f8b6c5-q4w2e", namespace, labels), url.port


def fleet_pods(manifests) -> dict[str, Pod]:
    return {
        w["metadata"]["name"]: Pod(w["metadata"]["name"], NAMESPACE, pod_labels(w))
        for w in workloads(manifests)
    }


def readme_patches(heading: str, naming: str) -> list[dict]:
    """The overlay patches of the ```yaml block of deploy/README.md's `heading` section naming `naming`."""
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index(heading) + len(heading) :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL) if naming in b]
    assert len(blocks) == 1, f"deploy/README.md's {heading} has one ```yaml block naming {naming}"
    return yaml.safe_load(blocks[0])["patches"]


def endpoint_patch(endpoint: str) -> str:
    """The one setting, as deploy/README.md documents it, pointing at `endpoint`: the overlay's patches."""
    (patch,) = patches = readme_patches("## Traces", ENDPOINT)
    operations = yaml.safe_load(patch["patch"])
    (operation,) = operations
    assert operation["path"] == f"/data/{ENDPOINT}", operation
    operation["value"] = endpoint
    patch["patch"] = yaml.safe_dump(operations)
    return yaml.safe_dump(patches)


def test_tracing_overlay_passes_strict_validation_and_adds_one_config_map_and_one_policy(tmp_path):
    assert unvalidated_kinds(render(TREE), tmp_path) == {"PodMonitor", "PrometheusRule"}
    lint = yamllint_rendered(TREE)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    plain = {(m["kind"], m["metadata"]["name"]) for m in objects("overlays/cpu")}
    added = {(m["kind"], m["metadata"]["name"]) for m in objects(TREE)} - plain
    assert {(kind, re.sub(r"-[a-z0-9]{10}$", "", name)) for kind, name in added} == {
        ("ConfigMap", "tracing-env"),
        ("NetworkPolicy", "allow-otlp-egress"),
    }


def test_tracing_is_off_without_the_component():
    for overlay in OVERLAYS:
        for name, config in fleet_configs(objects(f"overlays/{overlay}")).items():
            assert config.otlp_endpoint == "", (overlay, name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_exports_to_the_one_endpoint_at_the_one_ratio(overlay):
    settings = component_settings()
    manifests = composed(f"overlays/{overlay}", "tracing")
    for name, env in fleet_environments(manifests).items():
        assert {key: env[key] for key in settings} == settings, name
    for name, config in fleet_configs(manifests).items():
        assert config.otlp_endpoint == settings[ENDPOINT], name
        assert config.trace_sample_ratio == float(settings[RATIO]) == 0.01, name
    # One ConfigMap carries them, read by every workload after its own: nothing else sets them.
    carriers = [m for m in of_kind(manifests, "ConfigMap") if ENDPOINT in m.get("data", {})]
    assert [m["metadata"]["name"].rpartition("-")[0] for m in carriers] == ["tracing-env"]
    for workload in workloads(manifests):
        (container,) = containers(workload)
        assert container["envFrom"][-1] == {"configMapRef": {"name": carriers[0]["metadata"]["name"]}}


def test_the_example_overlay_sets_the_components_endpoint():
    settings = component_settings()
    for name, env in fleet_environments(objects(TREE)).items():
        assert {key: env[key] for key in settings} == settings, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_patch_moves_the_whole_fleet_to_another_collector(overlay):
    default = composed(f"overlays/{overlay}", "tracing")
    moved = composed(f"overlays/{overlay}", "tracing", patches=endpoint_patch(ANOTHER_COLLECTOR))
    for name, config in fleet_configs(moved).items():
        assert config.otlp_endpoint == ANOTHER_COLLECTOR, name
        assert config.trace_sample_ratio == float(component_settings()[RATIO]), name
    # The ConfigMap's name hash changes with its content, so the change rolls every workload's pods.
    (before,) = [m["metadata"]["name"] for m in of_kind(default, "ConfigMap") if ENDPOINT in m["data"]]
    (after,) = [m["metadata"]["name"] for m in of_kind(moved, "ConfigMap") if ENDPOINT in m["data"]]
    assert before != after
    for workload in workloads(moved):
        assert containers(workload)[0]["envFrom"][-1]["configMapRef"]["name"] == after


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("endpoint", [None, ANOTHER_COLLECTOR])
def test_every_fleet_pod_reaches_the_collector_and_nothing_more_opens(overlay, endpoint):
    patches = endpoint_patch(endpoint) if endpoint else ""
    manifests = composed(f"overlays/{overlay}", "tracing", patches=patches)
    policies = of_kind(manifests, "NetworkPolicy")
    pods = fleet_pods(manifests)
    collector, port = collector_pod(endpoint or component_settings()[ENDPOINT])
    assert port == 4317
    for name, pod in pods.items():
        assert allowed(policies, pod, collector, port), name
        # Only the OTLP/gRPC port, only outbound.
        assert not allowed(policies, pod, collector, 4318), name
        assert not allowed(policies, pod, collector, 9090), name
        for own_port in container_ports(containers(named_workload(manifests, name))[0]).values():
            assert not allowed(policies, collector, pod, own_port), name
    # Between the fleet's pods, the same paths as without tracing.
    ports = {name: container_ports(containers(named_workload(manifests, name))[0]) for name in pods}
    assert open_paths(policies, pods, ports) == FLEET_PATHS
    # Other pods of the namespace (the ghz Job, a neighbour) gain nothing.
    assert not allowed(policies, NEIGHBOUR, collector, port)
    assert not allowed(policies + of_kind(objects("loadtest"), "NetworkPolicy"), GHZ, collector, port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_the_component_no_fleet_pod_reaches_a_collector(overlay):
    manifests = objects(f"overlays/{overlay}")
    policies = of_kind(manifests, "NetworkPolicy")
    collector, port = collector_pod(component_settings()[ENDPOINT])
    for name, pod in fleet_pods(manifests).items():
        assert not allowed(policies, pod, collector, port), name


def test_the_documented_policy_patch_admits_the_collectors_namespace_only():
    patches = readme_patches("## Traces", "allow-otlp-egress")
    manifests = composed(TREE, patches=yaml.safe_dump(patches))
    policies = of_kind(manifests, "NetworkPolicy")
    collector, port = collector_pod(component_settings()[ENDPOINT])
    elsewhere = Pod("collector-0", "default", collector.labels)
    for name, pod in fleet_pods(manifests).items():
        assert allowed(policies, pod, collector, port), name
        assert not allowed(policies, pod, elsewhere, port), name


def named_workload(manifests, name: str) -> dict:
    (workload,) = [w for w in workloads(manifests) if w["metadata"]["name"] == name]
    return workload
