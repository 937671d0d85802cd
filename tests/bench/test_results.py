"""results.json's schema (`bench.schema`): every committed run's results.json reads back through it and
writes out as it was (older files gain only the fields added since, at their defaults, and renamed settings
their new keys), and the report a committed run renders to stays what it was."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench import checks, codec, report
from bench.report import gpu as gpu_report
from bench.report import readme
from bench.schema import Machine, Run
from bench.schema_gpu import GpuRun

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
GOLDEN = Path(__file__).resolve().parent / "golden"
# Fields newer than the CPU runs committed before them: reading one of those, the default applies, and
# writing it out adds them (`cut`: False in every point; the gpu profile's settings; the profile's
# per-rate point size).
# Fields newer than every committed run: the run's checks' limits and the seed cap of a load's verdict.
ADDED_SINCE_EVERY_RUN = {
    "configuration.floor_drift_limit", "configuration.foreign_cores_limit", "profile.seed_cap",
    "configuration.ablations", "configuration.stop_when_flagged",
}  # fmt: skip
ADDED_SINCE_THE_CPU_RUNS = {
    "configuration.floor_device", "configuration.ranker_profile_repeats", "configuration.time_budget_s",
    "profile.measured_min", "profile.measured_s", "*.points.*.cut", "configuration.routing",
    *ADDED_SINCE_EVERY_RUN,
}  # fmt: skip
CPU_RUNS = ("full-febe785", "quick-batched", "quick-relay")  # written before the results were typed
TYPED_CPU_RUNS = ("full-b893f0b", "full-5e3657a")  # written by bench.schema: read back byte for byte
# In today's schema (full: rewritten once, with its checks computed against the run before it): read back
# as they are.
CURRENT_CPU_RUNS = (
    "full", "headline-954a7e0", "headline-20eabaa", "headline-20eabaa-2", "headline-b52057b",
    "headline-b7a7274",
)  # fmt: skip
GPU_RUNS = ("gpu-fleet", "gpu-fleet-graphs", "gpu-fleet-repeat")
# Runs whose trigger and stubs routed their own calls (every other run went through the router).
DIRECT_RUNS = ("full-5e3657a", "full")
# Settings renamed since the committed runs: read from the former key, written under the new one.
RENAMED = {"preprocess_delay_ms": "relay_window_ms"}


def renamed(text: str) -> str:
    """A results file's text as a run would write it today: renamed settings under their new keys."""
    for old, new in RENAMED.items():
        text = text.replace(f'"{old}":', f'"{new}":')
    return text


