"""`python -m bench readme --runs headline,headline-2`: the README's Results table, rendered from committed
headline runs (`bench.report.readme`) and written between its markers in README.md; nothing else of the
README changes. Each run is a folder under bench/results/ with its results.json, and is refused unless its
checks let it be quoted (`bench.checks.quotable`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bench import checks
from bench.report import readme
from bench.schema import Run
from services.common.config import listed, load, setting
from services.launcher.procs import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"


@dataclasses.dataclass(frozen=True)
class ReadmeConfig:
    runs: str = setting(
        "headline,headline-2",
        "the runs the table quotes: folders under bench/results/",
        items=str,
        distinct=True,
    )
    readme: str = setting(
        "README.md", "the file whose rendered Results are replaced (from the repository root)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = load(ReadmeConfig, argv, prog="python -m bench readme", description=__doc__)
    runs = []
    for name in listed(config, "runs"):
        path = RESULTS_DIR / name / "results.json"
        if not path.exists():
            raise SystemExit(f"python -m bench readme: --runs: no results.json in {path.parent}")
        runs.append((name, checks.quotable(Run.load(path))))
    target = REPO_ROOT / config.readme
    readme.write(target, runs)
    print(f"{target}: Results rendered from {', '.join(name for name, _ in runs)}")
