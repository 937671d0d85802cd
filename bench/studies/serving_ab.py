"""`python -m bench serving-ab --before-tree DIR`: another checkout's ranker against this checkout's.

Both rankers are up at once and driven in turn by the same pairs at the same rate (`python -m bench
serving`'s driver and CPU probes), three rounds, at two shapes; prints a markdown table of each one's CPU a
pair that is not the model. The other checkout needs its generated stubs:

    git worktree add /tmp/before <commit> && cp -r relaygr /tmp/before/
    python -m bench serving-ab --before-tree /tmp/before > bench/results/<name>/ab.md

Only ratios within the run count: a shared machine's speed drifts over minutes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.micro.serving.config import ServingConfig
from bench.micro.serving.pairs import LocalLoad, Shape, measure_point
from bench.micro.serving.run import start_ranker
from services.common.config import load, setting
from services.launcher import procs as launcher_procs
from services.launcher.procs import Processes

SHAPES = [(256, 512, 20.0), (1024, 512, 12.0)]
ROUNDS = 3
BEFORE, AFTER = "before", "this checkout"  # the rankers, as the table names them


async def compare(before_tree: Path) -> None:
    config = ServingConfig(pairs=300, warmup_pairs=30)
    with tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
        here = launcher_procs.REPO_ROOT
        launcher_procs.REPO_ROOT = before_tree  # the child runs from that tree, its code
        try:
            before = start_ranker(procs, config, "services.ranker")
        finally:
            launcher_procs.REPO_ROOT = here
        after = start_ranker(procs, config, "services.ranker")
        rows = []
        for length, candidates, rate in SHAPES:
            seen: dict[str, list] = {BEFORE: [], AFTER: []}
            for round_ in range(ROUNDS):
                for label, ranker in ((BEFORE, before), (AFTER, after)):
                    load = LocalLoad()
                    shape = Shape(length, candidates, rate, config.pairs, 0.0, "low")
                    try:
                        point = await measure_point(load, ranker, config, shape, f"ab{round_}-{label[:4]}")
                    finally:
                        await load.close()
                    seen[label].append(point)
                    print(
                        f"# {label} L={length}: not the model {point.non_model_ms:.2f} ms, event loop "
                        f"{point.cpu_ms['event_loop']:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
            for label, points in seen.items():
                rows.append((length, candidates, rate, label, points))
    print(
        "| long-term events | candidates | pairs/s | ranker | CPU not the model, ms a pair (3 rounds) "
        "| median | event loop, median | Rank P50 / P99, median |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for length, candidates, rate, label, points in rows:
        each = ", ".join(f"{p.non_model_ms:.2f}" for p in points)
        print(
            f"| {length} | {candidates} | {rate:g} | {label} | {each} "
            f"| {statistics.median(p.non_model_ms for p in points):.2f} "
            f"| {statistics.median(p.cpu_ms['event_loop'] for p in points):.2f} "
            f"| {statistics.median(p.rank_p50_ms for p in points):.1f} / "
            f"{statistics.median(p.rank_p99_ms for p in points):.1f} |"
        )


@dataclasses.dataclass(frozen=True)
class ServingAb:
    before_tree: str = setting("", "the other checkout, with its generated stubs (required)")

    def validate(self) -> None:
        if not self.before_tree:
            raise ValueError("--before-tree is required")


def main(argv: Sequence[str] | None = None) -> None:
    config = load(ServingAb, argv, prog="python -m bench serving-ab", description=__doc__)
    asyncio.run(compare(Path(config.before_tree)))
