"""The README's Results table is rendered from headline runs (`bench.report.readme`): each ratio with the
interval of its brackets, a wide one called a band, and the host's unit."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lib.config import load_config
from bench.lib.schema import Run
from bench.report import readme
from tests.bench.test_experiments import fake_run


@pytest.fixture(scope="module")
def headline() -> Run:
    results, _, _ = fake_run(load_config(["--profile", "headline"], {}))
    return Run.from_json(results)


def test_every_headline_ratio_has_its_interval_and_the_host_unit_is_stated(headline):
    rendered = readme.render([("headline", headline)])
    rows = dict(
        (line.split(" | ")[1].split(": ")[0], line.split(" | ")[1].split(": ")[1].rstrip(" |"))
        for line in rendered.splitlines()
        if line.startswith("| ") and " → " in line
    )
    # Each row: the baseline's best → RelayGR's (admit-all's → RelayGR's in the last), ratio [interval].
    assert rows == {
        "1536 → 3072": "x2 [x1.5, x2.667]",  # lengths
        "12.1 → 37.9": "x3.132 [x2.85, x3.413]",  # mix 1
        "4.9 → 8.7": "x1.776 [x1.611, x1.918]",  # mix 2
        "16 → 29.4": "x1.837 [x1.68, x2]",  # 30 % abandoned
        "45 → 37.9": "x0.842 [x0.77, x0.918]",  # against admit-all
    }
    assert "| the host's unit, the SLO and the relay window | u = 34.8432 ms: SLO 2.87 u = 100 ms" in rendered


def test_a_wide_interval_is_a_band_and_an_open_one_says_so():
    assert readme.ratio_with_interval(3.0, [1.2, 4.0]) == "x3 [x1.2, x4], a band"
    assert readme.ratio_with_interval(3.0, [2.5, None]) == "x3 [x2.5, unbounded], a band"
    assert readme.ratio_with_interval(3.0, [2.5, 3.5]) == "x3 [x2.5, x3.5]"
    assert readme.ratio_with_interval(None, [23.0, None]) == "≥ x23 (no baseline answer)"


def test_writing_replaces_only_what_lies_between_the_markers(headline, tmp_path):
    path = tmp_path / "README.md"
    path.write_text(f"# title\n\n## Results\n\n{readme.BEGIN}\nold\n{readme.END}\n\n## Next\n")
    readme.write(path, [("headline", headline), ("headline-2", headline)])
    text = path.read_text()
    assert text.startswith("# title\n\n## Results\n\n") and text.endswith(f"{readme.END}\n\n## Next\n")
    assert "old" not in text and text.count("12.1 → 37.9: x3.132 [x2.85, x3.413]") == 2
    path.write_text("# no markers\n")
    with pytest.raises(ValueError, match="has no rendered Results"):
        readme.write(path, [("headline", headline)])


def test_a_run_without_brackets_says_so_and_a_baseline_that_never_met_gives_a_lower_bound():
    """bench/results/full predates the brackets and its SLO was absolute; its second mix's baseline met the
    SLO at no load down to 1 call/s."""
    full = Run.load(Path(__file__).resolve().parents[2] / "bench" / "results" / "full" / "results.json")
    cells = dict(readme.rows(full))
    mix1, mix2 = [
        cell
        for what, cell in cells.items()
        if what.startswith(("highest load, mix 1 (", "highest load, mix 2 ("))
    ]
    assert mix1 == "23 → 64: x2.783 (the run recorded no brackets: a single edge each, no interval)"
    assert mix2 == "none → 23: > x23 (the other met the SLO at no load down to 1)"
    unit = cells["the host's unit, the SLO and the relay window"]
    assert unit == "absolute: SLO 100 ms (2.87 u, u = 34.9012 ms by its floor), relay window 100 ms"
