"""`python -m bench headline`: the headline, measured in randomized interleaved blocks (docs/benchmark.md).

`HeadlineBench.run` calibrates on the idle host before any fleet starts (u, the median of
`--unit-timings` full passes at the mix's cap; L = λ / u, `bench.headline.config.load_rate`; the SLO and
the relay window in u, with which the fleets run in ms; the steal share), starts the baseline's,
RelayGR's and admit-all's fleets, gives each `FLEET_WARMUP_S` of load at L with users of its own
(recorded nowhere) and reads the canary's reference with them up and drained. Then the blocks, in their
Williams orders (`bench.lib.orders.block_orders`), block b on arrival seed `--load-seed` + b: a block
times u again on the drained host and takes its L and SLO from it, so a host that runs slower for a while
is loaded at the same share of its speed. Before each trial every fleet drains (`Driver.wait_idle`) and
the canary reads the idle host; the trial sends `round(rate * --warmup-s)` unmeasured Recommends at its
own rate, then its fixed count, open loop, no early stop (`bench.lib.recommends`), the canary reading
once a second beside it. After each block, its slowdown s against the host's speed so far (the median of
the reference readings and every block's idle readings, its own included) and the most cores other
processes took during one of its trials: a block over `--drift-limit` or `--foreign-limit` stays in the
results but out of the headline, and the run tops up with a block of the same order on a new seed while
the budget (`--budget-min`, the longest block so far as the estimate) allows.

A trial's users are named after the load, the relay window and the block's seed
(`bench.lib.driving.users`): the arms at one load see the same users and arrivals, no trial inherits
another's cache, and a top-up's are new. results.json, report.md and the plot go to bench/results/<name>/
(rewritten after every block, the analysis at the end), the services' logs to its tmp/ folder.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.headline import stats
from bench.headline.canary import Canary, cpu_times, steal_share
from bench.headline.config import ADMIT_ALL, BASELINE, LOAD_PER_U, RELAY, Arm, HeadlineConfig, load_rate
from bench.headline.report import claim, draw, render_markdown
from bench.headline.schema import Block, Calibration, HeadlineResults, Over, Trial, analyse, trial_p99
from bench.lib import orders
from bench.lib.config import BenchConfig
from bench.lib.context import git_commit, machine, versions
from bench.lib.driving import SETTLE_S, Driver, Plan, users
from bench.lib.fleets import ABLATIONS, BenchFleet
from bench.lib.fleets import BASELINE as BASELINE_MODE
from bench.lib.fleets import RELAY as RELAY_MODE
from bench.lib.recommends import Load, Sender, Sent, bench_config, sampler
from relaygr.v1 import common_pb2, trigger_pb2
from services.common.config import load
from services.common.contract import cache_source_label
from services.loadgen.openloop import CallRecord

FLEET_WARMUP_S = 30.0  # each fleet's load at L before the first block, users of its own, not recorded
REFERENCE_READINGS = 15  # the canary's reference readings, with the fleets up and drained
MODES = {
    BASELINE: BASELINE_MODE,
    RELAY: RELAY_MODE,
    ADMIT_ALL: next(m for m in ABLATIONS if m.name == ADMIT_ALL),
}


class HeadlineBench(Sender):
    """Runs the block experiment; `log` receives one line per step. A test replaces `fleets`, `drive` and
    `foreign_cores`."""

    def __init__(self, config: HeadlineConfig, log_dir: Path, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log_dir = log_dir
        self._log = log
        self.started = time.monotonic()
        self.calibration: Calibration | None = None
        self.driver: Driver | None = None
        self.design: list[list[str]] = []
        self.blocks: list[Block] = []
        self.trials: list[Trial] = []

    def log(self, text: str) -> None:
        self._log(f"[{time.monotonic() - self.started:6.0f}s] {text}")

    def unit(self, canary: Canary) -> tuple[list[float], float]:
        """`--unit-timings` full passes at the mix's cap, and u, their median."""
        timings = canary.unit_timings(self.config.mix_max, self.config.unit_timings)
        return timings, stats.host_unit(timings)

    def calibrate(self, canary: Canary) -> Calibration:
        """u, L, the SLO and the relay window on the idle host (the canary's reference comes later)."""
        c, before = self.config, cpu_times()
        timings, u = self.unit(canary)
        calibration = Calibration(
            u_ms=round(u, 3), unit_length=c.mix_max, unit_timings_ms=timings, load_per_u=LOAD_PER_U,
            rate=load_rate(u), slo_ms=round(c.slo_u * u, 1),
            relay_window_ms=c.relay_window_ms or round(c.relay_window_u * u, 1),
            canary_reference_ms=0.0, canary_readings_ms=[], steal_share=steal_share(before, cpu_times()),
        )  # fmt: skip
        self.log(
            f"u = {calibration.u_ms:g} ms (median of {len(timings)} full passes at {c.mix_max} events, "
            f"{min(timings):g}-{max(timings):g}); L = {LOAD_PER_U:g} / u = {calibration.rate:g} req/s; "
            f"SLO {c.slo_u:g} u = {calibration.slo_ms:g} ms; relay window {calibration.relay_window_ms:g} "
            f"ms; steal {calibration.steal_share:.1%}"
        )
        return calibration

    def fleets(self, driver: Driver, stack: contextlib.ExitStack) -> dict[str, BenchFleet]:
        return {name: stack.enter_context(driver.fleet(mode)) for name, mode in MODES.items()}

    def run(self, on_block: Callable[[], None] | None = None) -> None:
        """Calibrates, starts and warms up the fleets and runs the blocks; `on_block` hears after each."""
        c = self.config
        by_name = {arm.name: arm for arm in c.arms()}
        self.design = orders.block_orders(list(by_name), c.blocks, c.order_seed)
        chunk = BenchConfig().pre_infer_chunk_tokens
        with Canary(c.model_preset, c.torch_threads, c.short_term, chunk) as canary:
            calibration = self.calibration = self.calibrate(canary)
            self.driver = Driver(
                bench_config(c, slo_ms=calibration.slo_ms, relay_window_ms=calibration.relay_window_ms),
                self.log_dir,
                self._log,
            )
            budget_end = self.started + c.budget_min * 60
            with contextlib.ExitStack() as stack:
                fleets = self.fleets(self.driver, stack)
                for fleet in fleets.values():
                    self.warm_up(fleet)
                self.reference(canary)
                queue = collections.deque((order, None) for order in self.design)
                longest = 0.0
                while queue:
                    order, replaces = queue.popleft()
                    index = len(self.blocks)
                    if index and time.monotonic() + longest > budget_end:
                        self.log(f"budget: {len(queue) + 1} block(s) not run (the longest: {longest:.0f} s)")
                        break
                    started = time.monotonic()
                    block = self.block(index, [by_name[name] for name in order], fleets, canary, replaces)
                    longest = max(longest, time.monotonic() - started)
                    if not block.kept:
                        queue.append((order, index if replaces is None else replaces))
                    if on_block is not None:
                        on_block()

    def warm_up(self, fleet: BenchFleet) -> None:
        """`FLEET_WARMUP_S` of load at L with users of its own: warm processes and a DRAM tier as filled as
        a measured trial's before the first block."""
        assert self.calibration is not None
        rate = self.calibration.rate
        sent = self.send_to(fleet, "fleet-warmup", rate, 0, max(round(rate * FLEET_WARMUP_S), 1), 0)
        ranks = [ms for ms in sent.rank_ms() if ms is not None]
        self.log(f"{fleet.mode.name} fleet warmed up: {len(sent.records)} Recommends at {rate:g}/s, rank P99 "
                 f"{stats.pooled_p99([ranks]):.1f} ms (not recorded)")  # fmt: skip

    def send_to(
        self, fleet: BenchFleet, users: str, rate: float, warmup: int, measured: int, seed: int
    ) -> Sent:
        """`warmup` then `measured` Recommends of the users of namespace `users` to the fleet's stub, open
        loop at `rate` with the arrivals of `seed`."""
        c, calibration, driver = self.config, self.calibration, self.driver
        assert calibration is not None and driver is not None
        window = calibration.relay_window_ms
        load = Load.of(rate, warmup, measured, seed, window, c.rank_timeout_ms)
        return self.send(
            fleet, fleet.stub(driver.mix, window), sampler(c, fleet.mode, users, rate, seed), load
        )

    def reference(self, canary: Canary) -> None:
        """The canary's reference readings, with the fleets up, warm and drained: the conditions of every
        block's idle readings (a host without the fleets' processes reads faster)."""
        assert self.calibration is not None and self.driver is not None
        self.driver.wait_idle(None)
        readings = canary.readings(REFERENCE_READINGS)
        reference = round(statistics.median(readings), 4)
        self.calibration = dataclasses.replace(
            self.calibration, canary_reference_ms=reference, canary_readings_ms=readings
        )
        self.log(f"canary with the fleets up and idle: {self.calibration.canary_reference_ms:g} ms")

    def block(
        self, index: int, order: Sequence[Arm], fleets: dict[str, BenchFleet], canary: Canary,
        replaces: int | None,
    ) -> Block:  # fmt: skip
        """Block `index`: u timed on the drained host, then every arm's trial in `order`, and its slowdown."""
        c, calibration = self.config, self.calibration
        assert calibration is not None and self.driver is not None
        seed = c.load_seed + index
        started, before = time.monotonic(), cpu_times()
        self.driver.wait_idle(None)
        timings, u = self.unit(canary)
        rate, slo_ms = load_rate(u), round(c.slo_u * u, 1)
        self.log(f"block {index}: u = {u:g} ms ({min(timings):g}-{max(timings):g}), L = {rate:g} req/s, "
                 f"SLO {slo_ms:g} ms")  # fmt: skip
        trials = [self.trial(index, position, arm, fleets[arm.mode], canary, seed, rate, slo_ms)
                  for position, arm in enumerate(order)]  # fmt: skip
        self.trials += trials
        idle = [reading for trial in trials for reading in trial.canary_idle_ms]
        steal = steal_share(before, cpu_times())
        # The host's speed so far: the median of the reference readings and every block's idle readings,
        # this one's included, so one fast or slow reading does not decide a block. (Not the readings taken
        # with a block's u: the canary reads faster right after the unit passes.)
        every = [*calibration.canary_readings_ms, *(r for trial in self.trials for r in trial.canary_idle_ms)]
        reference = statistics.median(every)
        slowdown = stats.slowdown(idle, reference, steal, calibration.steal_share)
        foreign = max(trial.foreign_cores for trial in trials)
        block = Block(
            index=index, seed=seed, order=[arm.name for arm in order], topped_up_for=replaces,
            started_s=round(started - self.started, 1), duration_s=round(time.monotonic() - started, 1),
            canary_ms=round(statistics.median(idle), 4), canary_reference_ms=round(reference, 4),
            u_ms=round(u, 3), unit_timings_ms=timings, rate=rate, slo_ms=slo_ms, steal_share=steal,
            slowdown=round(slowdown, 4), foreign_cores=foreign,
            kept=stats.kept_blocks([slowdown], c.drift_limit, [foreign], c.foreign_limit)[0],
        )  # fmt: skip
        self.blocks.append(block)
        baseline = next(t for t in trials if t.mode == BASELINE)
        self.log(
            f"block {index} (seed {seed}{'' if replaces is None else f', for block {replaces}'}): "
            f"{block.duration_s:.0f} s, s = {slowdown:.3f} (canary {block.canary_ms:g} against {reference:g} "
            f"ms, steal {steal:.1%}), other processes {foreign:g} cores{'' if block.kept else ': left out'}; "
            f"baseline P99 {trial_p99(baseline):.1f} ms"
        )
        return block

    def trial(
        self, block: int, position: int, arm: Arm, fleet: BenchFleet, canary: Canary, seed: int,
        unit_rate: float, slo_ms: float,
    ) -> Trial:  # fmt: skip
        """One arm's trial at its multiple of the block's L (`unit_rate`), its Ranks over `slo_ms` listed:
        drained fleets, the canary on the idle host, then its load with the canary beside it."""
        c, calibration, driver = self.config, self.calibration, self.driver
        assert calibration is not None and driver is not None
        rate = round(arm.multiple * unit_rate, 3)
        namespace = users(driver.mix, rate, Plan(fleet, 0, calibration.relay_window_ms), seed - c.load_seed)
        warmup = round(rate * c.warmup_s)
        driver.wait_idle(None)
        idle = canary.readings(c.canary_readings)
        steal_before, started = cpu_times(), time.monotonic()
        with canary.beside() as under_load:
            sent = self.send_to(fleet, namespace, rate, warmup, c.measured_requests(arm), seed)
        measured = sent.measured
        slow = [over(i, r) for i, r in enumerate(measured) if not r.ok or r.response.rank_latency_ms > slo_ms]
        trial = Trial(
            block=block, position=position, arm=arm.name, mode=arm.mode, multiple=arm.multiple, rate=rate,
            seed=seed, users=namespace, warmup=warmup, started_s=round(started - self.started, 1),
            steal_share=steal_share(steal_before, cpu_times()), canary_idle_ms=idle,
            canary_load_ms=list(under_load), sources=dict(collections.Counter(source(r) for r in measured)),
            over=slow, **sent.summary(),
        )  # fmt: skip
        time.sleep(SETTLE_S)
        self.log(
            f"  {arm.name:<14} {rate:>7g}/s: rank P99 {trial_p99(trial):.1f} ms, {len(trial.over)} of "
            f"{len(trial.rank_ms)} over {slo_ms:g} ms, {trial.errors} err, canary "
            f"{statistics.median(idle):g} ms idle, send lag P99 {trial.send_lag_p99_ms:g} ms"
        )
        return trial


