"""`python -m bench reproduce`: two runs of the headline profile over fake fleets (whose limits are known,
tests/bench/test_experiments.py), compared as `bench.reproduce` requires."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import pytest

from bench import reproduce
from bench.lib import context
from bench.lib.config import load_config
from bench.lib.schema import Run, ratio
from bench.reproduce import Ratio, ReproduceConfig
from tests.bench.test_experiments import LOAD_LIMITS, MIX1, fake_run, scaled_floor

CONFIG = ReproduceConfig()


def headline_run(**limits: float) -> Run:
    """A fake headline run with the first mix's limits (`relay`, `baseline`, `admit-all`) changed."""
    with pytest.MonkeyPatch.context() as patch:
        for mode, limit in limits.items():
            patch.setitem(LOAD_LIMITS, (mode.replace("_", "-"), MIX1, 0.0), limit)
        return Run.from_json(fake_run(load_config(["--profile", "headline"], {}))[0])


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """RelayGR's first-mix limit at 40 req/s (the baseline's 13, admit-all's 45), at 46, and at 40 with
    admit-all's at 40."""
    return {
        "relay 40": headline_run(),
        "relay 46": headline_run(relay=46),
        "admit-all 40": headline_run(admit_all=40),
    }


def later(run: Run, gap_s: float = 60.0) -> Run:
    """`run` made again, started `gap_s` after it ended (a distinct run with the same figures)."""
    ended = datetime.datetime.fromisoformat(run.started_at) + datetime.timedelta(seconds=run.duration_s)
    return dataclasses.replace(run, started_at=(ended + datetime.timedelta(seconds=gap_s)).isoformat())


def write(run: Run, folder: Path) -> str:
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(run.to_json()))
    return str(folder)


