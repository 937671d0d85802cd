"""The check behind bench/results/focus-16/results.json: baseline, dram-only and RelayGR on the first mix at
one offered load, 1000 measured requests a point, three user draws each, modes in turn (a point stops
early once it has failed for certain). It uses the benchmark's own fleets and point code.

Run from the repository root: `python -m bench.studies.focus_16 16`.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from bench.config import BenchConfig
from bench.experiments import Bench, Plan
from bench.fleets import ABLATIONS, BASELINE, RELAY
from services.launcher.procs import REPO_ROOT

HERE = REPO_ROOT / "bench" / "results" / "focus-16"


def main(rate: float) -> None:
    config = dataclasses.replace(BenchConfig(), profile="full")  # 1000 measured requests a point
    bench = Bench(config, HERE / "tmp" / "logs", log=lambda line: print(line, flush=True))
    dram_only = next(mode for mode in ABLATIONS if mode.name == "dram-only")
    points = []
    with bench.fleet(BASELINE) as base, bench.fleet(RELAY) as relay, bench.fleet(dram_only) as dram:
        for draw in range(3):
            for fleet in (base, dram, relay):
                plan = Plan(fleet, 0, config.relay_window_ms)
                point = bench.point(plan, bench.mix, rate, seed_index=draw + 7)
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
    main(float(sys.argv[1]))
