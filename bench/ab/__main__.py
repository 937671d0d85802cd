"""`python -m bench ab --modes baseline,relay --rates 20,40 --seeds 5`: a fixed-load A/B of the named modes.

Every mode's fleet starts at once and gets `--fleet-warmup-s` of load at the first rate with users and
arrivals of its own (the seed index after the last measured one), recorded apart: a fleet's first run
after its start reads slow. Then `schedule`: seed by seed, load by load, every mode once at each (seed,
load), in a Williams row (`bench.lib.orders.turn`, row seed index plus load index), so a drift of the
machine hits every mode alike and at every load each mode takes each place and follows each other equally
often over every whole set of seeds. A run (`AbBench.measure`) waits for the other fleets to be idle
(`Driver.wait_idle`), then sends all its `warmup + requests` Recommends open loop (`bench.lib.recommends`),
so the modes' counts over the SLO compare, with the arrivals of its load seed and the users of
`bench.lib.driving.users` (named after the mix, load, window and seed: every mode sees the same users and
arrivals at a (seed, load), no run inherits another's cache; `no-revisit` gets the same names with revisit
probability 0). It records the cores other processes took meanwhile; `disturbed` flags a run whose
arrivals were late or whose machine was busy. results.json and report.md go to bench/results/<name>/
(`--name`; else relaygr-ab in the temporary folder), rewritten after every run; the services' logs to its
tmp/ folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.ab.config import AbConfig
from bench.ab.report import over_slo, render_markdown
from bench.ab.schema import AbResults, AbRun, analyse, disturbed
from bench.lib import orders
from bench.lib.context import machine, versions
from bench.lib.driving import SETTLE_S, Driver, Plan, users
from bench.lib.fleets import BenchFleet, Mode
from bench.lib.recommends import Load, Sender, bench_config, sampler
from services.common.config import load


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


class AbBench(Sender):
    """Runs a fixed-load A/B; `log` receives one line per step. `fleet` starts a mode's fleet (a test
    replaces it, and `drive`)."""

    def __init__(self, config: AbConfig, log_dir: Path, log: Callable[[str], None] = print) -> None:
        self.config = config
        self.bench = Driver(bench_config(config), log_dir, log)
        self.log = self.bench.log
        self.warmups: list[AbRun] = []  # each fleet's warm-up run, once `run` has driven it

    def fleet(self, mode: Mode) -> contextlib.AbstractContextManager[BenchFleet]:
        return self.bench.fleet(mode)

    def run(self, modes: Sequence[Mode], on_run: Callable[[list[AbRun]], None] | None = None) -> list[AbRun]:
        """Every mode's fleet up and warmed up, then every job of `schedule` in its order; `on_run` hears
        the runs so far after each."""
        c = self.config
        runs: list[AbRun] = []
        with contextlib.ExitStack() as stack:
            fleets = {mode.name: stack.enter_context(self.fleet(mode)) for mode in modes}
            if c.fleet_warmup_s > 0:
                for order, mode in enumerate(modes):
                    job = Job(c.seeds, c.rate_list()[0], mode.name)
                    self.warmups.append(self.measure(fleets[mode.name], job, order, c.fleet_warmup_s))
            for order, job in enumerate(schedule([mode.name for mode in modes], c.rate_list(), c.seeds)):
                runs.append(self.measure(fleets[job.mode], job, order))
                if on_run is not None:
                    on_run(runs)
        return runs

    def measure(self, fleet: BenchFleet, job: Job, order: int, fleet_warmup_s: float = 0.0) -> AbRun:
        """One run of `job` on `fleet`: all its requests, the warm-up's left out; with `fleet_warmup_s`, the
        fleet's warm-up run instead: that many seconds of requests, every one recorded (none counted)."""
        c, mix, window = self.config, self.bench.mix, self.config.relay_window_ms
        seed = c.load_seed + job.seed_index
        namespace = users(mix, job.rate, Plan(fleet, 0, window), job.seed_index)
        warmup, requests = round(job.rate * c.warmup_s), c.requests
        if fleet_warmup_s:
            warmup, requests = 0, max(round(job.rate * fleet_warmup_s), 1)
        address = fleet.stub(mix, window, 0.0)
        self.bench.wait_idle(fleet)
        sent = self.send(
            fleet,
            address,
            sampler(c, fleet.mode, namespace, job.rate, seed),
            Load.of(job.rate, warmup, requests, seed, window, c.rank_timeout_ms),
        )
        run = AbRun(order=order, mode=job.mode, rate=job.rate, seed=seed, users=namespace, warmup=warmup,
                    recommend_ms=sent.recommend_ms(), **sent.summary())  # fmt: skip
        time.sleep(SETTLE_S)
        flags = disturbed(run, c)
        self.log(
            f"{job.mode:<16} {namespace:<36} {job.rate:>6g}/s seed {seed}: {over_slo(run, c.slo_ms)} "
            f"{c.slo_ms:g} ms, {run.errors} err, send lag P99 {run.send_lag_p99_ms:g} ms, foreign cores "
            f"{run.foreign_cores:g}"
            + (f" (DISTURBED: {'; '.join(flags)})" if flags else "")
            + (" (the fleet's warm-up, not counted)" if fleet_warmup_s else "")
        )
        return run


def main(argv: Sequence[str] | None = None, bench_class: type[AbBench] = AbBench) -> AbResults:
    config = load(AbConfig, argv, prog="python -m bench ab", description=__doc__)
    out_dir = config.out_dir()
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started = time.monotonic()
    host, package_versions = machine(), versions()
    bench = bench_class(config, out_dir / "tmp" / "logs", log=lambda line: print(line, flush=True))

    def checkpoint(runs: list[AbRun]) -> AbResults:
        """The results so far, written; a mode or load with no run yet has no cell or comparison."""
        complete = len(runs) == len(config.mode_names()) * len(config.rate_list()) * config.seeds
        cells, comparisons = analyse(runs, config) if complete else ([], [])
        results = AbResults(
            started_at=started_at, duration_s=round(time.monotonic() - started, 1), machine=host,
            versions=package_versions, settings=config, recommend_bound_ms=config.recommend_bound_ms,
            modes=config.mode_list(), fleet=bench.bench.shape, universe=bench.bench.mix, cells=cells,
            comparisons=comparisons, runs=list(runs), warmups=list(bench.warmups),
        )  # fmt: skip
        out_dir.mkdir(parents=True, exist_ok=True)
        results.write(out_dir / "results.json")
        (out_dir / "report.md").write_text(render_markdown(results))
        return results

    runs = bench.run(config.mode_list(), on_run=checkpoint)
    host.load_average_at_end = list(os.getloadavg())
    results = checkpoint(runs)
    for comparison in results.comparisons:
        for verdict in comparison.verdicts:
            print(verdict, flush=True)
    print(f"report: {out_dir / 'report.md'}", flush=True)
    return results


if __name__ == "__main__":
    main()
