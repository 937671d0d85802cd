"""The focused re-measure of README.md: mix 1 at fixed loads, the full profile's 1000 measured requests a
point, load seeds 0-2, both fleets up at once as in `python -m bench`. Run from the repository root:
`python -m bench.studies.focus_mix1_batched`; the points go to
/tmp/focus-mix1."""

import json
from pathlib import Path

from bench import codec
from bench.config import BenchConfig
from bench.experiments import Bench, Plan
from bench.fleets import BASELINE, RELAY
from services.common.config import load

config = load(BenchConfig, ["--profile", "full", "--name", "focus-mix1"], {})
out = Path("/tmp/focus-mix1")
bench = Bench(config, out / "tmp", log=lambda line: print(line, flush=True))
points = []
with bench.fleet(RELAY) as relay, bench.fleet(BASELINE) as baseline:
    jobs = [(baseline, 16), (baseline, 23), (baseline, 45), (relay, 45), (relay, 64)]
    for seed in range(3):
        for fleet, rate in jobs:
            plan = Plan(fleet, 0, config.relay_window_ms)
            point = codec.to_json(bench.point(plan, bench.mix, rate, seed_index=seed))
            point.pop("cost", None)
            points.append({"mode": fleet.mode.name, "rate": rate, "seed_index": seed, **point})
            out.mkdir(parents=True, exist_ok=True)
            (out / "points.json").write_text(json.dumps(points, indent=1, default=str))
