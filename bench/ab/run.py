"""Driving a fixed-load A/B: every mode's fleet up at once, one run of each mode per (seed, load) in turn.

`schedule` is the order: seed by seed, load by load, every mode once at each (seed, load) before the next
one starts, so a drift of the machine's other load hits every mode alike. The modes' order at a (seed,
load) is a Williams row (`bench.lib.orders.turn`, row seed index plus load index): at every load each mode
takes each place in the order (first after the previous block's settle, ..., last) and follows each other
mode equally often over every whole set of seeds, and at one seed the loads start with different modes.
Before the first, each fleet gets `--fleet-warmup-s` of load at the first rate with users of its
own (the seed index after the last measured one), recorded apart: a fleet's first run after its start
read slow. `AbBench.measure` drives one run, once the other fleets are idle
(`bench.lib.driving.Driver.wait_idle`), recording the cores other processes took meanwhile (`disturbed`
flags a run whose arrivals were late or whose machine was busy): `warmup + requests` Recommends open
loop, with the arrivals of its load seed and the users of `bench.lib.driving.users` (named after the mix,
load, window and seed, so every mode sees exactly the same users and arrival times at a (seed, load), and
no run inherits another load's or seed's cache), and no early stop: every run sends all its requests, so
the counts over the SLO of the modes compare. `no-revisit` gets the same users' names with revisit
probability 0 (its point).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from bench.ab.analysis import disturbed
from bench.ab.config import AbConfig
from bench.ab.schema import AbRun
from bench.lib import orders, probes
from bench.lib.driving import SETTLE_S, Driver, Plan, users
from bench.lib.fleets import BenchFleet, Mode
from bench.lib.stats import percentile
from bench.lib.workload import RevisitSampler
from relaygr.v1 import recommend_pb2, recommend_pb2_grpc
from services.loadgen.openloop import CallRecord, run_open_loop

TOP_K = 10


@dataclasses.dataclass(frozen=True)
class Job:
    """One run to drive: a mode at a load with a load seed (its index from the first)."""

    seed_index: int
    rate: float
    mode: str


def schedule(modes: Sequence[str], rates: Sequence[float], seeds: int) -> list[Job]:
    """Every (seed, load) in turn, each mode once at each, in Williams row seed index plus load index."""
    jobs = []
    for seed_index in range(seeds):
        for load_index, rate in enumerate(rates):
            jobs += [Job(seed_index, rate, mode) for mode in orders.turn(modes, seed_index + load_index)]
    return jobs


@dataclasses.dataclass(frozen=True)
class Load:
    """What one run sends: how many requests (warm-up first), at which rate, arrival seed and deadline."""

    rate: float
    warmup: int
    total: int
    timeout_s: float
    seed: int


async def open_loop(address: str, sampler: RevisitSampler, load: Load) -> list[CallRecord]:
    """Every one of the run's Recommends, open loop at the load's Poisson arrivals: nothing stops it."""
    async with grpc.aio.insecure_channel(address) as channel:
        return await run_open_loop(
            recommend_pb2_grpc.RecommendServiceStub(channel).Recommend,
            lambda index: recommend_pb2.RecommendRequest(user_id=sampler.user(index), top_k=TOP_K),
            rate=load.rate,
            total=load.total,
            timeout_s=load.timeout_s,
            seed=load.seed,
        )


class AbBench:
    """Runs a fixed-load A/B; `log` receives one line per step. `fleet` starts a mode's fleet and `drive`
    sends one run's load (a test replaces them)."""

    def __init__(self, config: AbConfig, log_dir: Path, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.bench = Driver(config.bench_config(), log_dir, log)
        self.log = self.bench.log
        self.warmups: list[AbRun] = []  # each fleet's warm-up run, once `run` has driven it

    def fleet(self, mode: Mode) -> contextlib.AbstractContextManager[BenchFleet]:
        return self.bench.fleet(mode)

    def drive(self, address: str, sampler: RevisitSampler, load: Load) -> list[CallRecord]:
        return asyncio.run(open_loop(address, sampler, load))

    def run(self, modes: Sequence[Mode], on_run: Callable[[list[AbRun]], None] | None = None) -> list[AbRun]:
        """Every mode's fleet up at once, then every job of `schedule` in its order; `on_run` hears the
        runs so far after each."""
        c = self.config
        runs: list[AbRun] = []
        with contextlib.ExitStack() as stack:
            fleets = {mode.name: stack.enter_context(self.fleet(mode)) for mode in modes}
            if c.fleet_warmup_s > 0:
                for order, mode in enumerate(modes):
                    # The seed index after the measured ones: users and arrivals of its own (the same in
                    # every mode), so no measured run inherits its cache.
                    job = Job(c.seeds, c.rate_list()[0], mode.name)
                    self.warmups.append(self.measure(fleets[mode.name], job, order, c.fleet_warmup_s))
            jobs = schedule([mode.name for mode in modes], c.rate_list(), c.seeds)
            for order, job in enumerate(jobs):
                runs.append(self.measure(fleets[job.mode], job, order))
                if on_run is not None:
                    on_run(runs)
        return runs

    def measure(self, fleet: BenchFleet, job: Job, order: int, fleet_warmup_s: float = 0.0) -> AbRun:
        """One run of `job` on `fleet`: all its requests, the warm-up's left out; with `fleet_warmup_s`, the
        fleet's warm-up run instead: that many seconds of requests, every one recorded (none counted)."""
        c = self.config
        mix, window = self.bench.mix, c.relay_window_ms
        seed = c.load_seed + job.seed_index
        namespace = users(mix, job.rate, Plan(fleet, 0, window), job.seed_index)
        revisit = c.revisit_probability if fleet.mode.revisits else 0.0
        sampler = RevisitSampler(namespace, job.rate, revisit, c.revisit_window_s, seed)
        warmup, requests = round(job.rate * c.warmup_s), c.requests
        if fleet_warmup_s:
            warmup, requests = 0, max(round(job.rate * fleet_warmup_s), 1)
        load = Load(job.rate, warmup, warmup + requests, (window + c.rank_timeout_ms) / 1000 + 1.0, seed)
        address = fleet.stub(mix, window, 0.0)
        self.bench.wait_idle(fleet)
        before = probes.snapshot(fleet.pids(), {})
        started = time.perf_counter()
        records = self.drive(address, sampler, load)
        wall_s = time.perf_counter() - started
        foreign_cores = probes.difference(before, probes.snapshot(fleet.pids(), {}))["foreign_cores"]
        if [record.index for record in records] != list(range(load.total)):
            raise RuntimeError(f"{job}: {len(records)} of {load.total} requests came back")
        run = dataclasses.replace(
            summarize(records, job, order, namespace, load, wall_s), foreign_cores=foreign_cores
        )
        time.sleep(SETTLE_S)
        over = sum(ms is None or ms > c.slo_ms for ms in run.rank_ms)
        p99 = percentile([float("inf") if ms is None else ms for ms in run.rank_ms], 99)
        flags = disturbed(run, c)
        self.log(
            f"{job.mode:<16} {namespace:<36} {job.rate:>6g}/s seed {seed}: rank P99 {p99:.1f} ms, "
            f"{over} of {len(run.rank_ms)} Ranks over {c.slo_ms:g} ms, {run.errors} err, send lag P99 "
            f"{run.send_lag_p99_ms:g} ms, foreign cores {foreign_cores:g}"
            + (f" (DISTURBED: {'; '.join(flags)})" if flags else "")
            + (" (the fleet's warm-up, not counted)" if fleet_warmup_s else "")
        )
        return run


def summarize(
    records: Sequence[CallRecord], job: Job, order: int, namespace: str, load: Load, wall_s: float
) -> AbRun:
    """A run's record: the latencies of its measured requests in send order (None: failed)."""
    measured = [record for record in records if record.index >= load.warmup]
    return AbRun(
        order=order,
        mode=job.mode,
        rate=job.rate,
        seed=load.seed,
        users=namespace,
        warmup=load.warmup,
        errors=sum(not record.ok for record in measured),
        wall_s=round(wall_s, 2),
        send_lag_p99_ms=round(percentile([r.send_lag_s * 1000 for r in records], 99), 3),
        rank_ms=[round(r.response.rank_latency_ms, 3) if r.ok else None for r in measured],
        recommend_ms=[round(r.latency_s * 1000, 3) if r.ok else None for r in measured],
    )
