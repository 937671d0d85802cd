"""`python -m bench serving --in-turn-against …`: rankers driven in turn by the same pairs, so that their
CPU a pair compares (a shared machine's speed drifts over minutes: only figures measured together do).

The contenders are up at once and driven in turn at the same rate (`point.measure_point`), `--rounds`
rounds whose order rotates, at each of `--shapes`; it prints a markdown table of each one's CPU a pair that
is not the model. They are this checkout's ranker and: with `before`, another checkout's (`--before-tree`,
with its generated stubs: `git worktree add /tmp/before <commit> && cp -r relaygr /tmp/before/`); with
`stand-ins`, the serving floor and the free-pass ranker, each ranker's row then saying what it spends
beyond the floor driven beside it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.micro.serving.config import ServingConfig
from bench.micro.serving.generator import LocalLoad
from bench.micro.serving.point import Point, Shape, measure_point
from bench.micro.serving.run import NULL_RANKER, start
from services.common.config import listed
from services.launcher import procs as launcher_procs
from services.launcher.procs import Processes, ServiceProcess

BEFORE, AFTER, FLOOR, FREE = "before", "this checkout", "serving floor", "free passes"  # the table's names


def contenders(config: ServingConfig) -> list[tuple[str, str, str]]:
    """(name, module, tree: another checkout's, or empty) of each process driven, in the table's order."""
    against, found = listed(config, "in_turn_against"), []
    if "stand-ins" in against:
        found += [(FLOOR, NULL_RANKER, ""), (FREE, "bench.micro.null_model", "")]
    if "before" in against:
        found.append((BEFORE, "services.ranker", config.before_tree))
    return [*found, (AFTER, "services.ranker", "")]


def _start(procs: Processes, config: ServingConfig, module: str, tree: str) -> ServiceProcess:
    here = launcher_procs.REPO_ROOT
    launcher_procs.REPO_ROOT = Path(tree) if tree else here  # the child runs from that tree, its code
    try:
        return start(procs, config, module)
    finally:
        launcher_procs.REPO_ROOT = here


async def compare(config: ServingConfig) -> list[tuple[int, float, str, list[Point]]]:
    """Every contender's points, by shape: (events, pairs a second, name, one point a round)."""
    rows = []
    with tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
        running = [(name, _start(procs, config, *where)) for name, *where in contenders(config)]
        for length, rate in config.shape_list():
            seen: dict[str, list[Point]] = {name: [] for name, _ in running}
            for round_ in range(config.rounds):
                turn = round_ % len(running)
                for name, process in running[turn:] + running[:turn]:
                    load = LocalLoad()
                    shape = Shape(length, config.candidates, rate, config.pairs, 0.0, "low")
                    try:
                        point = await measure_point(load, process, config, shape, f"ab{round_}-{name[:4]}")
                    finally:
                        await load.close()
                    seen[name].append(point)
                    own, loop_ms = point.non_model_ms, point.cpu_ms["event_loop"]
                    print(
                        f"# {name} L={length}: not the model {own:.2f} ms, event loop {loop_ms:.2f}",
                        file=sys.stderr,
                    )
            rows.extend((length, rate, name, points) for name, points in seen.items())
    return rows


def table(rows: Sequence[tuple[int, float, str, list[Point]]], config: ServingConfig) -> str:
    """The markdown table of `compare`'s rows; with a serving floor among them, each ranker's CPU beyond it
    (the medians' difference)."""
    floor = {(length, rate): _median(points) for length, rate, name, points in rows if name == FLOOR}
    lines = [
        "| long-term events | candidates | pairs/s | process "
        f"| CPU not the model, ms a pair ({config.rounds} rounds) "
        "| median | beyond the floor | event loop, median | Rank P50 / P99, median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for length, rate, name, points in rows:
        median = _median(points)
        beyond = floor.get((length, rate))
        each = ", ".join(f"{p.non_model_ms:.2f}" for p in points)
        lines.append(
            f"| {length} | {config.candidates} | {rate:g} | {name} | {each} "
            f"| {median:.2f} | {'-' if beyond is None or name == FLOOR else f'{median - beyond:.2f}'} "
            f"| {statistics.median(p.cpu_ms['event_loop'] for p in points):.2f} "
            f"| {statistics.median(p.rank_p50_ms for p in points):.1f} / "
            f"{statistics.median(p.rank_p99_ms for p in points):.1f} |"
        )
    return "\n".join(lines)


def _median(points: Sequence[Point]) -> float:
    return statistics.median(p.non_model_ms for p in points)
