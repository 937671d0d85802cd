"""The dependency rules of the code base, checked over its import graph (every import statement, and every
module named to `importlib.import_module`, in services/, bench/ and tools/):

- `services/common` (shared plumbing), `services/affinity` (affinity routing to the rankers, which the
  router runs for its clients and the trigger and retrieval stub run in process) and `services/workload`
  (the synthetic user universe the retrieval stub serves and tools draw requests from) are
  service-neutral: they import no service. They are layers too: `services/common` imports no other
  package under services/, and `services/affinity` and `services/workload` stand on it, not on each other;
- `services/affinity` is imported only by what routes to the rankers (the router, the trigger, the
  retrieval stub): the launcher, the load generator, bench/ and tools/ never place a user. A ranker takes
  its membership, ring and settings (`RANKER_AFFINITY`: the ring its cache handoff follows), never its
  routing: it places no request;
- `services/workload` is imported only by the retrieval stub, which serves the synthetic universe, and by
  the clients that draw requests from it (`CLIENTS`): the router, the trigger and the ranker serve any
  users, never assuming the synthetic ones;
- services talk to each other over gRPC only: no service imports another service;
- the launcher, the load generator, `bench/` and `tools/` build processes from flags and speak gRPC: they
  import no module of a service, neither a servicer, proxy or data-plane module nor its config (a process
  they start gets the flags they set, and a flag they leave out keeps the service's own default), nor its
  internals. Exempt are the in-process harnesses in `IN_PROCESS`, each for the one service it measures in
  process, without gRPC (`bench/lib/floor.py` and `bench/micro/accelerator/device.py` time the ranker's
  model, engine and device layers as a floor under the fleet's numbers, `bench/headline/canary.py` the
  host's unit and its canary pass; `bench/micro/serving/in_process.py` times
  the same passes in process against the ranker's, `bench/micro/null_model.py` serves the ranker with its
  model passes made free, and `bench/micro/simulated_device.py` with passes that hold a shared simulated
  device; `bench/micro/accelerator/dram_precision.py` measures the scores of the ranker's DRAM precisions
  through its model and tier copier, and `bench/micro/accelerator/config.py` names the ranker's model
  presets): they may import that service's internals and config, never its handlers.
  `tools/docs.py` renders every command's settings class into docs/configuration.md, which is its job: it
  loads them by name, out of this check's sight;
- the ranker's packages are layers, `model` < `device` < `engine` < `cache` < its top-level modules: a
  package imports only from the layers below it (and the leaf `metrics`), so a Rank's walk reads top-down;
- `bench/` is a library (`bench/lib`) and the commands over it: the library imports no command.

And one size rule: no module under services/ or bench/, outside the ranker's model (services/ranker/model/,
which the serving-path work reshapes), is longer than 400 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {"ranker", "router", "trigger", "retrieval_stub"}
# Service-neutral packages under services/, each with the neutral packages it may import (its layers below).
NEUTRAL_BELOW = {"common": (), "affinity": ("common",), "workload": ("common",)}
NEUTRAL = tuple(NEUTRAL_BELOW)
# Who may import services/affinity (what routes to the rankers) and services/workload (what serves or draws
# the synthetic users), besides the package itself.
ROUTES = ("router", "trigger", "retrieval_stub")
DRAWS_USERS = ("retrieval_stub", "launcher", "loadgen", "bench", "tools")
CLIENTS = ("launcher", "loadgen", "bench", "tools")
# The modules of services/affinity a ranker may import: it knows the ring, it places no request.
RANKER_AFFINITY = ("membership", "ring", "settings")
# In-process harnesses, by path, and the one service whose internals each measures (see the docstring).
IN_PROCESS = {
    "bench/lib/floor.py": "ranker",
    "bench/headline/canary.py": "ranker",
    "bench/micro/accelerator/config.py": "ranker",
    "bench/micro/accelerator/device.py": "ranker",
    "bench/micro/accelerator/dram_precision.py": "ranker",
    "bench/micro/serving/in_process.py": "ranker",
    "bench/micro/null_model.py": "ranker",
    "bench/micro/simulated_device.py": "ranker",
}
# Modules that hold a service's request handling: only the service itself may import them.
HANDLERS = ("servicer", "proxy", "dataplane")


def imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:  # `from services.x import servicer` names a module too
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def owner(path: Path) -> str:
    """`ranker` for services/ranker/… (likewise `common`, `launcher`, `workload`…), `bench` or `tools`."""
    parts = path.relative_to(ROOT).parts
    return parts[1] if parts[0] == "services" else parts[0]


def ranker_ring(here: str, parts: list[str]) -> bool:
    """A ranker's import of the affinity modules that describe the ring (not its routing)."""
    return here == "ranker" and len(parts) > 2 and parts[2] in RANKER_AFFINITY


