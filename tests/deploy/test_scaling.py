"""Scaling: the autoscaling component (HPAs for routers and triggers on CPU) and the keda component (a
ScaledObject for the rankers on their exported queue metric), composed with every overlay; and what a
ranker scale step costs, measured on the real hash ring as deployed (the router's, which the trigger and the
retrieval stub share, test_balancing.py): the share of users whose ranker changes, which
deploy/README.md's "Scaling" section states.

kubernetes-validate validates the HPAs (autoscaling/v2 is a core kind) and, through a synthetic HPA, the
scaling behavior the ScaledObject hands KEDA's HPA; the ScaledObject's own fields are checked against
KEDA's ScaledObject and Prometheus scaler specifications here, as no schema exists for them.
"""

from __future__ import annotations

import re

import pytest
import yaml
from prometheus_client import metrics as prometheus_metrics

from services.affinity.ring import AffinityRing
from services.ranker import metrics as ranker_metrics
from tests.deploy.compose import composed, render_composed
from tests.deploy.configs import loaded_configs
from tests.deploy.manifests import DEPLOY, NAMESPACE, OVERLAYS, named, objects, of_kind, workloads
from tests.deploy.pods import containers, environment, pod_labels, quantity, selects
from tests.deploy.validate import unvalidated_kinds

HPA_TARGETS = {"router", "trigger"}
# KEDA's ScaledObject (keda.sh/v1alpha1) and Prometheus scaler specifications.
SCALED_OBJECT_FIELDS = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
    "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
}  # fmt: skip
SCALE_TARGET_FIELDS = {"apiVersion", "kind", "name", "envSourceContainerName"}
ADVANCED_FIELDS = {"restoreToOriginalReplicaCount", "horizontalPodAutoscalerConfig", "scalingModifiers"}
TRIGGER_FIELDS = {"type", "metadata", "name", "useCachedMetrics", "authenticationRef", "metricType"}
PROMETHEUS_METADATA = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
    "customHeaders", "ignoreNullValues", "unsafeSsl", "authModes",
}  # fmt: skip
# User ids as the retrieval stub and the ghz data name them (tools/ghz_data.py).
USERS = [f"user-{i:05d}" for i in range(10_000)]


def validate_strictly(tmp_path, documents: list[dict]) -> None:
    assert unvalidated_kinds(yaml.safe_dump_all(documents), tmp_path) == set()


# --- HorizontalPodAutoscalers for routers and triggers ---------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpas_scale_the_stateless_deployments_on_cpu_and_own_their_replicas(overlay, tmp_path):
    manifests = composed(f"overlays/{overlay}", "autoscaling")
    hpas = of_kind(manifests, "HorizontalPodAutoscaler")
    validate_strictly(tmp_path, hpas)
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == HPA_TARGETS
    budgets = of_kind(manifests, "PodDisruptionBudget")
    for hpa in hpas:
        spec, target = hpa["spec"], hpa["spec"]["scaleTargetRef"]
        assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["namespace"] == NAMESPACE
        assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
        deployment = named(manifests, "Deployment", target["name"])
        assert deployment["metadata"]["namespace"] == NAMESPACE
        # Without spec.replicas, `kubectl apply` leaves the count to the HPA.
        assert "replicas" not in deployment["spec"], target["name"]
        (metric,) = spec["metrics"]
        assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"]["type"] == "Utilization"
        assert 0 < metric["resource"]["target"]["averageUtilization"] < 100
        # Utilization is a share of the CPU request: every container of the target must request CPU.
        for container in containers(deployment):
            assert quantity(container["resources"]["requests"]["cpu"]) > 0, target["name"]
        # At the minimum, the disruption budget still lets one pod drain.
        (budget,) = [b for b in budgets if selects(b["spec"]["selector"], pod_labels(deployment))]
        assert budget["spec"]["minAvailable"] < spec["minReplicas"] < spec["maxReplicas"]
        down = spec["behavior"]["scaleDown"]
        assert down["stabilizationWindowSeconds"] >= 60 and down["policies"] == [
            {"type": "Pods", "value": 1, "periodSeconds": 60}
        ]


def test_autoscaling_leaves_the_rankers_and_the_retrieval_stub_alone():
    plain = {w["metadata"]["name"]: w for w in workloads(objects("overlays/cpu"))}
    scaled = {w["metadata"]["name"]: w for w in workloads(composed("overlays/cpu", "autoscaling"))}
    for name in plain.keys() - HPA_TARGETS:
        assert scaled[name] == plain[name], name
    # Only the replica count goes: the router's pods are the same, the trigger's differ only in the
    # ConfigMap that tells them the most replicas there may be (test below).
    assert scaled["router"]["spec"]["template"] == plain["router"]["spec"]["template"]
    for name in HPA_TARGETS:
        assert plain[name]["spec"]["replicas"] >= 2


def trigger_replicas_setting(manifests: list) -> int:
    trigger = named(manifests, "Deployment", "trigger")
    (container,) = containers(trigger)
    return int(environment(manifests, trigger, container)["RELAYGR_REPLICAS"])


