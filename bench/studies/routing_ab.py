"""RelayGR on mix 1 at 32 and 45 req/s, load seeds 0-2, routed directly (the trigger and the stub route
their own calls) against through the router, both fleets up at once; the full profile's 1000 measured
requests a point. From the repository root: `python -m bench.studies.routing_ab` (other loads:
`--rates`); the points go to /tmp/ab/points.json."""

import dataclasses
import json
import time
from pathlib import Path

from bench import codec
from bench.config import BenchConfig
from bench.experiments import Bench, Plan
from bench.fleets import RELAY
from services.common.config import listed, load, numbers

out = Path("/tmp/ab")


@dataclasses.dataclass(frozen=True)
class RoutingAb:
    rates: str = numbers("32,45", "offered loads measured, Recommend calls/s")


def bench(routing: str) -> tuple[BenchConfig, Bench]:
    config = load(BenchConfig, ["--profile", "full", "--name", f"ab-{routing}", "--routing", routing], {})
    return config, Bench(config, out / f"tmp-{routing}", log=lambda line: print(line, flush=True))


direct, router = bench("direct"), bench("router")
rates = listed(load(RoutingAb, prog="python -m bench.studies.routing_ab", description=__doc__), "rates")
points = []
with direct[1].fleet(RELAY) as direct_fleet, router[1].fleet(RELAY) as router_fleet:
    for seed in range(3):
        for rate in rates:
            for name, (config, b), fleet in (
                ("direct", direct, direct_fleet),
                ("router", router, router_fleet),
            ):
                started = time.time()
                plan = Plan(fleet, 0, config.relay_window_ms)
                point = codec.to_json(b.point(plan, b.mix, rate, seed_index=seed))
                point.pop("cost", None)
                points.append({"routing": name, "rate": rate, "seed": seed, "t0": started, **point})
                (out / "points.json").write_text(json.dumps(points, indent=1, default=str))
