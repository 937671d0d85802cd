"""Open-loop Recommends at a fleet's retrieval stub, the one driver every command that loads a stub uses:
`recommend` sends them for the users a sampler draws (`services.loadgen.run_open_loop`: Poisson arrivals,
latency from each call's intended send time), for a duration under the rollout; `open_loop` sends a
`Load`, under `run`'s points (`bench.lib.points.run_point`, which may stop one early) and whole runs;
`Sender.send` drives one whole run at a fleet, every request sent, as `ab` and `headline` do, and keeps
its records with its wall time and the cores other processes took meanwhile (`Sent`); `bench_config`
starts a command's fleets (`bench.lib.driving.Driver`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import grpc

from bench.lib import probes
from bench.lib.config import BenchConfig
from bench.lib.fleets import BenchFleet, Mode, WorkloadSettings
from bench.lib.stats import percentile
from bench.lib.workload import Population, RevisitSampler
from relaygr.v1 import recommend_pb2, recommend_pb2_grpc
from services.loadgen.openloop import CallRecord, run_open_loop

TOP_K = 10


@dataclasses.dataclass(frozen=True)
class Load:
    """What one run sends: `total` Recommends, the first `warmup` not measured, at `rate` with the arrivals
    of `seed`, each with a deadline of `timeout_s`."""

    rate: float
    warmup: int
    total: int
    timeout_s: float
    seed: int

    @classmethod
    def of(
        cls, rate: float, warmup: int, measured: int, seed: int, window_ms: float, rank_timeout_ms: float
    ) -> Load:
        """`warmup` then `measured` Recommends, each given the relay window, the Rank deadline and 1 s."""
        return cls(rate, warmup, warmup + measured, (window_ms + rank_timeout_ms) / 1000 + 1.0, seed)


def sampler(workload: WorkloadSettings, mode: Mode, namespace: str, rate: float, seed: int) -> RevisitSampler:
    """The users of `namespace`, revisiting as `workload` says unless `mode` never revisits (`no-revisit`)."""
    revisit = workload.revisit_probability if mode.revisits else 0.0
    return RevisitSampler(namespace, rate, revisit, workload.revisit_window_s, seed)


async def recommend(address: str, sampler: RevisitSampler | Population, **options: Any) -> list[CallRecord]:
    """Recommends for the users `sampler` draws at the stub at `address`; `options` go to `run_open_loop`
    (its rate, its end: a total or a duration, `stop`, `on_record`…)."""
    async with grpc.aio.insecure_channel(address) as channel:
        return await run_open_loop(
            recommend_pb2_grpc.RecommendServiceStub(channel).Recommend,
            lambda index: recommend_pb2.RecommendRequest(user_id=sampler.user(index), top_k=TOP_K),
            **options,
        )


async def open_loop(address: str, sampler: RevisitSampler, load: Load, **options: Any) -> list[CallRecord]:
    """`load` at the stub at `address`; `options` go to `run_open_loop` (`stop`, `on_record`)."""
    return await recommend(
        address,
        sampler,
        rate=load.rate,
        total=load.total,
        timeout_s=load.timeout_s,
        seed=load.seed,
        **options,
    )


@dataclasses.dataclass(frozen=True)
class Sent:
    """One run: every record in send order (the load's warm-up first), its wall time and the cores other
    processes took meanwhile."""

    load: Load
    records: list[CallRecord]
    wall_s: float
    foreign_cores: float

    @property
    def measured(self) -> list[CallRecord]:
        return self.records[self.load.warmup :]

    def rank_ms(self) -> list[float | None]:
        """The stub's Rank latency of each measured request; None: it failed."""
        return [round(r.response.rank_latency_ms, 3) if r.ok else None for r in self.measured]

    def recommend_ms(self) -> list[float | None]:
        """Each measured Recommend's latency from its intended send time; None: it failed."""
        return [round(r.latency_s * 1000, 3) if r.ok else None for r in self.measured]

    def summary(self) -> dict[str, Any]:
        """What a run's record keeps of it: its measured requests' errors and Rank latencies, its wall time,
        its load generator's send lag P99 (every request) and the other processes' cores."""
        lags_ms = [record.send_lag_s * 1000 for record in self.records]
        return {
            "errors": sum(not record.ok for record in self.measured),
            "wall_s": self.wall_s,
            "send_lag_p99_ms": round(percentile(lags_ms, 99), 3),
            "foreign_cores": self.foreign_cores,
            "rank_ms": self.rank_ms(),
        }


class Sender:
    """Sends whole runs; a test replaces `drive` (the traffic) and `foreign_cores` (the machine)."""

    def send(self, fleet: BenchFleet, address: str, sampler: RevisitSampler, load: Load) -> Sent:
        """One run of `load` at `fleet`'s stub at `address`: every request sent, and every one answered or
        failed (else RuntimeError)."""
        before = probes.snapshot(fleet.pids(), {})
        started = time.perf_counter()
        records = self.drive(address, sampler, load)
        wall_s = round(time.perf_counter() - started, 2)
        foreign_cores = self.foreign_cores(fleet, before)
        if [record.index for record in records] != list(range(load.total)):
            raise RuntimeError(f"{address}: {len(records)} of {load.total} requests came back")
        return Sent(load, records, wall_s, foreign_cores)

    def drive(self, address: str, sampler: RevisitSampler, load: Load) -> list[CallRecord]:
        return asyncio.run(open_loop(address, sampler, load))

    def foreign_cores(self, fleet: BenchFleet, before: dict[str, Any]) -> float:
        """The cores other processes than the fleet's and the load generator took since `before`."""
        return float(probes.difference(before, probes.snapshot(fleet.pids(), {}))["foreign_cores"])


def bench_config(settings: WorkloadSettings, **bounds: Any) -> BenchConfig:
    """The `BenchConfig` that starts a command's fleets: the settings it shares with `settings`, then
    `bounds`, the rest at their defaults, and one mix (the rankers' longest history is its cap)."""
    names = {f.name for f in dataclasses.fields(settings)}
    mine = {f.name: getattr(settings, f.name) for f in dataclasses.fields(BenchConfig) if f.name in names}
    return dataclasses.replace(
        BenchConfig(),
        **{**mine, **bounds},
        lengths=str(settings.mix_max),
        growth_headroom=0,
        mix2_median=settings.mix_median,
        mix2_max=settings.mix_max,
    )
