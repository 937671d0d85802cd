"""Every committed block experiment renders its report.md as committed: the report describes the rule each
run measured by (its recorded fields), not only today's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.headline.report import render_markdown
from bench.headline.schema import HeadlineResults

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
RUNS = sorted(
    path.parent for path in RESULTS.glob("headline-*/results.json") if '"design"' in path.read_text()
)


def test_every_block_experiment_is_found():
    assert len(RUNS) >= 7


@pytest.mark.parametrize("folder", RUNS, ids=lambda folder: folder.name)
def test_a_committed_block_experiment_renders_its_report_byte_for_byte(folder: Path):
    results = HeadlineResults.read(folder / "results.json")
    assert render_markdown(results) == (folder / "report.md").read_text()
