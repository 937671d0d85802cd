"""`python -m bench mlperf`: one LoadGen test (Server or Offline) of the fleet's Recommend, or `--search`.

Without `--recommend` it starts a local `BenchFleet` of `--mode` (or, searching, one per mode: `relay`, or
`baseline` with no Admit, no hint, no DRAM tier), one shape for both, the trigger's ranking SLO the P99
target less the relay window, and waits until the router routes to every ranker, so that a user's visits
reach one ranker from the start. Each LoadGen run gets a fresh stub whose universe starts with the run.
Every process started is stopped however the command returns; Ctrl-C stops them and exits at once (status
130), leaving LoadGen's run unfinished: LoadGen cannot be stopped mid-test.

A search runs every mode's fleet at once; each mode's search is `bench.lib.stats.largest_passing_value` over
`--search-grid` from the grid value at or below `--target-qps`, then `--search-refine` bisections (a higher
target assumed never to turn an INVALID run VALID), the modes taking one LoadGen run each in turn
(`bench.lib.stats.interleave`) so that a shared machine's drifting load falls on both alike. Files:
`<output>/<mode>/q<qps>/` per run, `<output>/result.json` and `summary.md` for the search, the fleets' logs
in `<output>/tmp/logs/<mode>/`.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime
import functools
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc

from bench.lib import codec
from bench.lib.context import git_commit, load_average
from bench.lib.driving import LEASE_TTL_MS, NUM_CANDIDATES, SETTLE_S
from bench.lib.fleets import BASELINE, RELAY, BenchFleet, FleetShape
from bench.lib.floor import host_unit_ms
from bench.lib.stats import interleave, largest_passing_value
from bench.mlperf import report
from bench.mlperf.config import MlperfConfig, parse
from bench.mlperf.results import ModeSearch, RunResult, SearchResult, write_json
from bench.mlperf.run import run_loadgen, universe
from relaygr.v1 import ranker_pb2, ranker_pb2_grpc
from services.common.config import listed

MODES = {"relay": RELAY, "baseline": BASELINE}
PRE_INFER_CHUNK_TOKENS = 512  # the fastest on CPU (bench.lib.config)


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        run(parse(argv))
    except KeyboardInterrupt:  # the fleets are stopped by now; LoadGen's thread may still be issuing
        log("interrupted: every process this command started is stopped")
        os._exit(130)


def run(config: MlperfConfig) -> None:
    """The command for parsed settings: a search, or one run."""
    c, out = config, Path(config.output)
    if c.search:
        for mode in search(c, out).modes.values():
            log(f"{mode.mode}: highest VALID target QPS {mode.best_qps if mode.best_qps else 'none'}")
        log(f"report: {out / 'summary.md'}")
        return
    if c.recommend:
        result = run_loadgen(c, "external", c.recommend, c.target_qps, out)
    else:
        with local_fleet(c, c.mode, out / "tmp" / "logs") as fleet:
            log(f"LoadGen {c.scenario} at {c.target_qps:g} QPS for {c.duration_s:g} s")
            result = run_loadgen(c, c.mode, run_stub(fleet, c), c.target_qps, out)
    log(report.describe(result))
    log(f"LoadGen's logs and the report: {out}")


def search(config: MlperfConfig, out: Path) -> SearchResult:
    """Runs every mode's search and writes `<out>/result.json` and `<out>/summary.md`."""
    c = config
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started, load_start = time.monotonic(), load_average()
    unit_ms = host_unit_ms(c.model_preset, c.torch_threads, c.short_term, PRE_INFER_CHUNK_TOKENS)
    log(f"host unit u = {unit_ms:g} ms: P99 target {c.p99_ms:g} ms = {c.p99_ms / unit_ms:.2f} u")
    grid, modes = listed(c, "search_grid"), c.modes()
    first = max(bisect.bisect_right(grid, c.target_qps) - 1, 0)  # the grid value at or below the guess
    runs: dict[str, list[RunResult]] = {mode: [] for mode in modes}
    with contextlib.ExitStack() as stack:
        fleets = {
            mode: stack.enter_context(local_fleet(c, mode, out / "tmp" / "logs" / mode)) for mode in modes
        }

        def passes(mode: str, qps: float) -> bool:
            result = run_loadgen(c, mode, run_stub(fleets[mode], c), qps, out / mode / f"q{qps:g}")
            runs[mode].append(result)
            log(report.describe(result))
            time.sleep(SETTLE_S)
            return result.valid

        searches = [
            (largest_passing_value(grid, first, c.search_refine), functools.partial(passes, m)) for m in modes
        ]
        bests = interleave(searches)
    result = SearchResult(
        started_at=started_at,
        wall_s=round(time.monotonic() - started, 1),
        git_commit=git_commit(),
        cores=os.cpu_count(),
        load_average_start=load_start,
        load_average_end=load_average(),
        host_unit_ms=round(unit_ms, 3),
        configuration=codec.to_json(dataclasses.replace(c, output=str(out))),
        modes={
            mode: ModeSearch(mode=mode, runs=runs[mode], best_qps=best)
            for mode, best in zip(modes, bests, strict=True)
        },
    )
    write_json(result, out / "result.json")
    (out / "summary.md").write_text(report.search_markdown(result))
    return result