def test_two_runs_that_agree_everywhere_and_meet_the_targets_hold(runs, tmp_path, capsys):
    run, again = runs["admit-all 40"], later(runs["admit-all 40"])
    first, second = write(run, tmp_path / "a"), write(again, tmp_path / "b")
    out = tmp_path / "reproduce.md"
    assert reproduce.main(["--runs", f"{first},{second}", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text() and printed.endswith("**Every check holds.**\n")
    assert "- two runs, the second started after the first ended: yes" in printed
    comparison = reproduce.compare((first, second), (run, again), CONFIG)
    assert [entry.name for entry in comparison.agreements] == [
        "length", "mix 1 (mix-m1024-s0.75-max2048)", "mix 2 (mix-m1536-s0.75-max4096)", "30% abandoned",
    ]  # fmt: skip
    assert all(entry.spread == 0.0 and entry.overlap and entry.agrees for entry in comparison.agreements)
    baseline, admit_all = comparison.targets[0]
    # Mix 1: RelayGR 40.0 (refined) over the baseline's 12.77; RelayGR's best over admit-all's: 40/40.
    assert (baseline.ratio.value, baseline.met) == (3.132, True)
    assert (admit_all.ratio.value, admit_all.met) == (1.0, True)
    assert (
        "| mix 1 (mix-m1024-s0.75-max2048) | x3.132 [2.85, 3.413] | x3.132 [2.85, 3.413] | yes | 0.0% |"
        in printed
    )


def test_two_copies_of_one_run_or_two_runs_that_overlap_in_time_do_not_hold(runs, tmp_path, capsys):
    run = runs["admit-all 40"]
    copies = reproduce.compare(("a", "b"), (run, run), CONFIG)
    assert copies.reproduced and copies.targets_met and copies.quotable
    assert not copies.one_after_the_other and not copies.holds
    # The second started a minute before the first ended (its hour-long run still going): not distinct.
    overlapping = reproduce.compare(("a", "b"), (run, later(run, gap_s=-60.0)), CONFIG)
    assert not overlapping.one_after_the_other and not overlapping.holds
    assert reproduce.compare(("a", "b"), (run, later(run, gap_s=0.0)), CONFIG).holds
    folders = write(run, tmp_path / "a"), write(run, tmp_path / "b")
    assert reproduce.main(["--runs", ",".join(folders)]) == 1
    assert "- two runs, the second started after the first ended: **no**" in capsys.readouterr().out


def test_runs_of_another_profile_or_lacking_a_headline_ratio_do_not_hold(runs):
    run = runs["admit-all 40"]
    assert reproduce.expected_ratios() == ["length", "mix 1", "mix 2", "30% abandoned"]
    full = dataclasses.replace(run, configuration=dataclasses.replace(run.configuration, profile="full"))
    comparison = reproduce.compare(("a", "b"), (full, later(full)), CONFIG)
    assert comparison.reproduced and not comparison.headline_profile and not comparison.holds
    # Neither run measured the abandoned share: the ratios both have agree, but one is missing in both.
    fractions = {
        key: entry for key, entry in run.measured.abandonment.fractions.items() if not entry.fraction
    }
    abandonment = dataclasses.replace(run.measured.abandonment, fractions=fractions)
    short = dataclasses.replace(run, measured=dataclasses.replace(run.measured, abandonment=abandonment))
    assert reproduce.missing(short) == ["30% abandoned"] and reproduce.missing(run) == []
    comparison = reproduce.compare(("a", "b"), (short, later(short)), CONFIG)
    assert comparison.reproduced and comparison.headline_profile
    assert not comparison.complete and not comparison.holds
    text = reproduce.render(comparison, CONFIG)
    assert (
        "- both measured every headline ratio (a lacks 30% abandoned; b lacks 30% abandoned): **no**" in text
    )


def test_the_default_limits_judge_both_runs_whatever_limits_their_own_flags_set(runs):
    """A run may set --floor-drift-limit and --foreign-cores-limit as high as it likes (they have no
    maximum): the comparison holds both runs to the defaults (10 % and 0.2 cores)."""
    run = runs["admit-all 40"]
    loose = dataclasses.replace(
        run.configuration, floor_drift_limit=1.0, foreign_cores_limit=4.0
    )  # fmt: skip
    # The second run's floor 30 % slower, other users at 0.5 cores: its own limits flag nothing.
    measured = dataclasses.replace(run.measured, floor=scaled_floor(1.3, run.measured.floor),
                                   floor_end=scaled_floor(1.3, run.measured.floor))  # fmt: skip
    checks = dataclasses.replace(run.checks, floor_drift=0.3, foreign_cores_mean=0.5, flags=[])
    slower = dataclasses.replace(later(run), configuration=loose, measured=measured, checks=checks)
    comparison = reproduce.compare(("a", "b"), (absolute(run), absolute(slower)), CONFIG)
    assert comparison.floor_limit == 0.1 and comparison.floor_moved == 0.3 and not comparison.same_speed
    assert not comparison.quotable and not comparison.holds
    # In the host's unit the speed may differ, but other users' half core still flags the second run.
    in_unit = reproduce.compare(("a", "b"), (run, slower), CONFIG)
    assert in_unit.same_speed and not in_unit.quotable and not in_unit.holds
    # The first run's own limit does not loosen it either.
    first_loose = dataclasses.replace(run, configuration=loose)
    assert reproduce.compare(("a", "b"), (first_loose, slower), CONFIG).floor_limit == 0.1


def test_a_run_without_checks_does_not_hold(runs):
    run = runs["admit-all 40"]
    unchecked = dataclasses.replace(later(run), checks=None)
    comparison = reproduce.compare(("a", "b"), (run, unchecked), CONFIG)
    assert comparison.reproduced and not comparison.quotable and not comparison.holds
    assert "- both runs checked and neither flagged, at the default limits: **no**" in reproduce.render(
        comparison, CONFIG
    )


def test_a_ratio_that_moved_more_than_the_agreement_fails_though_its_intervals_overlap(runs, tmp_path):
    comparison = reproduce.compare(("a", "b"), (runs["relay 40"], runs["relay 46"]), CONFIG)
    mix1 = comparison.agreements[1]
    assert (mix1.first, mix1.second) == (Ratio(3.132, [2.85, 3.413]), Ratio(3.719, [3.383, 4.066]))
    assert mix1.overlap is True and mix1.spread == round(3.719 / 3.132 - 1, 4) and not mix1.agrees
    assert [entry.agrees for entry in comparison.agreements] == [True, False, True, True]
    assert not comparison.reproduced and not comparison.holds
    # Admit-all's 45 is above RelayGR's 40 by more than 5 %: the first run misses 0.95 of it.
    assert [target.met for target in comparison.targets[0]] == [True, False]
    assert [target.met for target in comparison.targets[1]] == [True, True]
    # With a looser agreement the ratios agree; the first run's target still fails.
    loose = reproduce.compare(
        ("a", "b"), (runs["relay 40"], runs["relay 46"]), ReproduceConfig(agreement=0.2)
    )
    assert loose.reproduced and not loose.targets_met
    folders = write(runs["relay 40"], tmp_path / "a"), write(runs["relay 46"], tmp_path / "b")
    assert reproduce.main(["--runs", ",".join(folders)]) == 1


def absolute(run: Run) -> Run:
    """`run` as if its bounds had been set in ms (its checks say it did not run in the host's unit)."""
    return dataclasses.replace(run, checks=dataclasses.replace(run.checks, in_host_unit=False))


def at_speed(run: Run, start: float, end: float) -> Run:
    """`run` made again later on a machine `start` (`end`) times as slow at its start (end)."""
    floor = run.measured.floor
    measured = dataclasses.replace(
        run.measured, floor=scaled_floor(start, floor), floor_end=scaled_floor(end, floor)
    )
    return dataclasses.replace(later(run), measured=measured)


def test_runs_with_absolute_bounds_at_two_machine_speeds_do_not_hold(runs):
    run = absolute(runs["admit-all 40"])
    assert reproduce.compare(("a", "b"), (run, later(run)), CONFIG).floor_moved == 0.0
    # The second run's machine ran 20 % slower at the start and 10 % at the end: the lower, +10 %, is at
    # the limit; 12 % at both ends is past it.
    for start, end, moved, held in ((1.2, 1.1, 0.1, True), (1.12, 1.12, 0.12, False)):
        comparison = reproduce.compare(("a", "b"), (run, at_speed(run, start, end)), CONFIG)
        assert not comparison.in_host_unit
        assert (comparison.floor_moved, comparison.same_speed, comparison.holds) == (moved, held, held)
    text = reproduce.render(comparison, CONFIG)
    held = "- the machine's speed held between them (the second's floor +12.0% from the first's, limit 10%)"
    assert f"{held}: **no**" in text


def test_runs_in_the_host_unit_hold_at_two_machine_speeds_and_say_how_far_apart(runs):
    """The host's unit is what makes two speeds one experiment: the change is recorded, not required."""
    run = runs["admit-all 40"]
    assert run.checks.in_host_unit
    comparison = reproduce.compare(("a", "b"), (run, at_speed(run, 1.3, 1.25)), CONFIG)
    assert comparison.in_host_unit and comparison.floor_moved == 0.25
    assert comparison.same_speed and comparison.holds
    text = reproduce.render(comparison, CONFIG)
    assert "- both in the host's unit, so their speeds may differ (the second's floor +25.0% from the " \
           "first's): yes" in text  # fmt: skip
    # One of the two in absolute bounds: the speeds must agree again.
    mixed = reproduce.compare(("a", "b"), (run, absolute(at_speed(run, 1.3, 1.25))), CONFIG)
    assert not mixed.in_host_unit and not mixed.same_speed and not mixed.holds


def test_runs_at_two_commits_or_flagged_do_not_hold(runs):
    run = runs["admit-all 40"]
    other = dataclasses.replace(run, versions=dataclasses.replace(run.versions, git_commit="def5678"))
    # Two commits measured one code when they differ only in bench/results/ (the first run committed).
    results_only = ["bench/results/headline/report.md", "bench/results/headline/results.json"]
    for changed, one in ((results_only, True), ([*results_only, "bench/lib/sweep.py"], False), (None, False)):
        asked: list[tuple[str, str]] = []

        def differ(first: str, second: str, asked=asked, changed=changed) -> list[str] | None:
            asked.append((first, second))
            return changed

        comparison = reproduce.compare(("a", "b"), (run, other), CONFIG, differ)
        assert (comparison.changed, comparison.one_code, asked) == (changed, one, [("abc1234", "def5678")])
    # Neither commit is known to this checkout: not one code.
    assert not reproduce.compare(("a", "b"), (run, other), CONFIG).one_code
    dirty = dataclasses.replace(run, versions=dataclasses.replace(run.versions, git_commit="abc1234-dirty"))
    assert not reproduce.compare(("a", "b"), (dirty, dirty), CONFIG).one_code
    flagged = dataclasses.replace(run, checks=dataclasses.replace(run.checks, flags=["the floor moved"]))
    comparison = reproduce.compare(("a", "b"), (run, flagged), CONFIG)
    assert comparison.reproduced and comparison.targets_met and not comparison.quotable
    assert not comparison.holds


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ([1.0, 2.0], [2.0, 3.0], True),  # they share an end
        ([1.0, 2.0], [2.1, 3.0], False),
        ([2.1, 3.0], [1.0, 2.0], False),
        ([1.0, None], [5.0, 6.0], True),  # unbounded above
        ([7.0, None], [5.0, 6.0], False),
        ([0.0, None], [3.0, None], True),
    ],
)
def test_intervals_overlap_where_they_share_a_point(first, second, overlap):
    assert reproduce.overlaps(first, second) is overlap