def source(record: CallRecord) -> str:
    """Where a measured Rank's prefix came from (`cache_source_label`: `hbm`, `miss`, …), or `failed`."""
    return cache_source_label(record.response.cache_source) if record.ok else "failed"


def over(index: int, record: CallRecord) -> Over:
    """The measured request at `index`, a Rank over the SLO or a failure, with what its answer said."""
    if not record.ok:
        return Over(index=index, rank_ms=None, source="failed", miss_reason="", admit_reason="", long_term=0,
                    prefix_wait_ms=0.0, computed_events=0)  # fmt: skip
    r = record.response
    return Over(
        index=index,
        rank_ms=round(r.rank_latency_ms, 3),
        source=source(record),
        miss_reason=common_pb2.MissReason.Name(r.miss_reason).removeprefix("MISS_REASON_").lower(),
        admit_reason=trigger_pb2.AdmitReason.Name(r.admit_reason).removeprefix("ADMIT_REASON_").lower(),
        long_term=r.long_term_length,
        prefix_wait_ms=round(r.prefix_wait_ms, 3),
        computed_events=r.computed_prefix_events,
    )


def analysed(results: HeadlineResults) -> HeadlineResults:
    """`results` with its two analyses: the blocks kept, and every block."""
    args = (results.blocks, results.trials, results.calibration, results.settings)
    kept, every = (analyse(*args, kept_only=only) for only in (True, False))
    return dataclasses.replace(results, kept=kept, every=every)


