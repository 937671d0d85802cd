"""results.json's schema (`bench.lib.schema`): every committed run's results.json is in today's schema (it
reads back through it and writes out as it was, less the settings whose mechanism is gone), and the report
a committed run renders to stays what it was."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from bench import report
from bench.lib import envelope
from bench.lib.config import BenchConfig, Profile
from bench.lib.schema_gpu import load_run
from bench.report import gpu as gpu_report
from bench.report import readme

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
GOLDEN = Path(__file__).resolve().parent / "golden"
CPU_RUNS = ("full", "full-febe785", "full-b893f0b", "full-5e3657a", "quick-batched", "quick-relay")
GPU_RUNS = ("gpu-fleet", "gpu-fleet-graphs", "gpu-fleet-repeat")
# Runs whose trigger and stubs routed their own calls (every other run went through the router).
DIRECT_RUNS = ("full-5e3657a", "full")


def run_files() -> list[Path]:
    """Every committed results.json of a benchmark run (the other folders hold other records)."""
    found = []
    for path in sorted(RESULTS.glob("*/results.json")):
        if envelope.command_of(path) == "run":
            found.append(path)
    return found


def test_every_committed_run_is_found():
    names = {path.parent.name for path in run_files()}
    assert names == {*CPU_RUNS, *GPU_RUNS}


@pytest.mark.parametrize("path", run_files(), ids=lambda path: path.parent.name)
def test_a_committed_run_is_in_todays_schema_and_reads_back_byte_for_byte(path: Path):
    run = load_run(path)
    data = envelope.read(path, "run")
    for key in BenchConfig.RETIRED:
        data["configuration"].pop(key, None)
    for key in Profile.RETIRED:
        data["profile"].pop(key, None)
    assert run.to_json() == data
    # A run from before direct routing says it went through the router, which it did.
    direct = path.parent.name in DIRECT_RUNS
    assert run.configuration.routing == ("direct" if direct else "router")


@pytest.mark.parametrize("name", GPU_RUNS)
def test_a_committed_gpu_run_renders_to_its_committed_report(name: str):
    run = load_run(RESULTS / name / "results.json")
    assert gpu_report.render_markdown(run) == (RESULTS / name / "report.md").read_text()


def test_the_full_run_renders_to_the_same_report():
    """The committed report.md of `full-febe785` predates the report's CPU-per-request tables: the golden
    copy is what the report renders from its results.json today, and must stay so unless the report
    changes."""
    run = load_run(RESULTS / "full-febe785" / "results.json")
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


def test_a_run_that_recorded_checks_shows_them_at_the_top_of_its_report():
    markdown = report.render_markdown(load_run(RESULTS / "full" / "results.json"))
    assert markdown.splitlines()[2] == (
        "Checks: in-process floor +4.7% against bench/results/full-5e3657a (commit 5e3657a); other users of "
        "the machine took 0.02 cores on average during the points (at most 0.04); not flagged."
    )
