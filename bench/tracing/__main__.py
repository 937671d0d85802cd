"""`python -m bench tracing`: the overhead of OpenTelemetry tracing on the relay fleet, and a picture.

Runs the same RelayGR fleet shape three times, a fresh fleet each (tracing is read at a process's start):
tracing off, then exporting with `--trace-sample-ratio` 0.01 and 1.0 (`--sample-ratios`). Each fleet gets
the same open-loop Recommend load, the same users and the same arrivals (`bench.lib.points.run_point`), and
its processes' CPU is read around it (`bench.lib.probes`); every service exports to one OTLP/gRPC receiver
process on loopback (`bench.tracing.otlp`). From the highest ratio's spans it picks one relayed request and
draws its timeline. Writes results.json, report.md and timeline.png to `--output`; the services' logs and the
received spans go to its tmp/ folder (not committed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from bench.tracing.config import TracingBench
from bench.tracing.overhead import markdown
from bench.tracing.run import busy_processes, record, wait_until_quiet
from services.common.config import load
from services.launcher.procs import REPO_ROOT


def main(argv: Sequence[str] | None = None) -> None:
    config = load(TracingBench, argv, prog="python -m bench tracing", description=__doc__)
    out_dir = (REPO_ROOT / config.output).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    busy = wait_until_quiet(config.quiet_wait_s, print) if config.quiet_wait_s else busy_processes()
    run = record(config, out_dir, busy)
    (out_dir / "results.json").write_text(json.dumps(dataclasses.asdict(run), indent=1) + "\n")
    (out_dir / "report.md").write_text(markdown(run))
    for o in run.overhead:
        print(f"ratio {o.name} against off: Recommend P50 x{o.recommend_p50} P99 x{o.recommend_p99}, "
              f"CPU total x{o.cpu['total']} ({o.cpu_added_ms['total']:+.2f} ms/request)")  # fmt: skip
    print(f"wrote {out_dir / 'report.md'}")


if __name__ == "__main__":
    main()
