"""The README's Results (`python -m bench readme`): the headline table from two block runs (each cell both
runs' values), the length and mix-2 rows over the committed `bench run` runs, and the rollout table with
t intervals over its seeds; written between the markers and nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import __main__ as front_door
from bench.lib import envelope
from bench.lib.schema import Run
from bench.report import readme
from tests.bench.headline.fakes import fake_results

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"


def test_the_headline_rows_give_both_runs_the_claim_and_every_multiple(fast):
    runs = [fake_results("h1", ["--blocks", "14"]), fake_results("h2", ["--blocks", "14"])]
    rows = dict(readme.headline_rows(runs))
    first = runs[0].kept.steps[0].ratio
    assert rows["RelayGR's ranking P99 at L, over the baseline's at L"] == (
        f"x{first.value:.2f} [{first.low:.2f}, {first.high:.2f}] · x{first.value:.2f} [{first.low:.2f}, "
        f"{first.high:.2f}]"
    )
    assert (
        rows["**k claimed: RelayGR carries k times the baseline's load at no worse P99**"]
        == "**x4** · **x4**"
    )
    assert rows["r_4: RelayGR's P99 at 4 L over the baseline's at L"].endswith("(claimed)")
    assert rows["the baseline's P99 at L (L = 0.7 / u)"].startswith("240 ms = 3.43 u at 10 req/s")
    assert "RelayGR's P99 over admit-all's at 3 L" in rows


def test_the_side_rows_span_the_committed_runs():
    side = [(name, Run.load(RESULTS / name / "results.json")) for name in ("full", "full-5e3657a")]
    rows = dict(readme.side_rows(side))
    assert rows["the longest long-term length meeting the SLO at 8 req/s, RelayGR over the baseline"] == (
        "x1.5 to x2 over 2 runs (`full`, `full-5e3657a`)"
    )
    mix2 = rows["mix 2 (cap 4096 events): RelayGR's highest load meeting the SLO, requests per u"]
    assert mix2.endswith("the baseline met the SLO at some load in 0 of 2 runs")


def test_the_rollout_rows_quote_t_intervals_over_the_seeds():
    """Three seeds' P99s through the rolling restart differ by -14.2, -27.5 and -11.6 ms: their mean is
    -17.8 ms and its t interval [-39.0, +3.4] holds 0, where resampling requests gave [-31.3, -5.3]."""
    data = envelope.read(RESULTS / "rollout-population" / "results.json", "rollout")
    rows = dict(readme.rollout_rows(data))
    assert rows["Recommend P99 through the rolling restart (mean of the seeds' P99s)"] == (
        "162.3 → 144.5 ms: -17.8 ms [-39.0, +3.4], no difference shown"
    )
    assert rows["failed calls"] == "0 → 0"
    assert rows["a drained ranker's resident users whose next call hit"].startswith(
        "10.3% → 92.8%: +82.5 pp ["
    )


def test_the_results_are_written_between_the_markers_only(fast, tmp_path, monkeypatch):
    for name in ("h1", "h2"):
        fake_results(name, ["--blocks", "14"])
    monkeypatch.setattr(readme, "RESULTS_DIR", fast)
    target = tmp_path / "README.md"
    target.write_text(f"# title\n\n## Results\n\n{readme.BEGIN}\nPLACEHOLDER\n{readme.END}\n\n## Next\n")
    argv = ["readme", "--runs", "h1,h2", "--side-runs", "", "--rollout", "", "--rollout-new-users", "",
            "--readme", str(target)]  # fmt: skip
    assert front_door.main(argv) == 0
    text = target.read_text()
    assert text.startswith("# title\n\n## Results\n\n") and text.endswith(f"{readme.END}\n\n## Next\n")
    assert (
        "PLACEHOLDER" not in text
        and "[`h1`](bench/results/h1/report.md) · [`h2`](bench/results/h2/report.md)" in text
    )
    with pytest.raises(SystemExit, match=r"no results\.json"):
        front_door.main(["readme", "--runs", "h1,missing", "--side-runs", "", "--readme", str(target)])
    target.write_text("# no markers\n")
    with pytest.raises(ValueError, match="has no rendered Results"):
        readme.write(target, "x")
