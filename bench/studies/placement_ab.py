"""RelayGR on mix 1 with the trigger's placement by the rankers' queues (`--relay-window-ms`, the fleet's
100 ms window) against every prefix on its ring owner (`--relay-window-ms 0`), both fleets up at once, load
seeds 0-2. Each run sends 1500 Recommends open loop and counts the last 1275 (after 5 s at the rate) with
no early stop, so the counts of Ranks over the SLO compare. From the repository root:
`python -m bench.studies.placement_ab --rate 45`; rows go to
/tmp/placement-ab/rows.json."""

import asyncio
import dataclasses
import json
from pathlib import Path

import grpc

from bench.config import BenchConfig
from bench.experiments import Bench, Plan, users
from bench.fleets import RELAY
from bench.workload import RevisitSampler
from relaygr.v1 import recommend_pb2, recommend_pb2_grpc
from services.common.config import load, setting
from services.loadgen.openloop import run_open_loop

SENT, WARM_UP = 1500, 225
out = Path("/tmp/placement-ab")
config = load(BenchConfig, ["--profile", "full", "--name", "placement-ab"], {})
bench = Bench(config, out / "tmp", log=lambda line: print(line, flush=True))
OWNER_ONLY = dataclasses.replace(RELAY, name="relay-owner-only", trigger_args="--relay-window-ms 0")


@dataclasses.dataclass(frozen=True)
class PlacementAb:
    rate: float = setting(45.0, "offered load of every run, Recommend calls/s", above=0)


rate = load(PlacementAb, prog="python -m bench.studies.placement_ab", description=__doc__).rate


async def drive(address: str, sampler: RevisitSampler, seed: int) -> list:
    async with grpc.aio.insecure_channel(address) as channel:
        return await run_open_loop(
            recommend_pb2_grpc.RecommendServiceStub(channel).Recommend,
            lambda i: recommend_pb2.RecommendRequest(user_id=sampler.user(i), top_k=10),
            rate=rate,
            total=SENT,
            timeout_s=3,
            seed=seed,
        )


rows = []
with bench.fleet(RELAY) as placed, bench.fleet(OWNER_ONLY) as owner_only:
    for seed_index in range(3):
        for variant, fleet in (("placement", placed), ("owner-only", owner_only)):
            plan = Plan(fleet, 0, config.relay_window_ms)
            seed = config.load_seed + seed_index
            sampler = RevisitSampler(
                users(bench.mix, rate, plan, seed_index), rate, config.revisit_probability,
                config.revisit_window_s, seed,
            )  # fmt: skip
            records = [r for r in asyncio.run(drive(fleet.stub(bench.mix, plan.delay_ms, 0), sampler, seed))]
            measured = [r for r in records if r.index >= WARM_UP]
            ranks = sorted(r.response.rank_latency_ms if r.ok else float("inf") for r in measured)
            rows.append(
                {
                    "variant": variant,
                    "seed": seed_index,
                    "rate": rate,
                    "n": len(ranks),
                    "over100": sum(ms > config.slo_ms for ms in ranks),
                    "p50": ranks[len(ranks) // 2],
                    "p99": ranks[int(len(ranks) * 0.99)],
                    "wait_over_50": sum(r.ok and r.response.prefix_wait_ms > 50 for r in measured),
                }
            )
            out.mkdir(parents=True, exist_ok=True)
            (out / "rows.json").write_text(json.dumps(rows, indent=1))
