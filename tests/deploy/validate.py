"""Validation of rendered trees: yamllint over a render, kubernetes-validate against the schemas of the
Kubernetes versions the manifests support."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from tests.deploy.manifests import REPO_ROOT, render

# The Kubernetes versions whose schemas renders are validated against (the oldest supported, the newest).
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")


@functools.cache
def yamllint_rendered(tree: str) -> subprocess.CompletedProcess[str]:
    """yamllint --strict over the render of `tree`, with the sources' settings but the line length: rendered
    ConfigMaps embed dashboard JSON and ghz data files whose lines are as long as their PromQL and arrays."""
    config = f"{{extends: {REPO_ROOT / '.yamllint'}, rules: {{line-length: disable}}}}"
    return subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-d", config, "-"],
        input=render(tree),
        capture_output=True,
        text=True,
    )


def kubernetes_validate(path, *versions: str) -> subprocess.CompletedProcess:
    """`kubernetes-validate --strict` of the file at `path` against the schemas of `versions`."""
    args = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet"]
    for version in versions:
        args += ["-k", version]
    return subprocess.run([*args, str(path)], capture_output=True, text=True)


def unvalidated_kinds(text: str, tmp_path: Path) -> set[str]:
    """Validates the YAML `text` strictly against every version of KUBERNETES_VERSIONS (the test fails on
    any error) and returns the kinds it has no schema for and so passed over (custom resources)."""
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(text)
    done = kubernetes_validate(rendered, *KUBERNETES_VERSIONS)
    assert done.returncode == 0, done.stdout + done.stderr
    return set(re.findall(r"Couldn't find schema for kind (\w+)", done.stdout))
