"""The Dockerfile, read as Docker would (no daemon here): one non-root image whose entrypoint runs any
service module, built from what .dockerignore lets into the context, and matching the manifests."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from tests.deploy.manifests import OVERLAYS, REPO_ROOT, containers, objects, pod_spec, workloads

DOCKERFILE = REPO_ROOT / "Dockerfile"
IMAGE_USER = 10001


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for parts in (line.split(None, 1) for line in lines if line and not line.startswith("#"))
    ]


@dataclasses.dataclass
class Stage:
    name: str
    base: str  # an image, or the name of an earlier stage
    instructions: list[tuple[str, str]]

    def arguments(self, instruction: str) -> list[str]:
        return [arguments for name, arguments in self.instructions if name == instruction]


def stages() -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    for instruction, arguments in instructions():
        if instruction == "FROM":
            base, _, name = arguments.partition(" AS ")
            found[name.strip()] = Stage(name.strip(), base.strip(), [])
        elif found:
            list(found.values())[-1].instructions.append((instruction, arguments))
    return found


def inherited(stage: str, instruction: str) -> list[str]:
    """`instruction`'s arguments in `stage` and in the stages it is built from, the base's first."""
    every = stages()
    lineage = [every[stage]]
    while lineage[-1].base in every:
        lineage.append(every[lineage[-1].base])
    return [arguments for s in reversed(lineage) for arguments in s.arguments(instruction)]


def final_stage_names() -> list[str]:
    """The default target (the last stage) and the ascend target: the images that ship."""
    return [list(stages())[-1], "ascend"]


@pytest.mark.parametrize("stage", final_stage_names())
def test_shipped_images_run_as_the_non_root_user_the_pods_expect(stage):
    users = inherited(stage, "USER")
    assert users and users[-1].split(":")[0] == str(IMAGE_USER)
    for overlay in OVERLAYS:
        for workload in workloads(objects(f"overlays/{overlay}")):
            if workload["kind"] != "Job":
                assert pod_spec(workload)["securityContext"]["runAsUser"] == IMAGE_USER


@pytest.mark.parametrize("stage", final_stage_names())
def test_entrypoint_runs_any_service_module(stage):
    (entrypoint,) = inherited(stage, "ENTRYPOINT")[-1:]
    assert json.loads(entrypoint) == ["python", "-m"]
    for overlay in OVERLAYS:
        for workload in workloads(objects(f"overlays/{overlay}")):
            for container in containers(workload):
                if container["image"].startswith("relaygr:"):
                    python, flag, module = container["command"][:3]
                    assert (python, flag) == ("python", "-m")
                    assert (REPO_ROOT / module.replace(".", "/") / "__main__.py").exists(), module


def test_stubs_are_generated_as_make_proto_does_and_torch_comes_from_a_chosen_index():
    runs = " ".join(stages()["build"].arguments("RUN"))
    assert "grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=." in runs
    assert 'pip install --index-url "${TORCH_INDEX_URL}"' in runs
    build_args = [arguments for instruction, arguments in instructions() if instruction == "ARG"]
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in build_args
    assert "BASE_IMAGE=python:3.11-slim" in build_args
    assert 'pip install ".[ascend]"' in stages()["build-ascend"].arguments("RUN")


def test_build_context_holds_what_the_copies_need_and_nothing_else():
    """.dockerignore ignores everything, then re-includes; every COPY source must be re-included."""
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    included = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    copies = [a for i, a in instructions() if i == "COPY" and not a.startswith("--from")]
    sources = {src.rstrip("/") for args in copies for src in args.split()[:-1]}
    assert sources == included
    assert all((REPO_ROOT / source).exists() for source in sources)
