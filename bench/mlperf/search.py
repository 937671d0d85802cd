"""`--search`: the highest Server target QPS LoadGen calls VALID, for each mode, on fleets of one shape.

Every mode's fleet (`bench.mlperf.fleet`) is started first and kept running. Each mode's search is
`bench.lib.stats.largest_passing_value` over the load grid: from the grid value at or below `--target-qps`
it gallops up while runs are VALID (down while they are not), bisects between the last VALID and the
first INVALID grid value, then refines between them (`--search-refine` geometric midpoints). The modes'
searches run one LoadGen run each in turn (`bench.lib.stats.interleave`), so that a shared machine's drifting
load falls on both alike. A search assumes that a higher target never turns an INVALID run VALID.

Each run is a fresh stub (its universe starting then) and new users named after the load and the seed,
the same in every mode: no run inherits another's cache, and both modes see the same users at a load.
Files: `<output>/<mode>/q<qps>/` per run (LoadGen's logs, result.json, summary.md), `<output>/result.json`
and `<output>/summary.md` for the search, the fleets' logs in `<output>/tmp/logs/<mode>/`.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import datetime
import os
import time
from collections.abc import Callable
from pathlib import Path

from bench.lib import codec
from bench.lib.context import git_commit, load_average
from bench.lib.fleets import BenchFleet
from bench.lib.floor import host_unit_ms
from bench.lib.stats import interleave, largest_passing_value
from bench.mlperf import report
from bench.mlperf.config import MlperfConfig
from bench.mlperf.fleet import PRE_INFER_CHUNK_TOKENS, local_fleet, run_stub, universe, wait_routable
from bench.mlperf.results import ModeSearch, RunResult, SearchResult, write_json
from bench.mlperf.run import run_loadgen, run_settings

SETTLE_S = 1.0  # between runs: the last answers and background pre-inference finish


def first_index(grid: list[float], guess: float) -> int:
    """The index of the largest grid value at or below `guess` (0 when every value is above it)."""
    return max(bisect.bisect_right(grid, guess) - 1, 0)


def measure(
    fleet: BenchFleet, config: MlperfConfig, mode: str, out: Path, log: Callable[[str], None]
) -> tuple[list[RunResult], Callable[[float], bool]]:
    """The runs of one mode (filled as they are measured) and the verdict function its search calls."""
    runs: list[RunResult] = []
    label = universe(config, 0).label

    def passes(qps: float) -> bool:
        address = run_stub(fleet, config)
        settings = run_settings(config, mode, address, qps, config.relay_window_ms, label)
        result = run_loadgen(settings, out / mode / f"q{qps:g}", config.short_term)
        runs.append(result)
        log(report.describe(result))
        time.sleep(SETTLE_S)
        return result.valid

    return runs, passes


def search(config: MlperfConfig, out: Path, log: Callable[[str], None] = print) -> SearchResult:
    """Runs every mode's search and writes `<out>/result.json` and `<out>/summary.md`."""
    started_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    started = time.monotonic()
    load_start = load_average()
    unit_ms = host_unit_ms(
        config.model_preset, config.torch_threads, config.short_term, PRE_INFER_CHUNK_TOKENS
    )
    log(f"host unit u = {unit_ms:g} ms: P99 target {config.p99_ms:g} ms = {config.p99_ms / unit_ms:.2f} u")
    grid = config.grid()
    first = first_index(grid, config.target_qps)
    modes = config.modes()
    with contextlib.ExitStack() as stack:
        fleets = {}
        for mode in modes:
            log(f"starting the {mode} fleet ({config.model_preset}, {config.rankers} rankers)")
            fleets[mode] = stack.enter_context(local_fleet(config, mode, out / "tmp" / "logs" / mode))
            wait_routable(fleets[mode], config.rankers, config.startup_timeout_s)
        measured = {mode: measure(fleets[mode], config, mode, out, log) for mode in modes}
        bests = interleave(
            [(largest_passing_value(grid, first, config.search_refine), measured[mode][1]) for mode in modes]
        )
    result = SearchResult(
        started_at=started_at,
        wall_s=round(time.monotonic() - started, 1),
        git_commit=git_commit(),
        cores=os.cpu_count(),
        load_average_start=load_start,
        load_average_end=load_average(),
        host_unit_ms=round(unit_ms, 3),
        configuration=codec.to_json(dataclasses.replace(config, output=str(out))),
        modes={
            mode: ModeSearch(mode=mode, runs=measured[mode][0], best_qps=best)
            for mode, best in zip(modes, bests, strict=True)
        },
    )
    write_json(result, out / "result.json")
    (out / "summary.md").write_text(report.search_markdown(result))
    return result