@contextlib.contextmanager
def local_fleet(config: MlperfConfig, mode: str, log_dir: Path) -> Iterator[BenchFleet]:
    """A started fleet of `mode` (relay or baseline) whose router routes to every ranker; its first stub's
    universe starts at epoch 0 (its own start) and is not driven."""
    c = config
    log(f"starting the {mode} fleet ({c.model_preset}, {c.rankers} rankers)")
    profile = sorted({min(n, c.history_max) for n in (128, 512, c.history_max)})  # the rankers' warm-up
    shape = FleetShape(
        rankers=c.rankers,
        model_preset=c.model_preset,
        hbm_budget_mb=c.hbm_budget_mb,
        dram_budget_mb=c.dram_budget_mb,
        slo_ms=max(c.p99_ms - c.relay_window_ms, 1.0),
        ranker_args=(
            f"--torch-threads {c.torch_threads} --pre-infer-chunk-tokens {PRE_INFER_CHUNK_TOKENS} "
            f"--profile-lengths {','.join(map(str, profile))} --profile-repeats 2 --profile-candidates "
            f"{NUM_CANDIDATES} --profile-short-term {c.short_term} --lease-ttl-ms {LEASE_TTL_MS}"
        ),
        max_long_term=c.history_max,
        stub_args=f"--num-candidates {NUM_CANDIDATES} --rank-timeout-ms {c.timeout_s * 1000:g}",
        startup_timeout_s=c.startup_timeout_s,
    )
    with BenchFleet(MODES[mode], shape, universe(c, 0), c.relay_window_ms, log_dir) as fleet:
        wait_routable(fleet.router(), c.rankers, c.startup_timeout_s)
        yield fleet


def run_stub(fleet: BenchFleet, config: MlperfConfig) -> str:
    """The address of a retrieval stub started now for one run: its users' histories have their drawn
    lengths now and grow from here."""
    return fleet.stub(universe(config, time.time_ns() // 1_000_000), config.relay_window_ms)


def wait_routable(router: str, rankers: int, timeout_s: float) -> None:
    """Waits until `router` routes to all `rankers` (its GetProfile's `fleet_members`); raises TimeoutError
    naming how many it routes to when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(router) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        while True:
            members = 0
            with contextlib.suppress(grpc.RpcError):
                members = stub.GetProfile(ranker_pb2.GetProfileRequest(), timeout=2.0).fleet_members
            if members >= rankers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the router routes to {members} of {rankers} rankers after {timeout_s:g} s"
                )
            time.sleep(0.2)


if __name__ == "__main__":
    main()
