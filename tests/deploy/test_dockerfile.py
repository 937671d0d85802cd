"""The Dockerfile, read as Docker would (no daemon here): one non-root image per accelerator whose entrypoint
runs any service module, whose build arguments decide the torch it holds, built from what .dockerignore
lets into the context, and matching the manifests, pyproject.toml's extras and every documented command."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import shlex
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy.manifests import DEPLOY, OVERLAYS, REPO_ROOT, objects, workloads
from tests.deploy.pods import containers, pod_spec

DOCKERFILE = REPO_ROOT / "Dockerfile"
IMAGE_USER = 10001
# Each image target, and the build of torch it must hold.
IMAGES = ("cpu", "cuda", "ascend")


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
    return [arguments for s in lineage(stage) for arguments in s.arguments(instruction)]


def final_stage_names() -> list[str]:
    """The images that ship: one target per accelerator."""
    return list(IMAGES)


def lineage(stage: str) -> list[Stage]:
    """`stage` and the stages it is built from, the base's first."""
    every = stages()
    found = [every[stage]]
    while found[-1].base in every:
        found.append(every[found[-1].base])
    return list(reversed(found))


def copied_from(stage: str) -> list[str]:
    """The stages whose files `stage` (or a stage it is built from) copies in with `COPY --from`."""
    return [
        arguments.split()[0].removeprefix("--from=")
        for s in lineage(stage)
        for name, arguments in s.instructions
        if name == "COPY" and arguments.startswith("--from=")
    ]


def arg_defaults() -> dict[str, str]:
    """Every ARG's default (global or in a stage); one default per name."""
    defaults: dict[str, str] = {}
    for instruction, arguments in instructions():
        if instruction == "ARG" and "=" in arguments:
            name, _, default = arguments.partition("=")
            assert defaults.setdefault(name, default) == default, f"ARG {name} has two defaults"
    return defaults


def global_args() -> set[str]:
    names = set()
    for instruction, arguments in instructions():
        if instruction == "FROM":
            break
        if instruction == "ARG":
            names.add(arguments.partition("=")[0])
    return names


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda match: values[match.group(1)], text)


def project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def requirement(requirements: list[str], name: str) -> Requirement:
    (found,) = [Requirement(r) for r in requirements if Requirement(r).name == name]
    return found


def exact_pin(found: Requirement) -> str:
    """The version an `==` requirement pins; fails on anything looser."""
    (specifier,) = found.specifier
    assert specifier.operator == "==" and "*" not in specifier.version, f"{found} is not pinned exactly"
    return specifier.version


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


def test_the_wheel_holds_stubs_generated_as_make_proto_does_with_the_pinned_grpcio_tools():
    runs = " ".join(stages()["wheel"].arguments("RUN"))
    assert "grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=." in runs
    assert "pip wheel --no-deps --wheel-dir /wheels ." in runs
    # The grep that picks grpcio-tools out of pyproject.toml finds exactly its pinned requirement.
    (pattern,) = re.findall(r"grep -o '([^']+)' pyproject.toml", runs)
    found = re.findall(pattern, (REPO_ROOT / "pyproject.toml").read_text())
    assert found == [str(requirement(project()["dependencies"], "grpcio-tools"))]


def venv_of(image: str) -> str:
    """The stage whose /opt/relaygr (the virtual environment) the image copies in."""
    (source,) = copied_from(image)
    return source


def pip_installs(stage: str) -> list[str]:
    """The `pip install` commands that build `stage`'s virtual environment, in order."""
    return [
        command.strip()
        for s in lineage(stage)
        for run in s.arguments("RUN")
        for command in run.split("&&")
        if command.strip().startswith("pip install")
    ]


# Where each image's torch comes from: the build arguments that decide it.
TORCH_INSTALLS = {
    "cpu": 'pip install --index-url "${TORCH_INDEX}/cpu" "torch==${TORCH_VERSION}"',
    "cuda": 'pip install --index-url "${TORCH_INDEX}/${TORCH_CUDA}" "torch==${TORCH_VERSION}"',
    # torch_npu runs over torch's CPU build.
    "ascend": 'pip install --index-url "${TORCH_INDEX}/cpu" "torch==${TORCH_VERSION}"',
}
# What each image's build checks before it can succeed: the torch release and build the arguments named.
TORCH_CHECKS = {
    "cpu": ["'${TORCH_VERSION}'", "torch.version.cuda is None"],
    "cuda": ["'${TORCH_VERSION}'", "and torch.version.cuda,"],
    "ascend": ["'${TORCH_VERSION}'", "npu == '${TORCH_NPU_VERSION}'"],
}


@pytest.mark.parametrize("image", IMAGES)
def test_the_build_arguments_decide_the_torch_of_each_image_and_nothing_later_replaces_it(image):
    assert image in stages()
    installs = pip_installs(venv_of(image))
    torch_installs = [command for command in installs if "torch==" in command]
    assert torch_installs[0] == TORCH_INSTALLS[image]
    # After it: the project's wheel (whose torch requirement is a floor that release meets) and, for
    # Ascend, torch_npu at its own argument; no other torch, no extra, no upgrade.
    later = installs[installs.index(TORCH_INSTALLS[image]) + 1 :]
    expected_later = ["pip install /wheels/*.whl"]
    if image == "ascend":
        expected_later.append('pip install "torch_npu==${TORCH_NPU_VERSION}"')
    assert later == expected_later
    floor = requirement(project()["dependencies"], "torch")
    assert {specifier.operator for specifier in floor.specifier} <= {">=", ">"}, floor
    assert Version(arg_defaults()["TORCH_VERSION"]) in floor.specifier
    # The build fails unless the image ends with the torch (and torch_npu) the arguments named.
    last_run = [s.arguments("RUN") for s in lineage(venv_of(image)) if s.arguments("RUN")][-1][-1]
    assert all(check in last_run for check in TORCH_CHECKS[image]), last_run


