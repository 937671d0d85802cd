"""`python -m bench.reproduce`: two runs of the headline profile over fake fleets (whose limits are known,
tests/bench/test_experiments.py), compared as issue 31's done-when asks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench import reproduce
from bench.config import load_config
from bench.reproduce import Ratio, ReproduceConfig
from bench.schema import Run
from tests.bench.test_experiments import LOAD_LIMITS, MIX1, fake_run

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


def write(run: Run, folder: Path) -> str:
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(run.to_json()))
    return str(folder)


def test_two_runs_that_agree_everywhere_and_meet_the_targets_hold(runs, tmp_path, capsys):
    run = runs["admit-all 40"]
    first, second = write(run, tmp_path / "a"), write(run, tmp_path / "b")
    out = tmp_path / "reproduce.md"
    assert reproduce.main(["--runs", f"{first},{second}", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text() and printed.endswith("**Every check holds.**\n")
    comparison = reproduce.compare((first, second), (run, run), CONFIG)
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


def test_runs_at_two_commits_or_flagged_do_not_hold(runs):
    run = runs["admit-all 40"]
    other = dataclasses.replace(run, versions=dataclasses.replace(run.versions, git_commit="def5678"))
    assert not reproduce.compare(("a", "b"), (run, other), CONFIG).one_commit
    dirty = dataclasses.replace(run, versions=dataclasses.replace(run.versions, git_commit="abc1234-dirty"))
    assert not reproduce.compare(("a", "b"), (dirty, dirty), CONFIG).one_commit
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
