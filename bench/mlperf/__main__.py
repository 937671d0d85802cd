"""`python -m bench mlperf`: one LoadGen test (Server or Offline) of the fleet's Recommend, or `--search`.

Without `--recommend` it starts a local fleet of `--mode` (or, searching, one per mode), drives it, and
stops every process it started before it returns, however it returns. Ctrl-C stops the fleets and exits
at once (status 130), leaving LoadGen's run unfinished: LoadGen cannot be stopped mid-test. `--help` lists
every flag.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench.mlperf import report
from bench.mlperf.config import MlperfConfig, parse
from bench.mlperf.fleet import local_fleet, run_stub, universe, wait_routable
from bench.mlperf.results import RunResult
from bench.mlperf.run import run_loadgen, run_settings
from bench.mlperf.search import search


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def single_run(config: MlperfConfig, out: Path) -> RunResult:
    """One LoadGen test, against `--recommend` or a local fleet of `--mode` started for it."""
    label = universe(config, 0).label
    if config.recommend:
        settings = run_settings(config, "external", config.recommend, config.target_qps, None, label)
        return run_loadgen(settings, out, config.short_term)
    log(f"starting the {config.mode} fleet ({config.model_preset}, {config.rankers} rankers)")
    with local_fleet(config, config.mode, out / "tmp" / "logs") as fleet:
        wait_routable(fleet, config.rankers, config.startup_timeout_s)
        address = run_stub(fleet, config)
        settings = run_settings(
            config, config.mode, address, config.target_qps, config.relay_window_ms, label
        )
        log(f"LoadGen {config.scenario} at {config.target_qps:g} QPS for {config.duration_s:g} s")
        return run_loadgen(settings, out, config.short_term)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        run(parse(argv))
    except KeyboardInterrupt:  # the fleets are stopped by now; LoadGen's thread may still be issuing
        log("interrupted: every process this command started is stopped")
        os._exit(130)


def run(config: MlperfConfig) -> None:
    """The command for parsed settings: a search, or one run."""
    out = Path(config.output)
    if config.search:
        result = search(config, out, log)
        for mode in result.modes.values():
            log(f"{mode.mode}: highest VALID target QPS {mode.best_qps if mode.best_qps else 'none'}")
        log(f"report: {out / 'summary.md'}")
        return
    result = single_run(config, out)
    log(report.describe(result))
    log(f"LoadGen's logs and the report: {out}")


if __name__ == "__main__":
    main()