def test_each_trigger_knows_the_most_replicas_that_split_a_rankers_lease_share():
    """A trigger keeps its admissions within 1/RELAYGR_REPLICAS of a ranker's HBM lease share: that must
    be the Deployment's replica count, or under the autoscaler its maximum, or the replicas together
    lease more than one share."""
    for overlay in OVERLAYS:
        plain = objects(f"overlays/{overlay}")
        replicas = named(plain, "Deployment", "trigger")["spec"]["replicas"]
        assert trigger_replicas_setting(plain) == replicas == 2, overlay
        scaled = composed(f"overlays/{overlay}", "autoscaling")
        hpa = next(
            h
            for h in of_kind(scaled, "HorizontalPodAutoscaler")
            if h["spec"]["scaleTargetRef"]["name"] == "trigger"
        )
        assert trigger_replicas_setting(scaled) == hpa["spec"]["maxReplicas"] == 6, overlay


# --- KEDA ScaledObject for the rankers --------------------------------------------------------------------


def ranker_gauges() -> set[str]:
    """The names of the gauges services/ranker/metrics.py exports."""
    return {
        family.name
        for value in vars(ranker_metrics).values()
        if isinstance(value, prometheus_metrics.MetricWrapperBase)
        for family in value.describe()
        if family.type == "gauge"
    }


def scaled_object(overlay: str = "cpu") -> dict:
    (found,) = of_kind(composed(f"overlays/{overlay}", "keda"), "ScaledObject")
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scaled_object_targets_the_ranker_statefulset_which_leaves_it_the_replicas(overlay):
    manifests = composed(f"overlays/{overlay}", "keda")
    (scaled,) = of_kind(manifests, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["metadata"]["namespace"] == NAMESPACE
    target = scaled["spec"]["scaleTargetRef"]
    assert target.keys() <= SCALE_TARGET_FIELDS
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "StatefulSet")
    ranker = named(manifests, "StatefulSet", target["name"])
    assert ranker["metadata"]["namespace"] == NAMESPACE and "replicas" not in ranker["spec"]
    # The routers and triggers keep theirs: only the autoscaling component hands those over.
    assert all("replicas" in named(manifests, "Deployment", name)["spec"] for name in HPA_TARGETS)


def test_the_scaled_object_uses_only_fields_keda_knows(tmp_path):
    spec = scaled_object()["spec"]
    assert spec.keys() <= SCALED_OBJECT_FIELDS
    assert spec["advanced"].keys() <= ADVANCED_FIELDS
    assert spec["advanced"]["horizontalPodAutoscalerConfig"].keys() <= {"name", "behavior"}
    # KEDA copies the behavior into the HPA it creates: validate it as part of an autoscaling/v2 HPA.
    validate_strictly(
        tmp_path,
        [
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "keda-hpa-ranker", "namespace": NAMESPACE},
                "spec": {
                    "scaleTargetRef": spec["scaleTargetRef"],
                    "minReplicas": spec["minReplicaCount"],
                    "maxReplicas": spec["maxReplicaCount"],
                    "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
                },
            }
        ],
    )
    (trigger,) = spec["triggers"]
    assert trigger.keys() <= TRIGGER_FIELDS and trigger["type"] == "prometheus"
    assert trigger["metricType"] in {"AverageValue", "Value"}
    metadata = trigger["metadata"]
    # Trigger metadata is a map of strings.
    assert metadata.keys() <= PROMETHEUS_METADATA and all(isinstance(v, str) for v in metadata.values())
    assert {"serverAddress", "query", "threshold"} <= metadata.keys()
    assert re.fullmatch(r"https?://[a-z0-9.-]+(:\d+)?", metadata["serverAddress"])
    assert metadata["ignoreNullValues"] == "false", (
        "a lost scrape must read as an error, not as an idle fleet"
    )


def test_the_query_sums_a_queue_gauge_the_rankers_export_as_the_pod_monitor_labels_it():
    manifests = composed("overlays/cpu", "keda")
    query = scaled_object()["spec"]["triggers"][0]["metadata"]["query"]
    names = set(re.findall(r"\b(relaygr_[a-z0-9_]+)\b", query))
    assert names == {"relaygr_rank_backlog_seconds"}
    assert names <= ranker_gauges(), "the query must name a gauge services/ranker/metrics.py exports"
    # The selector matches the ranker series as the PodMonitor scrapes them: job from the pod label it
    # names, namespace from where the rankers run.
    (selector,) = re.findall(r"relaygr_rank_backlog_seconds\{([^}]*)\}", query)
    matchers = dict(re.findall(r'(\w+)="([^"]*)"', selector))
    (monitor,) = of_kind(manifests, "PodMonitor")
    ranker = named(manifests, "StatefulSet", "ranker")
    assert matchers == {"job": pod_labels(ranker)[monitor["spec"]["jobLabel"]], "namespace": NAMESPACE}
    # One number for the fleet (AverageValue divides it by the replicas), smoothed over scrapes.
    assert query.startswith("sum(avg_over_time(")


