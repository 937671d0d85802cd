"""`python -m bench ab`'s settings, each a flag with a `RELAYGR_…` environment twin.

Defaults, and why:

- baseline against RelayGR at 20 and 40 Recommend/s on the first length mix (median 1024, cap 2048
  events), cpu-small with 2 rankers and a 100 ms relay window: the shape of `python -m bench`'s CPU runs,
  whose last full run (90fa212) put the baseline's edge between about 21 and 25 req/s and RelayGR's
  between about 45 and 70: 20/s is just below the baseline's, 40/s between them.
- 5 load seeds, each run 1000 measured Recommends after 5 s of warm-up, no early stop: 5000 Ranks per mode
  and load, so a share over the SLO of 1 % is about 50 Ranks, ±0.3 percentage points before the seeds'
  design effect.
- 30 s of load for each fleet at the first rate before its first measured run (`--fleet-warmup-s`), with
  users of its own, recorded apart and counted nowhere: without it (ab-mix1-admit-all) RelayGR's first
  run after its fleet started had 16 of 600 Ranks over the SLO, no other seed more than 2 at that load.
- A Recommend's bound is by default the Rank's SLO plus the relay window, which it waits first.
- P99 intervals resample blocks of 1 s of requests (`--block-s`), long enough to keep a burst of arrivals
  and the queue it builds together (`bench.lib.intervals`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from bench.lib.fleets import ABLATIONS, BASELINE, RELAY, FleetSettings, Mode, WorkloadSettings
from bench.lib.groups import RankerProfileSettings, SeedSettings, TrialSettings
from services.common.config import listed, numbers, setting
from services.launcher.procs import REPO_ROOT

# The placement study's other arm (bench/results/placement-ab/README.md), placing no prefix by the queues.
OWNER_ONLY = dataclasses.replace(
    RELAY,
    name="relay-owner-only",
    description="RelayGR whose trigger puts every prefix on its ring owner (its --relay-window-ms 0)",
    trigger_args="--relay-window-ms 0",
)
# The coalescing check's other arm (ab-mix1-coalescing), coalescing no PreInfers bound for one ranker.
SINGLE_PRE_INFERS = dataclasses.replace(
    RELAY,
    name="relay-single-pre-infers",
    description="RelayGR whose trigger sends every PreInfer alone (its --pre-infer-batch-window-ms 0)",
    trigger_args="--pre-infer-batch-window-ms 0",
)
MODES = {mode.name: mode for mode in (BASELINE, RELAY, *ABLATIONS, OWNER_ONLY, SINGLE_PRE_INFERS)}
RESULTS_DIR = REPO_ROOT / "bench" / "results"


@dataclasses.dataclass(frozen=True)
class AbConfig(FleetSettings, WorkloadSettings, SeedSettings, TrialSettings, RankerProfileSettings):
    """The A/B's settings; the fleets' are `FleetSettings`' and every mode's fleet has the same ones."""

    name: str = setting(
        "", "results go to bench/results/<name>/ (empty: relaygr-ab in the system's temporary folder)"
    )
    modes: str = setting(
        "baseline,relay",
        "the modes compared, two or more (bench.lib.fleets; relay-owner-only: the placement study's; "
        "relay-single-pre-infers: the trigger's PreInfers uncoalesced)",
        items=str,
        distinct=True,
        choices=tuple(MODES),
    )
    rates: str = numbers("20,40", "offered loads, Recommend calls/s; every mode runs at each", distinct=True)
    fleet_warmup_s: float = setting(
        30.0,
        "seconds of load each mode's fleet gets, unmeasured, at the first load before its first run "
        "(0: none)",
        minimum=0,
    )
    send_lag_limit_ms: float = setting(
        10.0,
        "a run whose load generator's send lag P99 is above this is flagged in the report (its arrivals "
        "were late: the machine was busy)",
        above=0,
    )
    foreign_cores_limit: float = setting(
        0.2,
        "a run during which processes other than its own fleet's and the load generator took more "
        "cores than this is flagged in the report",
        above=0,
    )
    slo_ms: float = setting(100.0, "ranking-latency P99 SLO (the Rank as the stub sees it)", above=0)
    recommend_slo_ms: float = setting(
        0.0,
        "the Recommend's latency bound (0: --slo-ms plus --relay-window-ms, the window it waits)",
        minimum=0,
    )
    resamples: int = setting(2000, "bootstrap resamples of each P99 interval", above=0)

    def validate(self) -> None:
        WorkloadSettings.validate(self)
        if len(self.mode_names()) < 2:
            raise ValueError("--modes must name two or more modes")

    def mode_names(self) -> list[str]:
        return listed(self, "modes")

    def mode_list(self) -> list[Mode]:
        return [MODES[name] for name in self.mode_names()]

    def rate_list(self) -> list[float]:
        return listed(self, "rates")

    @property
    def recommend_bound_ms(self) -> float:
        return self.recommend_slo_ms or self.slo_ms + self.relay_window_ms

    def out_dir(self) -> Path:
        if self.name:
            return RESULTS_DIR / self.name
        return Path(tempfile.gettempdir()) / "relaygr-ab"
