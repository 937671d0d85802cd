"""`python -m bench tracing`'s settings, each a flag with a `RELAYGR_…` environment twin.

Defaults, and why:

- `cpu-small`, 2 rankers with one thread each, the benchmark's first length mix (median 1024, cap 2048
  events) and 100 ms relay window: the shape `python -m bench run`'s CPU figures describe, so the ratios here
  read against the same per-request cost (about 22 ms of CPU). `cpu-tiny` would make the model's cost
  nearly vanish and every ratio an upper bound; the CPU added in ms per request is reported beside the
  ratios and is what carries over to another model.
- 10 Recommend/s: a fifth of the fleet's SLO-compliant limit on this machine (53.7/s), so latency
  measures the serving path and tracing's cost on it, not queueing in a saturated fleet.
- 5 s of warm-up (50 requests) and 800 measured requests per setting: 85 s of load each, a P99 from the 8
  slowest requests; with a fleet's start (about 5 s), settle and stop, the three settings take about 5
  minutes (measured: 93 s for 100 requests a setting on a busy 2-core machine).
- The SDK's batch export as shipped (`OTEL_BSP_SCHEDULE_DELAY`, 5 s unless set): each setting's CPU is
  read after `--settle-s` more seconds, so the last batch's export is counted.
"""

from __future__ import annotations

import dataclasses

from bench.lib.fleets import FleetSettings
from services.common.config import listed, numbers, setting

# The benchmark's settings this command shares (bench.lib.config's defaults and bench.run.experiments'
# constants).
SHORT_TERM = 16
MIX_SIGMA = 0.75
NUM_CANDIDATES = 128
REVISIT_PROBABILITY, REVISIT_WINDOW_S = 0.5, 5.0
RANK_TIMEOUT_MS = 1000.0
# Other engineers' benchmarks and tests that `--quiet-wait-s` waits out (pgrep -f patterns).
BUSY_PATTERN = "bench.mlperf|pytest|python -m bench( |$)"


@dataclasses.dataclass(frozen=True)
class TracingBench(FleetSettings):
    """The tracing benchmark's settings; the fleet's are `FleetSettings`' (CPU presets only)."""

    output: str = setting("bench/results/tracing", "results folder (relative to the repository root)")
    rate: float = setting(10.0, "offered Recommend load of every setting, calls/s (open loop)", above=0)
    requests: int = setting(800, "measured requests per setting, after the warm-up", above=0)
    warmup_s: float = setting(
        5.0, "seconds of load before the measured requests (not in the latencies)", minimum=0
    )
    sample_ratios: str = numbers(
        "0.01,1", "trace sample ratios measured after tracing off (the picture uses the highest)", maximum=1
    )
    model_preset: str = setting("cpu-small", "every ranker's model preset", choices=("cpu-tiny", "cpu-small"))
    mix_median: int = setting(1024, "median long-term length of the users' lognormal mix", above=0)
    mix_max: int = setting(2048, "longest long-term history of the mix", above=0)
    load_seed: int = setting(0, "seed of arrivals and user draws (the same in every setting)")
    settle_s: float = setting(
        6.0, "seconds after the load before CPU is read (at least the export delay + 1)", minimum=0
    )
    quiet_wait_s: float = setting(
        0.0,
        "wait up to this many seconds, polling every 30 s, until no other benchmark or test runs "
        f"(pgrep -f '{BUSY_PATTERN}'); 0: do not wait",
        minimum=0,
    )  # fmt: skip

    def ratios(self) -> list[float]:
        return listed(self, "sample_ratios")
