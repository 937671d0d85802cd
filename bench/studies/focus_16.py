"""The check behind bench/results/focus-16/results.json: baseline, dram-only and RelayGR on the first mix at
one offered load, 1000 measured requests a point, three user draws each, modes in turn (a point stops
early once it has failed for certain). It uses the benchmark's own fleets and point code.

Run from the repository root: `python -m bench.studies.focus_16 --rate 16`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from bench import codec
from bench.config import BenchConfig
from bench.experiments import Bench, Plan
from bench.fleets import ABLATIONS, BASELINE, RELAY
from services.common.config import load, setting
from services.launcher.procs import REPO_ROOT

HERE = REPO_ROOT / "bench" / "results" / "focus-16"


@dataclasses.dataclass(frozen=True)
class Focus16:
    rate: float = setting(16.0, "offered load of every point, Recommend calls/s", above=0)


def main(argv: Sequence[str] | None = None) -> None:
    rate = load(Focus16, argv, prog="python -m bench.studies.focus_16", description=__doc__).rate
    config = dataclasses.replace(BenchConfig(), profile="full")  # 1000 measured requests a point
    bench = Bench(config, HERE / "tmp" / "logs", log=lambda line: print(line, flush=True))
    dram_only = next(mode for mode in ABLATIONS if mode.name == "dram-only")
    points = []
    with bench.fleet(BASELINE) as base, bench.fleet(RELAY) as relay, bench.fleet(dram_only) as dram:
        for draw in range(3):
            for fleet in (base, dram, relay):
                plan = Plan(fleet, 0, config.relay_window_ms)
                point = codec.to_json(bench.point(plan, bench.mix, rate, seed_index=draw + 7))
                points.append(
                    {
                        "mode": fleet.mode.name,
                        "seed": draw,
                        "rank_ms": point["rank_ms"],
                        "ci": point["rank_p99_ci_ms"],
                        "meets": point["meets_slo"],
                        "measured": point["measured"],
                        "sources": point["cache_sources"],
                    }
                )
    (HERE / "results.json").write_text(json.dumps(points, indent=1))


if __name__ == "__main__":
    main()
