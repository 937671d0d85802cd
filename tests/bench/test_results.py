"""results.json's schema (`bench.lib.schema`): every committed run's results.json is in today's schema (it
reads back through it and writes out byte for byte), and the report a committed run renders to stays what
it was."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bench import report
from bench.lib import checks, codec
from bench.lib.schema import Machine, Run
from bench.lib.schema_gpu import GpuRun
from bench.report import gpu as gpu_report
from bench.report import readme

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
GOLDEN = Path(__file__).resolve().parent / "golden"
CPU_RUNS = (
    "full", "full-febe785", "full-b893f0b", "full-5e3657a", "quick-batched", "quick-relay",
    "headline-954a7e0", "headline-20eabaa", "headline-20eabaa-2", "headline-b52057b", "headline-b7a7274",
    "headline-e367f97", "headline-e975950",
)  # fmt: skip
GPU_RUNS = ("gpu-fleet", "gpu-fleet-graphs", "gpu-fleet-repeat")
# Runs whose trigger and stubs routed their own calls (every other run went through the router).
DIRECT_RUNS = ("full-5e3657a", "full", "headline-954a7e0", "headline-20eabaa", "headline-20eabaa-2",
               "headline-b52057b", "headline-b7a7274", "headline-e367f97", "headline-e975950")  # fmt: skip


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


def test_every_committed_run_is_found():
    names = {path.parent.name for path in run_files()}
    assert names == {*CPU_RUNS, *GPU_RUNS}


@pytest.mark.parametrize("path", run_files(), ids=lambda path: path.parent.name)
def test_a_committed_run_is_in_todays_schema_and_reads_back_byte_for_byte(path: Path):
    run = load(path)
    assert json.dumps(run.to_json(), indent=1) + "\n" == path.read_text()
    # A run from before direct routing says it went through the router, which it did.
    direct = path.parent.name in DIRECT_RUNS
    assert run.configuration.routing == ("direct" if direct else "router")


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


def test_the_readmes_results_are_the_rendering_of_the_committed_runs_it_names():
    """README's Results are what `python -m bench readme` renders from the two headline runs its table
    names (and, beside them, the default side and rollout runs)."""
    text = (RESULTS.parents[1] / "README.md").read_text()
    rendered = text.split(readme.BEGIN, 1)[1].split(readme.END, 1)[0]
    header = next(line for line in rendered.splitlines() if line.startswith("|"))
    names = re.findall(r"\[`([^`]+)`\]\(bench/results/", header)
    assert len(names) == 2, "the README's Results name no pair of headline runs"
    config = dataclasses.replace(readme.ReadmeConfig(), runs=",".join(names))
    assert readme.BEGIN + rendered + readme.END == readme.render_from(config)


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