def violations() -> list[str]:
    found = []
    files = [p for top in ("services", "bench", "tools") for p in (ROOT / top).rglob("*.py")]
    assert len(files) > 50
    for path in files:
        here, where = owner(path), path.relative_to(ROOT).as_posix()
        for module in imports(path):
            parts = module.split(".")
            if parts[0] != "services" or len(parts) < 2:
                continue
            target = parts[1]
            rule = None
            if here in NEUTRAL and target in SERVICES:
                rule = "a service-neutral package (services/common, affinity, workload) imports no service"
            elif here in NEUTRAL and target in NEUTRAL and target not in (here, *NEUTRAL_BELOW[here]):
                rule = "services/common imports no other package; affinity and workload only services/common"
            elif target == "affinity" and here not in (*ROUTES, "affinity") and not ranker_ring(here, parts):
                rule = "only the router, the trigger and the retrieval stub import services/affinity"
            elif target == "workload" and here not in (*DRAWS_USERS, "workload"):
                rule = "only the retrieval stub and the clients import services/workload"
            elif here in SERVICES and target in SERVICES and target != here:
                rule = "no service imports another service"
            elif here in CLIENTS and target in SERVICES and IN_PROCESS.get(where) != target:
                rule = "launcher, loadgen, bench and tools import no service module (no servicer, no config)"
            elif here in CLIENTS and any(h in parts[2:] for h in HANDLERS):
                rule = "an in-process harness imports no servicer, proxy or data plane"
            if rule and not any(f.startswith(f"{path.relative_to(ROOT)} ") and rule in f for f in found):
                found.append(f"{path.relative_to(ROOT)} imports {module}: {rule}")
    return found


def test_the_dependency_rules_hold() -> None:
    assert violations() == []


def library_violations(root: Path) -> list[str]:
    """The imports of bench/lib that reach a command (anything under bench/ outside bench/lib)."""
    found = set()
    for path in (root / "bench" / "lib").rglob("*.py"):
        for module in imports(path):
            parts = module.split(".")
            if parts[0] == "bench" and len(parts) > 1 and parts[1] != "lib":
                found.add(f"{path.relative_to(root)} imports {'.'.join(parts[:2])}")
    return sorted(found)


def test_the_bench_library_imports_no_command() -> None:
    assert library_violations(ROOT) == []


def test_the_library_rule_catches_a_command_imported(tmp_path: Path) -> None:
    (tmp_path / "bench" / "lib").mkdir(parents=True)
    (tmp_path / "bench" / "lib" / "ok.py").write_text("from bench.lib import stats\nimport bench.lib.codec\n")
    (tmp_path / "bench" / "lib" / "bad.py").write_text("from bench.ab.schema import AbResults\n")
    assert library_violations(tmp_path) == ["bench/lib/bad.py imports bench.ab"]


RANKER_LAYERS = ("model", "device", "engine", "cache")


def layer_violations(root: Path) -> list[str]:
    """Each ranker package's imports of a higher layer or a top-level module, by the package reached."""
    found: set[str] = set()
    for rank, layer in enumerate(RANKER_LAYERS):
        allowed = {*RANKER_LAYERS[: rank + 1], "metrics"}
        for path in (root / "services" / "ranker" / layer).rglob("*.py"):
            for module in imports(path):
                parts = module.split(".")
                if parts[:2] == ["services", "ranker"] and len(parts) > 2 and parts[2] not in allowed:
                    found.add(f"{path.relative_to(root)} imports services.ranker.{parts[2]}")
    return sorted(found)


def test_the_ranker_layers_import_only_downwards() -> None:
    assert layer_violations(ROOT) == []


def test_the_layer_rule_catches_an_upward_import(tmp_path: Path) -> None:
    for layer in RANKER_LAYERS:
        (tmp_path / "services" / "ranker" / layer).mkdir(parents=True)
    (tmp_path / "services" / "ranker" / "engine" / "ok.py").write_text(
        "from services.ranker.device.accelerator import Accelerator\nfrom services.ranker import metrics\n"
    )
    (tmp_path / "services" / "ranker" / "model" / "bad.py").write_text(
        "from services.ranker.cache import x\n"
    )
    assert layer_violations(tmp_path) == ["services/ranker/model/bad.py imports services.ranker.cache"]


