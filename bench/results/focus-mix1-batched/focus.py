"""Focused re-measure (not committed): mix 1 at fixed loads, 1000 measured requests, 3 load seeds."""
import json, sys, time
from pathlib import Path
from bench.config import BenchConfig
from bench.experiments import Bench, Plan
from bench.fleets import BASELINE, RELAY
from services.common.config import load

config = load(BenchConfig, ["--profile", "full", "--name", "focus-mix1"], {})
out = Path("/work/runs/focus")
bench = Bench(config, out / "tmp", log=lambda line: print(line, flush=True))
points = []
with bench.fleet(RELAY) as relay, bench.fleet(BASELINE) as baseline:
    jobs = [(baseline, 16), (baseline, 23), (baseline, 45), (relay, 45), (relay, 64)]
    for seed in range(3):
        for fleet, rate in jobs:
            plan = Plan(fleet, 0, config.preprocess_delay_ms)
            point = bench.point(plan, bench.mix, rate, seed_index=seed)
            point.pop("cost", None)
            points.append({"mode": fleet.mode.name, "rate": rate, "seed_index": seed, **point})
            (out / "points.json").write_text(json.dumps(points, indent=1, default=str))
