"""`python -m bench serving-ab`: rankers driven in turn by the same pairs, so that their CPU a pair compares.

The contenders are up at once and are driven in turn at the same rate (`python -m bench serving`'s driver
and CPU probes), `--rounds` rounds whose order rotates, at each of `--shapes`; it prints a markdown table of
each one's CPU a pair that is not the model. They are this checkout's ranker, and:

- another checkout's ranker (`--before-tree`), which needs its generated stubs:

      git worktree add /tmp/before <commit> && cp -r relaygr /tmp/before/
      python -m bench serving-ab --before-tree /tmp/before > bench/results/<name>/ab.md

- with `--stand-ins true`, this checkout's serving floor (`bench.micro.null_ranker`) and its ranker with
  free model passes (`bench.micro.null_model`); each ranker's row then also says what it spends beyond
  the floor driven beside it.

Only ratios within the run count: a shared machine's speed drifts over minutes, which is why the contenders
take turns instead of being measured one after another.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.micro.serving.config import ServingConfig
from bench.micro.serving.pairs import LocalLoad, Point, Shape, measure_point
from bench.micro.serving.run import start_null_ranker, start_ranker
from services.common.config import load, setting
from services.launcher import procs as launcher_procs
from services.launcher.procs import Processes, ServiceProcess

SHAPES = "256:20,1024:12"  # long-term events: pairs a second
CANDIDATES = 512
BEFORE, AFTER, FLOOR, FREE = "before", "this checkout", "serving floor", "free passes"  # the table's names


@dataclasses.dataclass(frozen=True)
class ServingAb:
    before_tree: str = setting("", "another checkout, with its generated stubs, whose ranker is driven too")
    stand_ins: bool = setting(
        False, "also drive the serving floor and the ranker with free model passes (this checkout's)"
    )
    shapes: str = setting(SHAPES, "the points: long-term events:pairs a second, comma-separated")
    rounds: int = setting(3, "rounds; each drives every contender once, in an order that rotates", above=0)
    pairs: int = setting(300, "measured pairs of a point", above=0)
    warmup_pairs: int = setting(30, "pairs sent before a point's measured ones", minimum=0)

    def validate(self) -> None:
        if not self.before_tree and not self.stand_ins:
            raise ValueError("--before-tree or --stand-ins true: this checkout's ranker needs a contender")
        self.shape_list()

    def shape_list(self) -> list[tuple[int, float]]:
        """`--shapes` as (long-term events, pairs a second); a ValueError naming the flag for a bad one."""
        shapes = []
        for shape in self.shapes.split(","):
            length, _, rate = shape.partition(":")
            try:
                parsed = int(length), float(rate)
            except ValueError:
                parsed = (0, 0.0)
            if parsed[0] <= 0 or not parsed[1] > 0:
                raise ValueError(f"--shapes: {shape!r} is not events:pairs-a-second (e.g. 256:20)")
            shapes.append(parsed)
        return shapes


def contenders(
    settings: ServingAb, config: ServingConfig
) -> list[tuple[str, Callable[[Processes], ServiceProcess]]]:
    """(name, start) of each process driven, in the table's order."""
    found: list[tuple[str, Callable[[Processes], ServiceProcess]]] = []
    if settings.stand_ins:
        found.append((FLOOR, start_null_ranker))
        found.append((FREE, lambda procs: start_ranker(procs, config, "bench.micro.null_model")))
    if settings.before_tree:
        found.append((BEFORE, lambda procs: _ranker_of(procs, config, Path(settings.before_tree))))
    found.append((AFTER, lambda procs: start_ranker(procs, config, "services.ranker")))
    return found


def _ranker_of(procs: Processes, config: ServingConfig, tree: Path) -> ServiceProcess:
    here = launcher_procs.REPO_ROOT
    launcher_procs.REPO_ROOT = tree  # the child runs from that tree, its code
    try:
        return start_ranker(procs, config, "services.ranker")
    finally:
        launcher_procs.REPO_ROOT = here


async def compare(settings: ServingAb) -> list[tuple[int, float, str, list[Point]]]:
    """Every contender's points, by shape: (events, pairs a second, name, one point a round)."""
    config = ServingConfig(pairs=settings.pairs, warmup_pairs=settings.warmup_pairs)
    rows = []
    with tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
        running = [(name, start(procs)) for name, start in contenders(settings, config)]
        for length, rate in settings.shape_list():
            seen: dict[str, list[Point]] = {name: [] for name, _ in running}
            for round_ in range(settings.rounds):
                turn = round_ % len(running)
                for name, process in running[turn:] + running[:turn]:
                    load = LocalLoad()
                    shape = Shape(length, CANDIDATES, rate, config.pairs, 0.0, "low")
                    try:
                        point = await measure_point(load, process, config, shape, f"ab{round_}-{name[:4]}")
                    finally:
                        await load.close()
                    seen[name].append(point)
                    print(
                        f"# {name} L={length}: not the model {point.non_model_ms:.2f} ms, event loop "
                        f"{point.cpu_ms['event_loop']:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
            rows.extend((length, rate, name, points) for name, points in seen.items())
    return rows


def table(rows: Sequence[tuple[int, float, str, list[Point]]], rounds: int) -> str:
    """The markdown table of `compare`'s rows; with a serving floor among them, each ranker's CPU beyond it
    (the medians' difference)."""
    floor = {(length, rate): _median(points) for length, rate, name, points in rows if name == FLOOR}
    lines = [
        "| long-term events | candidates | pairs/s | process "
        f"| CPU not the model, ms a pair ({rounds} rounds) "
        "| median | beyond the floor | event loop, median | Rank P50 / P99, median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for length, rate, name, points in rows:
        median = _median(points)
        beyond = floor.get((length, rate))
        each = ", ".join(f"{p.non_model_ms:.2f}" for p in points)
        lines.append(
            f"| {length} | {CANDIDATES} | {rate:g} | {name} | {each} "
            f"| {median:.2f} | {'-' if beyond is None or name == FLOOR else f'{median - beyond:.2f}'} "
            f"| {statistics.median(p.cpu_ms['event_loop'] for p in points):.2f} "
            f"| {statistics.median(p.rank_p50_ms for p in points):.1f} / "
            f"{statistics.median(p.rank_p99_ms for p in points):.1f} |"
        )
    return "\n".join(lines)


def _median(points: Sequence[Point]) -> float:
    return statistics.median(p.non_model_ms for p in points)


def main(argv: Sequence[str] | None = None) -> None:
    settings = load(ServingAb, argv, prog="python -m bench serving-ab", description=__doc__)
    print(table(asyncio.run(compare(settings)), settings.rounds))
