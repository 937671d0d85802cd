"""Whether a run's figures may be quoted (`bench.lib.checks.quotable`): only a run whose checks were recorded,
and flag nothing at its own limits or at the default ones."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.ab.schema import AbResults
from bench.lib import checks
from bench.lib.schema import Run
from bench.lib.schema_context import RunChecks

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CLEAN = RunChecks(
    floor_reference="bench/results/full-5e3657a", floor_drift=0.0468, foreign_cores_mean=0.016,
    foreign_cores_max=0.05, flags=[], floor_change=0.02,
)  # fmt: skip


@pytest.fixture(scope="module")
def full() -> Run:
    """A committed full run that predates the checks (it records none)."""
    return Run.from_json(json.loads((RESULTS / "full-5e3657a" / "results.json").read_text()))


def test_a_run_without_checks_is_not_quotable(full: Run):
    assert full.checks is None
    with pytest.raises(checks.FlaggedRun, match=r"full records no checks .*its figures may not be quoted"):
        checks.quotable(full)
    checked = dataclasses.replace(full, checks=CLEAN)
    assert checks.quotable(checked) is checked


@pytest.mark.parametrize("name", ["ab-mix1-admit-all", "ab-mix1-admit-all-warm"])
def test_a_fixed_load_ab_records_no_checks_and_is_not_quotable(name: str):
    results = AbResults.load(RESULTS / name / "results.json")
    with pytest.raises(checks.FlaggedRun, match=rf"the A/B {name} records no checks"):
        checks.quotable(results)


def test_a_run_is_judged_at_the_default_limits_whatever_its_own_flags_set(full: Run):
    """--floor-drift-limit and --foreign-cores-limit have no maximum: a run that set them to 100 % and 4
    cores flags nothing itself, yet its floor moved 30 % and other users took half a core."""
    loose = dataclasses.replace(full.configuration, floor_drift_limit=1.0, foreign_cores_limit=4.0)
    figures = dataclasses.replace(CLEAN, floor_drift=0.3, foreign_cores_mean=0.5)
    run = dataclasses.replace(full, configuration=loose, checks=figures)
    assert checks.flags_at(figures, 1.0, 4.0) == []
    assert checks.flags_at_default_limits(figures) == [
        "the in-process floor moved +30.0% from bench/results/full-5e3657a's (limit 10%): the machine ran at "
        "another speed",
        "other users of the machine took 0.50 cores on average during the points (limit 0.2)",
    ]  # fmt: skip
    with pytest.raises(checks.FlaggedRun, match=r"moved \+30.0% .*limit 10%.*took 0.50 cores"):
        checks.quotable(run)
    # Its own flags count too, even where the default limits would pass it.
    flagged = dataclasses.replace(run, checks=dataclasses.replace(CLEAN, flags=["the floor moved"]))
    with pytest.raises(checks.FlaggedRun, match="the floor moved"):
        checks.quotable(flagged)


def test_the_default_limits_are_the_documented_ones():
    assert (checks.default_limit("floor_drift_limit"), checks.default_limit("foreign_cores_limit")) == (
        0.1,
        0.2,
    )


def test_the_committed_full_run_records_its_checks_against_the_run_before_it_and_may_be_quoted():
    """bench/results/full predates the checks; they were computed once against the full run committed
    before it (its floor moved +4.7 %, other users took 0.016 cores on average) and recorded."""
    full = Run.from_json(json.loads((RESULTS / "full" / "results.json").read_text()))
    before = Run.from_json(json.loads((RESULTS / "full-5e3657a" / "results.json").read_text()))
    reference = (f"bench/results/full-5e3657a (commit {before.versions.git_commit})", before.measured.floor)
    assert full.checks == checks.run_checks(full.configuration, full.measured, reference)
    assert (full.checks.floor_drift, full.checks.foreign_cores_mean, full.checks.flags) == (0.0468, 0.016, [])
    assert checks.quotable(full) is full


def test_a_run_in_phases_is_flagged_by_the_phase_whose_unit_moved_not_by_its_floor_from_start_to_end():
    phased = dataclasses.replace(
        CLEAN, floor_change=0.3, in_host_unit=True, phase_changes={"length sweep": 0.04, "mix 2": -0.12}
    )
    assert checks.flags_at(phased, 0.1, 0.2) == [
        "the in-process floor moved -12.0% during the phase 'mix 2' (the host's unit u, from its start to "
        "its end) (limit 10%): its points were judged in a unit the machine no longer had"
    ]
    assert checks.flags_at(dataclasses.replace(phased, phase_changes={"mix 2": -0.08}), 0.1, 0.2) == []
    # Without phases, or with absolute bounds (a slower host between phases moves an SLO set in ms), the
    # floor's change from the run's start to its end flags it as well.
    unphased, absolute = (
        dataclasses.replace(phased, phase_changes={}),
        dataclasses.replace(phased, in_host_unit=False),
    )
    for run in (unphased, absolute):
        assert any("from the run's start to its end" in flag for flag in checks.flags_at(run, 0.1, 0.2))
