"""What a rendered workload's pod template holds: its spec, labels, containers and ports, the environment
Kubernetes would give a container, label selection, and resource quantities as numbers."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tests.deploy.manifests import Manifest, named


def pod_spec(workload: Manifest) -> Manifest:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: Manifest) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def containers(workload: Manifest) -> list[Manifest]:
    return pod_spec(workload)["containers"]


def container_ports(container: Manifest) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container.get("ports", [])}


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics; an empty selector selects everything."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        outcome = {
            "In": present and labels[key] in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not outcome:
            return False
    return True


def pod_name(workload: Manifest) -> str:
    """A name the workload's first pod would get: StatefulSet pods are numbered, others are hashed."""
    name = workload["metadata"]["name"]
    return f"{name}-0" if workload["kind"] == "StatefulSet" else f"{name}-5d8f7c9b4-x2k8q"


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def environment(manifests: list[Manifest], workload: Manifest, container: Manifest) -> dict[str, str]:
    """The environment Kubernetes would give the container: envFrom ConfigMaps, then `env` in order,
    with `$(VAR)` references to earlier variables expanded and downward-API fields filled in. A Secret's
    values are not in the manifests (they are made in the cluster): its keys are left out."""
    namespace = workload["metadata"].get("namespace", "default")
    fields = {"metadata.name": pod_name(workload), "metadata.namespace": namespace}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" not in source:
            continue
        config_map = named(manifests, "ConfigMap", source["configMapRef"]["name"])
        env.update({source.get("prefix", "") + k: str(v) for k, v in config_map.get("data", {}).items()})

    def expand(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = _REFERENCE.sub(expand, variable["value"])
        else:
            env[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int) -> float:
    """A Kubernetes resource quantity ("500m", "3Gi", 2) as a number."""
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value)).groups()
    return float(number) * _UNITS[unit]
