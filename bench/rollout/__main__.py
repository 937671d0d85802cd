"""`python -m bench rollout`: what the rankers' cache handoff saves through a rolling restart and a scale
out and in, handoff off against on, under steady open-loop Recommend load of returning users.

For each load seed it runs every mode (`--modes`, off and on; the order alternates from one seed to the
next) on a fresh fleet with the same arrivals and users, through the plan's phases (`bench.rollout.plan`),
and writes to `--output`: summary.md (the figures, by phase, every drain, every run), results.json (the
same with the configuration and the plan), timeline.csv and timeline.png (buckets of `--bucket-s`), and
raw/ (every call and metrics sample of each run, gzipped JSON lines); the services' logs go to its tmp/
folder (not committed). The plan's duration is printed before anything starts.
"""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib.context import git_commit, load_average
from bench.rollout import report
from bench.rollout.config import RolloutConfig
from bench.rollout.plan import describe, plan
from bench.rollout.run import RunRecord, run_once
from bench.rollout.summary import figures, phase, summarize_run
from services.common.config import load
from services.launcher.procs import REPO_ROOT

# A run's fleet start and stop on this machine, beside its load: what the printed duration adds per run.
FLEET_OVERHEAD_S = 15.0


def jsonable(value: Any) -> Any:
    """`value` with dataclasses as dicts and infinite or NaN floats as None (JSON has neither)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_raw(record: RunRecord, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{record.mode}-s{record.seed}"
    for name, rows in (("calls", record.calls), ("samples", record.samples)):
        with gzip.open(folder / f"{stem}-{name}.jsonl.gz", "wt") as out:
            out.writelines(json.dumps(jsonable(row)) + "\n" for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    config = load(RolloutConfig, argv, prog="python -m bench rollout", description=__doc__)
    made = plan(config)
    out_dir = (REPO_ROOT / config.output).resolve()
    modes = config.mode_names()
    print(describe(made, config.seeds * len(modes), FLEET_OVERHEAD_S), flush=True)
    started, started_at = time.monotonic(), datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    load_at_start = load_average()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - started:6.0f}s] {text}", flush=True)

    summaries = []
    for k, seed in enumerate(config.seed_list()):
        for order, mode in enumerate(modes if k % 2 == 0 else modes[::-1]):
            logs = out_dir / "tmp" / "logs" / f"{mode}-s{seed}"
            record = run_once(config, made, mode, seed, order, logs, log)
            write_raw(record, out_dir / "raw")
            summary = summarize_run(record, made, config)
            summaries.append(summary)
            rollout = phase(summary, "rollout")
            hits = sum(d.hits for d in summary.drains), sum(d.resident for d in summary.drains)
            failed = sum(not c.ok for c in record.calls)
            log(
                f"{mode} seed {seed}: {len(record.calls)} calls, {failed} failed; drained users' next call "
                f"hit {hits[0]} of {hits[1]}; rollout Recommend P99 {rollout.recommend_ms['p99']} ms, "
                f"{rollout.recompute_s:g} device s recomputing"
            )
    found = figures(summaries, config)
    c = config
    header = [
        f"{started_at.isoformat()}, commit {git_commit()}, {len(summaries)} runs in "
        f"{(time.monotonic() - started) / 60:.1f} min; load average at the start {load_at_start}, at the end "
        f"{load_average()}.",
        "",
        f"`{c.model_preset}`, {c.rankers} rankers and spare {made.spare}, {c.rate:g} Recommend/s open loop, "
        f"{users(c)}, {c.long_term} long-term events a user, DRAM TTL {c.dram_ttl_s:g} s, relay "
        f"{'on' if c.relay else 'off'}; handoff "
        f"off: `{c.handoff_off_flags}`, on: the rankers' defaults; seeds {c.seed_list()}.",
        "",
        describe(made, len(summaries), FLEET_OVERHEAD_S).splitlines()[0] + ".",
    ]
    results = {
        "configuration": dataclasses.asdict(config),
        "plan": made,
        "started_at": started_at.isoformat(),
        "git_commit": git_commit(),
        "figures": found,
        "runs": [dataclasses.replace(s, timeline=[]) for s in summaries],
    }
    (out_dir / "results.json").write_text(json.dumps(jsonable(results), indent=1) + "\n")
    (out_dir / "summary.md").write_text(report.markdown(header, found, summaries, modes))
    report.write_timeline(summaries, out_dir / "timeline.csv")
    report.plot(summaries, made, out_dir / "timeline.png")
    print("\n".join(report.figure_rows(found)))
    print(f"wrote {out_dir / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def users(c: RolloutConfig) -> str:
    """Who the calls come from, in words."""
    if c.population:
        return f"a closed population of {c.population} users (every one first seen in the warm-up)"
    return f"{c.revisit_probability:g} of them from a user of the last {c.revisit_window_s:g} s"
