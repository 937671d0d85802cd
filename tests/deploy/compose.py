"""Overlays composed with the optional components under deploy/components/, rendered by `kubectl kustomize`.

A platform team enables a component by adding it to its overlay's `components:`; these helpers do exactly
that in a scratch kustomization outside the repository (which kustomize allows for directories) and render
it, so every combination is tested without a committed overlay per combination.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from tests.deploy.manifests import DEPLOY, Manifest

COMPONENTS = DEPLOY / "components"


@functools.cache
def render_composed(tree: str, components: tuple[str, ...], patches: str = "") -> str:
    """`kubectl kustomize` of a kustomization holding `deploy/<tree>` as its resource, the named
    `deploy/components/<name>` as its components and `patches` (a YAML list, verbatim) as its patches."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders deploy/ (it ships kustomize): `make install` pins one into .venv/bin"
    with tempfile.TemporaryDirectory(prefix="relaygr-compose-") as scratch:
        root = Path(scratch)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / tree, root)],
            "components": [os.path.relpath(COMPONENTS / name, root) for name in components],
        }
        if patches:
            kustomization["patches"] = yaml.safe_load(patches)
        (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        done = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True)
    assert done.returncode == 0, f"deploy/{tree} with {components} failed to render:\n{done.stderr}"
    return done.stdout


@functools.cache
def _parsed(tree: str, components: tuple[str, ...], patches: str) -> tuple[Manifest, ...]:
    text = render_composed(tree, components, patches)
    return tuple(doc for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc)


def composed(tree: str, *components: str, patches: str = "") -> list[Manifest]:
    """The composed render's objects; a fresh copy each call, so a test may change what it gets."""
    return copy.deepcopy(list(_parsed(tree, components, patches)))