def test_every_argument_a_stage_uses_is_declared_in_it():
    """Docker expands in RUN only the ARGs the stage itself declares (a global ARG must be re-declared):
    an undeclared one would silently be empty, and the argument would decide nothing."""
    every = stages()
    for stage in every.values():
        declared = {arguments.partition("=")[0] for arguments in stage.arguments("ARG")}
        declared |= {"PATH"}
        used = {name for run in stage.arguments("RUN") for name in re.findall(r"\$\{(\w+)\}", run)}
        assert used <= declared, f"stage {stage.name} uses {sorted(used - declared)} without ARG"
    bases = {stage.base for stage in every.values() if stage.base not in every}
    for base in bases:
        names = set(re.findall(r"\$\{(\w+)\}", base))
        assert names <= global_args(), f"FROM {base} needs a global ARG"


def test_the_default_target_is_the_cpu_image_and_the_default_indexes_hold_the_builds():
    assert list(stages())[-1] == "cpu"
    defaults = arg_defaults()
    assert defaults["BASE_IMAGE"] == "python:3.11-slim"
    assert defaults["TORCH_INDEX"].startswith("https://") and not defaults["TORCH_INDEX"].endswith("/")
    assert re.fullmatch(r"cu\d{3}", defaults["TORCH_CUDA"])
    cpu = expand(TORCH_INSTALLS["cpu"], defaults)
    cuda = expand(TORCH_INSTALLS["cuda"], defaults)
    assert f'"{defaults["TORCH_INDEX"]}/cpu"' in cpu and f'"{defaults["TORCH_INDEX"]}/cu' in cuda
    assert f'"torch=={defaults["TORCH_VERSION"]}"' in cpu


def test_pyproject_extras_pin_the_releases_the_build_arguments_install():
    defaults = arg_defaults()
    extras = project()["optional-dependencies"]
    for extra in IMAGES:
        assert exact_pin(requirement(extras[extra], "torch")) == defaults["TORCH_VERSION"], extra
    # The Ascend pair is pinned exactly, and torch_npu's release is numbered after the torch it is built
    # for (2.13.0, 2.13.0.post1, ...).
    npu = exact_pin(requirement(extras["ascend"], "torch_npu"))
    assert npu == defaults["TORCH_NPU_VERSION"]
    assert Version(npu).release[:3] == Version(defaults["TORCH_VERSION"]).release[:3]


def test_make_install_installs_the_cpu_extra_and_this_venv_has_its_release():
    makefile = (REPO_ROOT / "Makefile").read_text().splitlines()
    (install,) = [line.strip() for line in makefile if "pip install -q -e" in line]
    assert install == "$(PY) -m pip install -q -e '.[dev,cpu]'"
    installed = Version(importlib.metadata.version("torch"))
    assert installed.base_version == arg_defaults()["TORCH_VERSION"]


def documented_builds() -> list[tuple[str, list[str]]]:
    """(file, words) of every `docker build` command the Dockerfile's header and the READMEs show."""
    found = []
    for path in (DOCKERFILE, REPO_ROOT / "README.md", DEPLOY / "README.md"):
        text = re.sub(r"\\\n\s*", " ", path.read_text())  # a command continued over lines is one line
        for command in re.findall(r"docker build[^`#\n]*", text):
            found.append((str(path.relative_to(REPO_ROOT)), shlex.split(command.strip())))
    return found


def build_target(words: list[str]) -> str:
    return words[words.index("--target") + 1] if "--target" in words else list(stages())[-1]


def test_every_documented_build_command_names_a_target_and_arguments_that_exist():
    builds = documented_builds()
    declared = set(arg_defaults()) | {i[1].partition("=")[0] for i in instructions() if i[0] == "ARG"}
    for where, words in builds:
        assert words[-1] == ".", f"{where}: {words} does not build this folder"
        target = build_target(words)
        assert target in IMAGES, f"{where}: no image target {target!r}"
        for position, word in enumerate(words):
            if word == "--build-arg":
                name = words[position + 1].partition("=")[0]
                assert name in declared, f"{where}: --build-arg {name} is no ARG of the Dockerfile"
        tag = words[words.index("-t") + 1]
        assert tag.rpartition(":")[2] == f"0.1.0-{target}", f"{where}: {tag} is not the {target} image's tag"
    for where in ("Dockerfile", "deploy/README.md"):
        documented = {build_target(words) for name, words in builds if name == where}
        assert documented == set(IMAGES), f"{where} shows builds of {sorted(documented)}"


def test_every_overlay_runs_an_image_that_a_target_builds():
    for overlay in OVERLAYS:
        tags = {
            container["image"].rpartition(":")[2]
            for workload in workloads(objects(f"overlays/{overlay}"))
            for container in containers(workload)
            if container["image"].rpartition(":")[0].endswith("relaygr")
        }
        assert tags and all(tag.removeprefix("0.1.0-") in IMAGES for tag in tags), (overlay, tags)


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