def throwaway_tree(tmp_path: Path, monkeypatch, where: str, source: str) -> None:
    """A tree of harmless files plus `source` at `where`, which the check then reads in place of the repo."""
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tools").mkdir(exist_ok=True)
    for i in range(60):
        (tmp_path / "tools" / f"ok{i}.py").write_text("import os\n")
    (tmp_path / where).write_text(f"import importlib\n{source}\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)


@pytest.mark.parametrize(
    "source, where, rule",
    [
        ("from services.ranker.config import RankerConfig", "services/common/x.py", "imports no service"),
        ("from services.trigger import admission", "services/workload/x.py", "imports no service"),
        ("from services.affinity import settings", "services/common/x.py", "no other package"),
        ("from services.workload import universe", "services/affinity/x.py", "only services/common"),
        ("import services.affinity.ring", "services/workload/x.py", "only services/common"),
        ("from services.affinity import routing", "services/ranker/x.py", "import services/affinity"),
        ("import services.affinity.client", "services/ranker/x.py", "import services/affinity"),
        ("from services.affinity.ring import AffinityRing", "tools/x.py", "import services/affinity"),
        ("from services.workload import universe", "services/trigger/x.py", "services/workload"),
        ("importlib.import_module('services.workload')", "services/router/x.py", "services/workload"),
        ("import services.trigger.admission", "services/router/x.py", "another service"),
        ("from services.ranker import servicer", "bench/x.py", "import no service module"),
        ("importlib.import_module('services.router.config')", "services/common/x.py", "imports no service"),
        ("from services.ranker.config import RankerConfig", "services/launcher/x.py", "no config"),
        ("from services.retrieval_stub import config", "bench/x.py", "no config"),
        (
            "from services.workload.universe import UserUniverse as U\nimport services.trigger",
            "tools/x.py",
            "no service module",
        ),
        ("from services.ranker.config import RankerConfig", "bench/results/x/floor.py", "no config"),
        ("from services.trigger.cost_model import CostModel", "bench/lib/floor.py", "no config"),
        (
            "from services.ranker.servicer import RankerServicer",
            "bench/lib/floor.py",
            "harness imports no servicer",
        ),
    ],
)
def test_each_rule_catches_its_violation(tmp_path: Path, monkeypatch, source: str, where: str, rule: str):
    # One offending file: the check must name it and the rule it breaks.
    throwaway_tree(tmp_path, monkeypatch, where, source)
    found = violations()
    assert len(found) == 1 and where in found[0] and rule in found[0], found


def test_an_in_process_harness_may_import_the_service_it_measures(tmp_path: Path, monkeypatch):
    source = "from services.ranker.config import RankerConfig\nfrom services.ranker.engine import runner"
    throwaway_tree(tmp_path, monkeypatch, "bench/lib/floor.py", source)
    assert violations() == []


# A module past this many lines holds more than one role; the ranker's model is exempt.
MAX_MODULE_LINES = 400
EXEMPT = ("services", "ranker", "model")


def long_modules(root: Path) -> list[str]:
    """The Python modules under services/ and bench/, outside services/ranker/model/, longer than
    MAX_MODULE_LINES."""
    found = []
    for path in sorted([*(root / "services").rglob("*.py"), *(root / "bench").rglob("*.py")]):
        lines = len(path.read_text().splitlines())
        if path.relative_to(root).parts[:3] != EXEMPT and lines > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_no_module_outside_the_rankers_model_is_over_400_lines() -> None:
    assert long_modules(ROOT) == []


def test_the_length_rule_catches_a_long_module_and_spares_the_model(tmp_path: Path) -> None:
    for where in (
        "services/trigger/long.py",
        "services/ranker/cache/long.py",
        "bench/micro/long.py",
        "services/ranker/model/long.py",
        "services/common/short.py",
    ):
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text("x = 1\n" * (401 if "long" in where else 400))
    assert long_modules(tmp_path) == [
        "bench/micro/long.py: 401 lines",
        "services/ranker/cache/long.py: 401 lines",
        "services/trigger/long.py: 401 lines",
    ]


def module_of(root: Path, name: str) -> Path | None:
    """The file of the bench module `name` (`bench.lib.stats` → bench/lib/stats.py, a package → its
    __init__.py); None for anything else."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def import_cycles(root: Path) -> list[str]:
    """The import cycles among bench/'s modules, counting every import wherever it stands: one deferred
    into a function body breaks a cycle at load time and hides it, so it counts as any other."""
    graph: dict[Path, set[Path]] = {}
    for path in sorted((root / "bench").rglob("*.py")):
        targets = {module_of(root, module) for module in imports(path) if module.startswith("bench.")}
        graph[path] = {target for target in targets if target is not None and target != path}
    cycles: list[str] = []
    state: dict[Path, int] = {}  # 1: on the current path, 2: done
    stack: list[Path] = []

    def visit(node: Path) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                loop = [*stack[stack.index(target) :], target]
                cycles.append(" -> ".join(p.relative_to(root).as_posix() for p in loop))
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycle_in_bench_deferred_imports_included() -> None:
    assert import_cycles(ROOT) == []


def test_the_cycle_rule_catches_a_cycle_hidden_by_a_deferred_import(tmp_path: Path) -> None:
    (tmp_path / "bench" / "micro").mkdir(parents=True)
    (tmp_path / "bench" / "lib").mkdir()
    (tmp_path / "bench" / "micro" / "a.py").write_text("from bench.micro import b\n")
    (tmp_path / "bench" / "micro" / "b.py").write_text("def f():\n    from bench.micro.a import x\n")
    (tmp_path / "bench" / "lib" / "c.py").write_text("def g():\n    import bench.micro.a\n")
    assert import_cycles(tmp_path) == ["bench/micro/a.py -> bench/micro/b.py -> bench/micro/a.py"]