def run_files() -> list[Path]:
    """Every committed results.json of a benchmark run (the other folders hold other records)."""
    found = []
    for path in sorted(RESULTS.glob("*/results.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "length_sweep" in data:
            found.append(path)
    return found


def load(path: Path) -> Run:
    data = json.loads(path.read_text())
    kind = GpuRun if data["configuration"].get("profile") == "gpu" else Run
    return kind.from_json(data)


def added_keys(old: Any, new: Any, path: str = "") -> set[str]:
    """The keys `new` has and `old` lacks, as dotted paths; AssertionError where a value they share
    differs."""
    if isinstance(old, dict):
        assert isinstance(new, dict) and set(old) <= set(new), path
        added = {f"{path}.{key}".lstrip(".") for key in set(new) - set(old)}
        for key in old:
            added |= added_keys(old[key], new[key], f"{path}.{key}")
        return added
    if isinstance(old, list):
        assert isinstance(new, list) and len(old) == len(new), path
        pairs = enumerate(zip(old, new, strict=True))
        return set().union(*(added_keys(a, b, f"{path}.{number}") for number, (a, b) in pairs))
    assert old == new and type(old) is type(new), f"{path}: {old!r} became {new!r}"
    return set()


def normalized(key: str) -> str:
    """`length_sweep.relay.points.3.cut` and the like as `*.points.*.cut`."""
    return re.sub(r"^.*\.points\.\d+\.([^.]+)$", r"*.points.*.\1", key)


def test_every_committed_run_is_found():
    names = {path.parent.name for path in run_files()}
    assert names == {*CPU_RUNS, *TYPED_CPU_RUNS, *CURRENT_CPU_RUNS, *GPU_RUNS}


@pytest.mark.parametrize("name", CURRENT_CPU_RUNS)
def test_a_run_in_todays_schema_reads_back_byte_for_byte(name: str):
    path = RESULTS / name / "results.json"
    assert json.dumps(load(path).to_json(), indent=1) + "\n" == path.read_text()


@pytest.mark.parametrize(
    "path",
    [p for p in run_files() if p.parent.name not in CURRENT_CPU_RUNS],
    ids=lambda path: path.parent.name,
)
def test_a_committed_run_reads_back_and_writes_out_as_it_was(path: Path):
    text = renamed(path.read_text())
    assert text != path.read_text()  # every committed run predates the relay window's rename
    written = load(path).to_json()
    added = {normalized(key) for key in added_keys(json.loads(text), written)}
    # A run from before direct routing reads back as routed through the router, which it was.
    direct = path.parent.name in DIRECT_RUNS
    assert written["configuration"]["routing"] == ("direct" if direct else "router")
    assert (
        written["configuration"]["relay_window_ms"]
        == json.loads(path.read_text())["configuration"]["preprocess_delay_ms"]
    )
    if path.parent.name in (*GPU_RUNS, *TYPED_CPU_RUNS):
        assert added == ADDED_SINCE_EVERY_RUN | ({"configuration.routing"} if not direct else set())
        for key in added:  # the fields added since, at their defaults
            group, name = key.split(".")
            del written[group][name]
        assert json.dumps(written, indent=1) + "\n" == text  # byte for byte
    else:
        assert added == ADDED_SINCE_THE_CPU_RUNS


@pytest.mark.parametrize("name", GPU_RUNS)
def test_a_committed_gpu_run_renders_to_its_committed_report(name: str):
    run = load(RESULTS / name / "results.json")
    assert gpu_report.render_markdown(run) == (RESULTS / name / "report.md").read_text()


def test_the_full_run_renders_to_the_same_report():
    """The committed report.md of `full-febe785` predates the report's CPU-per-request tables: the golden
    copy is what the report renders from its results.json today, and must stay so unless the report
    changes."""
    run = load(RESULTS / "full-febe785" / "results.json")
    assert report.render_markdown(run) == (GOLDEN / "full-report.md").read_text()


def test_the_readmes_results_are_the_rendering_of_the_quotable_headline_runs_it_names():
    """README's Results are what `python -m bench readme` renders from the committed runs its table names,
    each one whose checks let it be quoted (`bench.checks.quotable`; tests/bench/test_experiments.py
    flags one)."""
    text = (RESULTS.parents[1] / "README.md").read_text()
    rendered = text.split(readme.BEGIN, 1)[1].split(readme.END, 1)[0]
    names = re.findall(r"\[`([^`]+)`\]\(bench/results/", rendered.split("\n|---", 1)[0])
    assert names, "the README's Results name no run"
    runs = [(name, checks.quotable(load(RESULTS / name / "results.json"))) for name in names]
    assert readme.BEGIN + rendered + readme.END == readme.render(runs)
    assert all(run.configuration.profile in ("full", "headline") for _, run in runs)


def test_a_headline_run_is_checked_against_the_committed_full_run_on_its_host_until_it_has_its_own():
    """The headline profile times its floor as the full one does: with no committed headline run, its floor
    is compared with bench/results/full's, where that ran on the same host; a profile with neither has
    no reference, and neither has a run on another host (the AVX2 host of 2026-11-27, whose floor took
    1.4-1.9x the committed full run's: a measure of the host, not of this run's machine time)."""
    own = (RESULTS / "headline" / "results.json").exists()
    reference = load(RESULTS / ("headline" if own else "full") / "results.json")
    host = reference.machine
    name, floor = checks.committed_reference("headline", host)
    folder = "headline" if own else "full"
    assert name == f"bench/results/{folder} (commit {reference.versions.git_commit})"
    assert floor == reference.measured.floor
    assert checks.committed_reference("quick", host) is None  # no bench/results/quick, and no stand-in
    ab = json.loads((RESULTS / "ab-mix1-admit-all-warm" / "results.json").read_text())
    elsewhere = codec.from_json(Machine, ab["machine"])
    assert (elsewhere.cpu_capability, reference.machine.platform != elsewhere.platform) == ("AVX2", True)
    assert checks.committed_reference("headline", elsewhere) is None


def test_one_host_is_one_cpu_model_core_count_and_platform_and_the_same_kernels_where_both_recorded():
    host = load(RESULTS / "full" / "results.json").machine
    assert host.cpu_capability is None  # recorded from 2026-11-27 on
    same = dataclasses.replace(host, load_average_at_start=[9.0, 9.0, 9.0], memory_gib=64.0)
    assert checks.same_host(host, same) and checks.same_host(
        host, dataclasses.replace(host, cpu_capability="AVX2")
    )
    avx512 = dataclasses.replace(host, cpu_capability="AVX512")
    assert checks.same_host(avx512, avx512) and not checks.same_host(
        avx512, dataclasses.replace(avx512, cpu_capability="AVX2")
    )
    for other in (
        {"cores": 4},
        {"cpu_model": "Intel Xeon"},
        {"platform": host.platform.replace("v669", "v782")},
    ):
        assert not checks.same_host(host, dataclasses.replace(host, **other)), other