def test_a_missing_interval_or_ratio_never_agrees():
    assert not reproduce.agreement("x", Ratio(2.0, None), Ratio(2.0, [1.5, 2.5]), 0.1).agrees
    assert not reproduce.agreement("x", Ratio(None, [0.0, None]), Ratio(2.0, [1.5, 2.5]), 0.1).agrees
    assert reproduce.agreement("x", Ratio(2.0, [1.5, 2.5]), Ratio(2.2, [1.9, 2.6]), 0.1).agrees
    assert not reproduce.agreement("x", Ratio(2.0, [1.5, 2.5]), Ratio(2.21, [1.9, 2.6]), 0.1).agrees


def test_the_runs_setting_takes_exactly_two_folders(tmp_path, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(["--runs", "bench/results/full"])
    assert "--runs takes exactly two folders" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--runs: no results\.json in"):
        reproduce.main(["--runs", f"{tmp_path / 'a'},{tmp_path / 'b'}"])


def test_what_two_commits_differ_in_comes_from_git():
    """This checkout's history: 589a926 changed the floor's code and its tests after e398a50, which
    committed an A/B's results with its docs and tests."""
    assert context.changed_between("e398a50", "589a926") == [
        "bench/checks.py", "bench/experiments.py", "bench/micro/floor.py", "tests/bench/micro/test_floor.py",
        "tests/bench/test_experiments.py",
    ]  # fmt: skip
    assert context.changed_between("589a926", "589a926") == []
    assert context.changed_between("0000000", "589a926") is None


def test_where_no_baseline_met_the_slo_the_lower_bounds_are_compared():
    # Mix 2 in the README: the baseline failed at the grid's lowest load, RelayGR reached 23 and then 21.
    bounds = reproduce.agreement("mix 2", Ratio(None, [23.0, None]), Ratio(None, [21.0, None]), 0.1)
    assert (bounds.of_bounds, bounds.overlap, bounds.spread, bounds.agrees) == (True, True, 0.0952, True)
    assert not reproduce.agreement("mix 2", Ratio(None, [23.0, None]), Ratio(None, [20.0, None]), 0.1).agrees
    # Nothing met the SLO in either mode: nothing to compare.
    nothing = reproduce.agreement("mix 2", Ratio(None, [0.0, None]), Ratio(None, [0.0, None]), 0.1)
    assert (nothing.of_bounds, nothing.spread, nothing.agrees) == (True, None, False)
    # One run has a ratio, the other none: they do not agree.
    assert not reproduce.agreement("mix 2", Ratio(2.0, [1.5, 2.5]), Ratio(None, [2.0, None]), 0.1).agrees


def test_relay_against_admit_all_is_read_from_relays_sweep_measured_beside_it(runs):
    """The admit-all target compares admit-all with RelayGR as swept in the same minutes, not with the first
    mix's RelayGR sweep of experiment 2."""
    run = runs["relay 40"]
    faster = runs["relay 46"].measured.ablations.relay_beside["admit-all"]
    ablations = dataclasses.replace(run.measured.ablations, relay_beside={"admit-all": faster})
    changed = dataclasses.replace(run, measured=dataclasses.replace(run.measured, ablations=ablations))
    admit_all, beside = run.measured.ablations.sweeps["admit-all"], run.measured.ablations.relay_beside
    before, after = reproduce.targets(run, CONFIG), reproduce.targets(changed, CONFIG)
    assert faster.best != beside["admit-all"].best
    assert before[1].ratio.value == ratio(beside["admit-all"].best, admit_all.best)
    assert after[1].ratio.value == ratio(faster.best, admit_all.best)
    assert after[0] == before[0]  # RelayGR over the baseline is the first mix's, as ever