def test_the_scaling_threshold_leaves_room_within_the_slo_and_scales_one_ranker_at_a_time():
    spec = scaled_object()["spec"]
    threshold_s = float(spec["triggers"][0]["metadata"]["threshold"])
    slo_s = loaded_configs("cpu")["trigger"].slo_ms / 1000
    assert 0 < threshold_s < slo_s / 2
    base_replicas = named(objects("overlays/cpu"), "StatefulSet", "ranker")["spec"]["replicas"]
    assert spec["minReplicaCount"] == base_replicas < spec["maxReplicaCount"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for direction in ("scaleUp", "scaleDown"):
        (policy,) = behavior[direction]["policies"]
        assert (policy["type"], policy["value"]) == ("Pods", 1), direction
    # Every step moves users and their caches: scale down far more reluctantly than up.
    down, up = behavior["scaleDown"], behavior["scaleUp"]
    assert down["stabilizationWindowSeconds"] >= 10 * up["stabilizationWindowSeconds"] > 0
    assert down["policies"][0]["periodSeconds"] > up["policies"][0]["periodSeconds"]


def test_both_scaling_components_compose_and_validate(tmp_path):
    rendered = render_composed("overlays/cpu", ("autoscaling", "keda"))
    assert unvalidated_kinds(rendered, tmp_path) == {"PodMonitor", "PrometheusRule", "ScaledObject"}


# --- What a ranker scale step moves -----------------------------------------------------------------------


def deployed_ring(members: int) -> AffinityRing:
    """The ring over a StatefulSet of `members` rankers, with the deployed settings of the router (and so
    of the trigger and the retrieval stub, which route with the same ones)."""
    router = loaded_configs("cpu")["router"]
    names = [f"ranker-{i}" for i in range(members)]
    return AffinityRing(names, router.virtual_nodes, router.load_factor, router.load_floor)


def owners(ring: AffinityRing) -> dict[str, str]:
    return {user: ring.owner(user) for user in USERS}


def moved_share(before: int) -> float:
    """The share of users whose ranker changes when the StatefulSet grows from `before` to before + 1."""
    ring = deployed_ring(before)
    old = owners(ring)
    ring.add(f"ranker-{before}")
    new = owners(ring)
    return sum(old[user] != new[user] for user in USERS) / len(USERS)


@pytest.mark.parametrize("before", [3, 4, 5, 7])
def test_a_scale_up_moves_about_one_in_n_plus_one_users_all_to_the_new_ranker(before):
    ring = deployed_ring(before)
    old = owners(ring)
    ring.add(f"ranker-{before}")
    new = owners(ring)
    moved = {user for user in USERS if old[user] != new[user]}
    # The new member's arcs hold 1/(N+1) of the ring in expectation; with 160 points per member its
    # share deviates by about 1/sqrt(160) (8 %), so 25 % is three standard deviations.
    assert abs(len(moved) / len(USERS) * (before + 1) - 1) < 0.25
    assert {new[user] for user in moved} == {f"ranker-{before}"}
    # Scaling back down (the StatefulSet removes the highest ordinal) returns every user to its ranker.
    ring.remove(f"ranker-{before}")
    assert owners(ring) == old


def test_growing_step_by_step_moves_users_only_onto_new_rankers():
    """Each step moves users only onto the ranker it adds (a user may move again at a later step), so
    the users who never moved are exactly those still on an original ranker, and the moves add up to the
    sum of the steps' shares."""
    ring = deployed_ring(3)
    start = owners(ring)
    moves = dict.fromkeys(USERS, 0)
    current = dict(start)
    for member in range(3, 8):
        ring.add(f"ranker-{member}")
        for user, owner in owners(ring).items():
            if owner != current[user]:
                assert owner == f"ranker-{member}", user
                moves[user] += 1
                current[user] = owner
    original = {f"ranker-{i}" for i in range(3)}
    assert {user for user, count in moves.items() if count == 0} == {
        user for user, owner in current.items() if owner in original
    }
    assert all(current[user] == start[user] for user in USERS if current[user] in original)
    # Users end on the five new rankers in proportion to their share of the ring: 5 of 8.
    moved = sum(count > 0 for count in moves.values()) / len(USERS)
    assert abs(moved - 5 / 8) < 0.05
    expected_moves = sum(1 / (n + 1) for n in range(3, 8))
    assert abs(sum(moves.values()) / len(USERS) - expected_moves) < 0.1 * expected_moves


def test_the_readme_states_the_measured_shares():
    text = (DEPLOY / "README.md").read_text()
    section = text[text.index("## Scaling") :]
    rows = re.findall(r"^\| (\d+) → (\d+) \| ([\d.]+) % \| ([\d.]+) % \|$", section, re.MULTILINE)
    assert len(rows) >= 3, "deploy/README.md's Scaling section tabulates scale steps and shares"
    for before, after, measured, expected in rows:
        assert int(after) == int(before) + 1
        assert float(measured) == round(100 * moved_share(int(before)), 1), (before, after)
        assert float(expected) == round(100 / int(after), 1), (before, after)
