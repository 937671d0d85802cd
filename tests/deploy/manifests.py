"""The kustomize trees under deploy/, rendered with `kubectl kustomize` into Python objects for the tests,
and the objects found by kind and name. What a workload's pod template holds is read with
tests.deploy.pods, and renders are validated with tests.deploy.validate."""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
OVERLAYS = ("cpu", "nvidia", "nvidia-shared", "ascend")
NAMESPACE = "relaygr"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")

Manifest = dict[str, Any]


@functools.cache
def render(tree: str) -> str:
    """`kubectl kustomize deploy/<tree>` as YAML text (cached: every test of a tree shares one render)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders deploy/ (it ships kustomize): `make install` pins one into .venv/bin"
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY / tree)], capture_output=True, text=True)
    assert done.returncode == 0, f"kubectl kustomize deploy/{tree} failed:\n{done.stderr}"
    return done.stdout


def _parsed(tree: str) -> tuple[Manifest, ...]:
    return tuple(doc for doc in yaml.load_all(render(tree), Loader=yaml.CSafeLoader) if doc)


def objects(tree: str) -> list[Manifest]:
    """The rendered tree's objects; a fresh copy each call, so a test may change what it gets."""
    return copy.deepcopy(list(_parsed(tree)))


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def named(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = [m for m in of_kind(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in WORKLOAD_KINDS]