def write(results: HeadlineResults, out_dir: Path, plots: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    results.write(out_dir / "results.json")
    (out_dir / "report.md").write_text(render_markdown(results))
    if plots:
        draw(results, out_dir)


def main(
    argv: Sequence[str] | None = None, bench_class: type[HeadlineBench] = HeadlineBench
) -> HeadlineResults:
    config = load(HeadlineConfig, argv, prog="python -m bench headline", description=__doc__)
    out_dir = config.out_dir()
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started = time.monotonic()
    host, package_versions, commit = machine(), versions(), git_commit()
    bench = bench_class(config, out_dir / "tmp" / "logs", log=lambda line: print(line, flush=True))

    def results() -> HeadlineResults:
        assert bench.calibration is not None and bench.driver is not None
        return HeadlineResults(
            started_at=started_at, duration_s=round(time.monotonic() - started, 1), commit=commit,
            machine=host, versions=package_versions, settings=config, fleet=bench.driver.shape,
            universe=bench.driver.mix, calibration=bench.calibration, design=bench.design,
            blocks=list(bench.blocks), trials=list(bench.trials),
        )  # fmt: skip

    bench.run(on_block=lambda: write(results(), out_dir, plots=False))
    host.load_average_at_end = list(os.getloadavg())
    final = analysed(results())
    write(final, out_dir)
    print(claim(final.kept), flush=True)
    print(f"report: {out_dir / 'report.md'}", flush=True)
    return final


if __name__ == "__main__":
    main()
