"""`python -m bench tracing`'s settings, each a flag with a `RELAYGR_…` environment twin. Defaults, and why:
`cpu-small`, 2 rankers of one thread, the first length mix and a 100 ms relay window: the shape whose CPU
figures `python -m bench run` describes (about 22 ms of CPU a request), so the ratios read against the same
cost (with `cpu-tiny` the model's cost would nearly vanish and every ratio be an upper bound; the CPU added
in ms per request, reported beside them, is what carries over to another model). 10 Recommend/s, a fifth
of the fleet's SLO-compliant limit on this machine (53.7/s), so latency measures the serving path, not
queueing. 50 warm-up and 800 measured requests a setting: a P99 from the 8 slowest, about 5 minutes for
the three settings. The SDK's batch export as shipped (`OTEL_BSP_SCHEDULE_DELAY`, 5 s unless set): CPU is
read `--settle-s` after the load, so the last batch's export counts.
"""

from __future__ import annotations

import dataclasses

from bench.lib.fleets import FleetSettings, WorkloadSettings
from services.common.config import listed, numbers, setting
from services.common.presets import MODEL_PRESET_NAMES

# Other engineers' benchmarks and tests that `--quiet-wait-s` waits out (pgrep -f patterns).
BUSY_PATTERN = "bench.mlperf|pytest|python -m bench( |$)"
CPU_PRESETS = tuple(name for name in MODEL_PRESET_NAMES if name.startswith("cpu-"))


@dataclasses.dataclass(frozen=True)
class TracingBench(FleetSettings, WorkloadSettings):
    """The tracing benchmark's settings; the fleet's are `FleetSettings`' (CPU presets only), its users
    `WorkloadSettings`' (`python -m bench run`'s defaults)."""

    output: str = setting("bench/results/tracing", "results folder (relative to the repository root)")
    rate: float = setting(10.0, "offered Recommend load of every setting, calls/s (open loop)", above=0)
    requests: int = setting(800, "measured requests per setting, after the warm-up", above=0)
    warmup_s: float = setting(
        5.0, "seconds of load before the measured requests (not in the latencies)", minimum=0
    )
    sample_ratios: str = numbers(
        "0.01,1", "trace sample ratios measured after tracing off (the picture uses the highest)", maximum=1
    )
    model_preset: str = setting("cpu-small", "every ranker's model preset", choices=CPU_PRESETS)
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
