"""Driving the block experiment: the calibration, the fleets, the blocks and their trials.

`HeadlineBench.run`:

1. calibrates on the idle host, before any fleet starts (`calibrate`): u (the median of `--unit-timings`
   full passes at the mix's cap), L = λ / u (`bench.headline.config.load_rate`), the SLO and the relay
   window in u, and the steal share. The fleets run with that SLO and relay window in ms;
2. starts the baseline's, RelayGR's and admit-all's fleets, each given `FLEET_WARMUP_S` of load at L with
   users of its own (recorded nowhere), and reads the canary's reference with them up and drained
   (`reference`);
3. runs the blocks in their Williams orders (`bench.lib.orders.block_orders`), block b on arrival seed
   `--load-seed` + b. A block first times u again on the drained host: its L is λ over its own u, and its
   SLO 2.87 times it, so a host that runs slower for a while is loaded at the same share of its speed
   instead of past its knee. Before each trial every fleet
   drains to idle (`Driver.wait_idle`) and the canary reads the host; the trial sends
   `round(rate * --warmup-s)` Recommends at its own rate, unmeasured, then its fixed count, open loop, with
   no early stop, the canary reading once a second beside it;
4. after each block, computes its slowdown s against the host's speed so far (the median of the reference
   readings and every block's idle readings, its own included) and the most cores other processes took
   during one of its trials; a block over `--drift-limit` or `--foreign-limit` is kept in the results but
   left out of the headline, and the run tops up with a block of the same order on a new
   seed, while the budget (`--budget-min`, with the longest block so far as the estimate) allows.

A trial's users are named after the load, the relay window and the block's seed
(`bench.lib.driving.users`): the arms at one load see the same users and arrivals, no trial inherits
another's cache, and a top-up's are new.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from bench.headline import stats
from bench.headline.analysis import trial_p99
from bench.headline.canary import Canary, cpu_times, steal_share
from bench.headline.config import ADMIT_ALL, BASELINE, LOAD_PER_U, RELAY, Arm, HeadlineConfig, load_rate
from bench.headline.schema import Block, Calibration, Over, Trial
from bench.lib import orders, probes
from bench.lib.config import BenchConfig
from bench.lib.driving import SETTLE_S, Driver, Plan, users
from bench.lib.fleets import ABLATIONS, BenchFleet, Mode
from bench.lib.fleets import BASELINE as BASELINE_MODE
from bench.lib.fleets import RELAY as RELAY_MODE
from bench.lib.stats import percentile
from bench.lib.workload import RevisitSampler
from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc, trigger_pb2
from services.loadgen.openloop import CallRecord, run_open_loop

TOP_K = 10
FLEET_WARMUP_S = 30.0  # each fleet's load at L before the first block, users of its own, not recorded
CALIBRATION_CANARY_READINGS = 15
MODES = {
    BASELINE: BASELINE_MODE,
    RELAY: RELAY_MODE,
    ADMIT_ALL: next(m for m in ABLATIONS if m.name == ADMIT_ALL),
}


def enum_name(enum: object, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower()  # type: ignore[attr-defined]


class _Driver(Driver):
    """The benchmark's `Driver` with the experiment's own fleet warm-up (at L, `FLEET_WARMUP_S`)."""

    warm: Callable[[BenchFleet], None] = staticmethod(lambda fleet: None)

    def warm_up(self, fleet: BenchFleet) -> None:
        self.warm(fleet)


class HeadlineBench:
    """Runs the block experiment; `log` receives one line per step. `drive` sends one trial's load (a test
    replaces it, and `fleets`)."""

    def __init__(self, config: HeadlineConfig, log_dir: Path, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log_dir = log_dir
        self._log = log
        self.started = time.monotonic()
        self.calibration: Calibration | None = None
        self.driver: _Driver | None = None
        self.blocks: list[Block] = []
        self.trials: list[Trial] = []

    def log(self, text: str) -> None:
        self._log(f"[{time.monotonic() - self.started:6.0f}s] {text}")

    # ---- calibration ----

    def calibrate(self, canary: Canary) -> Calibration:
        c = self.config
        before = cpu_times()
        timings = canary.unit_timings(c.mix_max, c.unit_timings)
        readings = canary.readings(CALIBRATION_CANARY_READINGS)
        u = stats.host_unit(timings)
        calibration = Calibration(
            u_ms=round(u, 3),
            unit_length=c.mix_max,
            unit_timings_ms=timings,
            load_per_u=LOAD_PER_U,
            rate=load_rate(u),
            slo_ms=round(c.slo_u * u, 1),
            relay_window_ms=c.relay_window_ms or round(c.relay_window_u * u, 1),
            canary_reference_ms=round(statistics.median(readings), 4),
            canary_readings_ms=readings,
            steal_share=steal_share(before, cpu_times()),
        )
        self.log(
            f"u = {calibration.u_ms:g} ms (median of {len(timings)} full passes at {c.mix_max} events, "
            f"{min(timings):g}-{max(timings):g}); L = {LOAD_PER_U:g} / u = {calibration.rate:g} req/s; "
            f"SLO {c.slo_u:g} u = {calibration.slo_ms:g} ms; "
            f"relay window {calibration.relay_window_ms:g} ms; "
            f"canary {calibration.canary_reference_ms:g} ms; steal {calibration.steal_share:.1%}"
        )
        return calibration

    def bench_config(self, calibration: Calibration) -> BenchConfig:
        """The benchmark's settings that start the fleets (`Driver`): the shared ones from here, the bounds
        in ms from the calibration, one mix (the rankers' longest history is its cap)."""
        c = self.config
        shared = {field.name for field in dataclasses.fields(BenchConfig)}
        mine = {
            f.name: getattr(c, f.name)
            for f in dataclasses.fields(c)
            if f.name in shared - {"relay_window_ms"}
        }
        return dataclasses.replace(
            BenchConfig(),
            **mine,
            slo_ms=calibration.slo_ms,
            relay_window_ms=calibration.relay_window_ms,
            lengths=str(c.mix_max),
            growth_headroom=0,
            mix2_median=c.mix_median,
            mix2_max=c.mix_max,
        )

    # ---- the run ----

    def fleets(self, driver: Driver, stack: contextlib.ExitStack) -> dict[str, BenchFleet]:
        return {name: stack.enter_context(driver.fleet(mode)) for name, mode in MODES.items()}

    def run(self, on_block: Callable[[], None] | None = None) -> None:
        """Calibrates, starts the fleets and runs the blocks; `on_block` hears after each block."""
        c = self.config
        arms = c.arms()
        by_name = {arm.name: arm for arm in arms}
        design = orders.block_orders([arm.name for arm in arms], c.blocks, c.order_seed)
        self.design = design
        with Canary(
            c.model_preset, c.torch_threads, c.short_term, BenchConfig().pre_infer_chunk_tokens
        ) as canary:
            self.calibration = calibration = self.calibrate(canary)
            self.driver = driver = _Driver(self.bench_config(calibration), self.log_dir, self._log)
            driver.warm = self.fleet_warm_up
            budget_end = self.started + c.budget_min * 60
            with contextlib.ExitStack() as stack:
                fleets = self.fleets(driver, stack)
                self.reference(canary)
                queue: collections.deque[tuple[list[str], int | None]] = collections.deque(
                    (order, None) for order in design
                )
                longest = 0.0
                while queue:
                    order, replaces = queue.popleft()
                    index = len(self.blocks)
                    if index and time.monotonic() + longest > budget_end:
                        self.log(
                            f"budget: {len(queue) + 1} block(s) not run (the longest took {longest:.0f} s)"
                        )
                        break
                    started = time.monotonic()
                    block = self.block(index, [by_name[name] for name in order], fleets, canary, replaces)
                    longest = max(longest, time.monotonic() - started)
                    if not block.kept:
                        queue.append((order, index if replaces is None else replaces))
                    if on_block is not None:
                        on_block()

    def reference(self, canary: Canary) -> None:
        """The canary's first reference readings, with the fleets up, warm and drained: the conditions of
        every block's idle readings (a host without the fleets' processes reads faster)."""
        assert self.calibration is not None and self.driver is not None
        self.driver.wait_idle(None)
        readings = canary.readings(CALIBRATION_CANARY_READINGS)
        self.calibration = dataclasses.replace(
            self.calibration,
            canary_reference_ms=round(statistics.median(readings), 4),
            canary_readings_ms=readings,
        )
        self.log(f"canary with the fleets up and idle: {self.calibration.canary_reference_ms:g} ms")

    def fleet_warm_up(self, fleet: BenchFleet) -> None:
        """`FLEET_WARMUP_S` of load at L with users of its own: warm processes and a DRAM tier as filled as
        a measured trial's before the first block."""
        calibration = self.calibration
        assert calibration is not None
        rate = calibration.rate
        sampler = RevisitSampler(
            "fleet-warmup", rate, self.revisit(fleet.mode), self.config.revisit_window_s, 0
        )
        records = self.drive(fleet, sampler, rate, max(round(rate * FLEET_WARMUP_S), 1), 0)
        ranks = [r.response.rank_latency_ms for r in records if r.ok]
        self.log(f"{fleet.mode.name} fleet warmed up: {len(records)} Recommends at {rate:g}/s, rank P99 "
                 f"{percentile(ranks, 99) if ranks else float('nan'):.1f} ms (not recorded)")  # fmt: skip

    def revisit(self, mode: Mode) -> float:
        return self.config.revisit_probability if mode.revisits else 0.0

    def block(
        self,
        index: int,
        order: Sequence[Arm],
        fleets: dict[str, BenchFleet],
        canary: Canary,
        replaces: int | None,
    ) -> Block:
        c, calibration = self.config, self.calibration
        assert calibration is not None and self.driver is not None
        seed = c.load_seed + index
        started, before = time.monotonic(), cpu_times()
        self.driver.wait_idle(None)
        timings = canary.unit_timings(c.mix_max, c.unit_timings)
        u = stats.host_unit(timings)
        rate, slo_ms = load_rate(u), round(c.slo_u * u, 1)
        self.log(f"block {index}: u = {u:g} ms ({min(timings):g}-{max(timings):g}), L = {rate:g} req/s, "
                 f"SLO {slo_ms:g} ms")  # fmt: skip
        trials = [self.trial(index, position, arm, fleets[arm.mode], canary, seed, rate, slo_ms)
                  for position, arm in enumerate(order)]  # fmt: skip
        self.trials += trials
        idle = [reading for trial in trials for reading in trial.canary_idle_ms]
        steal = steal_share(before, cpu_times())
        # The host's speed so far: the median of the reference readings and every idle reading of the run's
        # blocks, this one's included, so one fast or slow reading does not decide a block. (The readings
        # taken with a block's u are not among them: the canary reads faster right after the unit passes.)
        every = [*calibration.canary_readings_ms, *(r for trial in self.trials for r in trial.canary_idle_ms)]
        reference = statistics.median(every)
        slowdown = stats.slowdown(idle, reference, steal, calibration.steal_share)
        foreign = max(trial.foreign_cores for trial in trials)
        block = Block(
            index=index,
            seed=seed,
            order=[arm.name for arm in order],
            topped_up_for=replaces,
            started_s=round(started - self.started, 1),
            duration_s=round(time.monotonic() - started, 1),
            canary_ms=round(statistics.median(idle), 4),
            canary_reference_ms=round(reference, 4),
            u_ms=round(u, 3),
            unit_timings_ms=timings,
            rate=rate,
            slo_ms=slo_ms,
            steal_share=steal,
            slowdown=round(slowdown, 4),
            foreign_cores=foreign,
            kept=stats.kept_blocks([slowdown], c.drift_limit, [foreign], c.foreign_limit)[0],
        )
        self.blocks.append(block)
        baseline = next(t for t in trials if t.mode == BASELINE)
        self.log(
            f"block {index} (seed {seed}{'' if replaces is None else f', for block {replaces}'}): "
            f"{block.duration_s:.0f} s, s = {slowdown:.3f} (canary {block.canary_ms:g} against "
            f"{reference:g} ms, steal {steal:.1%})"
            f", other processes {foreign:g} cores{'' if block.kept else ': left out'}; baseline P99 "
            f"{trial_p99(baseline):.1f} ms"
        )
        return block

    def trial(
        self,
        block: int,
        position: int,
        arm: Arm,
        fleet: BenchFleet,
        canary: Canary,
        seed: int,
        load: float,
        slo_ms: float,
    ) -> Trial:
        """One arm's trial at its multiple of the block's L (`load`), its Ranks over `slo_ms` listed: drained
        fleets, the canary on the idle host, then its load with the canary beside it."""
        c, calibration, driver = self.config, self.calibration, self.driver
        assert calibration is not None and driver is not None
        rate = round(arm.multiple * load, 3)
        plan = Plan(fleet, 0, calibration.relay_window_ms)
        namespace = users(driver.mix, rate, plan, seed - c.load_seed)
        sampler = RevisitSampler(namespace, rate, self.revisit(fleet.mode), c.revisit_window_s, seed)
        warmup = round(rate * c.warmup_s)
        total = warmup + c.measured_requests(arm)
        driver.wait_idle(None)
        idle = canary.readings(c.canary_readings)
        steal_before, cpu_before = cpu_times(), self.cpu_snapshot(fleet)
        started = time.monotonic()
        with canary.beside() as under_load:
            records = self.drive(fleet, sampler, rate, total, seed)
        wall_s = time.monotonic() - started
        foreign = self.foreign_cores(cpu_before, fleet)
        steal = steal_share(steal_before, cpu_times())
        if [record.index for record in records] != list(range(total)):
            raise RuntimeError(f"{arm.name}, block {block}: {len(records)} of {total} requests came back")
        measured = records[warmup:]
        trial = Trial(
            block=block,
            position=position,
            arm=arm.name,
            mode=arm.mode,
            multiple=arm.multiple,
            rate=rate,
            seed=seed,
            users=namespace,
            warmup=warmup,
            errors=sum(not r.ok for r in measured),
            started_s=round(started - self.started, 1),
            wall_s=round(wall_s, 2),
            send_lag_p99_ms=round(percentile([r.send_lag_s * 1000 for r in records], 99), 3),
            foreign_cores=round(foreign, 3),
            steal_share=steal,
            canary_idle_ms=idle,
            canary_load_ms=list(under_load),
            sources=dict(collections.Counter(source(r) for r in measured)),
            rank_ms=[round(r.response.rank_latency_ms, 3) if r.ok else None for r in measured],
            over=[
                over(i, r) for i, r in enumerate(measured) if not r.ok or r.response.rank_latency_ms > slo_ms
            ],
        )
        time.sleep(SETTLE_S)
        self.log(
            f"  {arm.name:<14} {rate:>7g}/s: rank P99 {trial_p99(trial):.1f} ms, {len(trial.over)} of "
            f"{len(trial.rank_ms)} over {slo_ms:g} ms, {trial.errors} err, canary "
            f"{statistics.median(idle):g} ms idle, send lag P99 {trial.send_lag_p99_ms:g} ms"
        )
        return trial

    def cpu_snapshot(self, fleet: BenchFleet) -> dict[str, object]:
        """The CPU seconds of the machine, of the fleet's processes and of the load generator."""
        return probes.snapshot(fleet.pids(), {})

    def foreign_cores(self, before: dict[str, object], fleet: BenchFleet) -> float:
        """The cores that processes other than the fleet's and the load generator took since `before`."""
        return float(probes.difference(before, self.cpu_snapshot(fleet))["foreign_cores"])

    def drive(
        self, fleet: BenchFleet, sampler: RevisitSampler, rate: float, total: int, seed: int
    ) -> list[CallRecord]:
        """`total` Recommends to the fleet's stub, open loop at `rate` with the arrivals of `seed`."""
        calibration, driver = self.calibration, self.driver
        assert calibration is not None and driver is not None
        address = fleet.stub(driver.mix, calibration.relay_window_ms)
        timeout_s = (calibration.relay_window_ms + self.config.rank_timeout_ms) / 1000 + 1.0
        return asyncio.run(open_loop(address, sampler, rate, total, timeout_s, seed))


async def open_loop(
    address: str, sampler: RevisitSampler, rate: float, total: int, timeout_s: float, seed: int
) -> list[CallRecord]:
    async with grpc.aio.insecure_channel(address) as channel:
        return await run_open_loop(
            recommend_pb2_grpc.RecommendServiceStub(channel).Recommend,
            lambda index: recommend_pb2.RecommendRequest(user_id=sampler.user(index), top_k=TOP_K),
            rate=rate,
            total=total,
            timeout_s=timeout_s,
            seed=seed,
        )


def source(record: CallRecord) -> str:
    if not record.ok:
        return "failed"
    return enum_name(common_pb2.CacheSource, record.response.cache_source, "CACHE_SOURCE_")


def over(index: int, record: CallRecord) -> Over:
    if not record.ok:
        return Over(index=index, rank_ms=None, source="failed", miss_reason="", admit_reason="", long_term=0,
                    prefix_wait_ms=0.0, computed_events=0)  # fmt: skip
    r = record.response
    return Over(
        index=index,
        rank_ms=round(r.rank_latency_ms, 3),
        source=source(record),
        miss_reason=enum_name(common_pb2.MissReason, r.miss_reason, "MISS_REASON_"),
        admit_reason=enum_name(trigger_pb2.AdmitReason, r.admit_reason, "ADMIT_REASON_"),
        long_term=r.long_term_length,
        prefix_wait_ms=round(r.prefix_wait_ms, 3),
        computed_events=r.computed_prefix_events,
    )
