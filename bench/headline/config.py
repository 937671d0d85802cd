"""`python -m bench headline`'s settings, each a flag with a `RELAYGR_…` twin, and the rule fixing L.

The loads are multiples of L, fixed by a declared rule in the host's unit u (the in-process full pass of
the preset at the mix's cap, `bench.headline.canary`): L = LOAD_PER_U / u, 0.7 requests per u, so that on
any host the baseline runs at the same share of its own capacity. u is timed again before every block,
whose loads and SLO follow it. 0.7 comes from the committed runs: `full` (90fa212, u = 34.9 ms) put the
baseline's highest load meeting the SLO at 0.80 per u, and a probe on a host with u ≈ 50 ms held it
within the SLO at 0.70 per u: at or below that edge the baseline's P99 is its longest histories' service
time. The SLO and the relay window are 2.87 u each (100 ms at 34.9 ms, the committed runs' bounds).

Defaults, and why:

- the arms: the baseline at L; RelayGR at 1, 2, 3, 3.5 and 4 L (finer near its knee, about 3 L); admit-all
  at 3 L, where the trigger's selectivity matters. Seven arms: one balanced set of Williams orders is 14
  blocks (an odd number of arms needs each order and its mirror).
- 14 blocks, each trial 300 measured Recommends after 5 s of its own load, the baseline's 600 (every ratio
  divides by its P99), no early stop. A block lasts about 3.5 minutes on a 2-core host with u = 75 ms,
  so a run fits its 60-minute budget (`--budget-min`) with room for top-ups; pooled over 14 blocks an arm
  has 4,200 Ranks (the baseline 8,400), 42 of them above its P99. More arms or longer trials sharpen it
  where the budget allows; `--blocks` must stay a whole number of sets.
- a block whose host ran more than 15 % slow (`--drift-limit`), or in one of whose trials other processes
  took more than 0.3 cores (`--foreign-limit`: with the fleets idle and the canary beside a trial, they
  take about 0.1 on a 2-core host), is reported but left out of the headline, and the run tops up with a
  block of the same order within `--budget-min`. A niced process yields to the canary on the drained
  host, so it slips past s but not past the machine's busy time.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from bench.lib.fleets import FleetSettings, WorkloadSettings
from bench.lib.groups import TrialSettings, redefault
from services.common.config import listed, numbers, setting
from services.launcher.procs import REPO_ROOT

LOAD_PER_U = 0.7  # requests per u of the baseline's load L: fixed in the code, recorded in every run
RESULTS_DIR = REPO_ROOT / "bench" / "results"
BASELINE, RELAY, ADMIT_ALL = "baseline", "relay", "admit-all"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a block: a mode at a multiple of L."""

    mode: str
    multiple: float

    @property
    def name(self) -> str:
        return f"{self.mode}@{self.multiple:g}L"


@dataclasses.dataclass(frozen=True)
class HeadlineConfig(FleetSettings, WorkloadSettings, TrialSettings):
    """The block experiment's settings; every fleet (baseline, RelayGR, admit-all) has the same shape."""

    name: str = setting(
        "headline", "results go to bench/results/<name>/ (empty: relaygr-headline in the temporary folder)"
    )
    relay_multiples: str = numbers(
        "1,2,3,3.5,4", "RelayGR's loads, multiples of L, tested in ascending order", distinct=True
    )
    admit_all_multiples: str = numbers(
        "3", "admit-all's loads, multiples of L (each must be one of RelayGR's)", distinct=True
    )
    blocks: int = setting(
        14,
        "blocks, each one arrival seed with every arm once; a multiple of the Williams set's size",
        above=0,
    )
    requests: int = redefault(TrialSettings, "requests", 300)
    baseline_requests: int = setting(
        600, "measured Recommends of each baseline trial (--requests: the others')", above=0
    )
    slo_u: float = setting(2.87, "the ranking P99 SLO in the host's unit u", above=0)
    relay_window_u: float = setting(2.87, "the relay window in u (the stub's pre-processing time)", above=0)
    drift_limit: float = setting(
        1.15,
        "a block whose host slowdown s (canary and steal) is above this is left out of the headline",
        above=1,
    )
    foreign_limit: float = setting(
        0.3,
        "a block in one of whose trials other processes took more than this many cores is left out",
        minimum=0,
    )
    budget_min: float = setting(
        60.0, "the run's time budget, minutes: no block starts that would end past it", above=0
    )
    order_seed: int = setting(0, "seed of the blocks' random Williams orders")
    load_seed: int = setting(0, "the first block's arrival seed; block b uses load_seed + b")
    confidence: float = setting(0.95, "confidence of every interval and test", above=0, below=1)
    resamples: int = setting(2000, "block-bootstrap resamples of each ratio", above=0)
    unit_timings: int = setting(
        15, "timed full passes whose median is u, at the start and before each block", above=0
    )
    canary_readings: int = setting(3, "canary readings on the idle host before each trial", above=0)
    relay_window_ms: float = setting(0.0, "the relay window, ms (0: --relay-window-u times u)", minimum=0)

    def validate(self) -> None:
        WorkloadSettings.validate(self)
        missing = set(listed(self, "admit_all_multiples")) - set(listed(self, "relay_multiples"))
        if missing:
            raise ValueError(
                f"--admit-all-multiples: {sorted(missing)} not among --relay-multiples (admit-all is "
                "compared with RelayGR at the same load)"
            )

    def arms(self) -> list[Arm]:
        """Every arm of a block: the baseline at L first, then RelayGR's and admit-all's by multiple."""
        relay, admit_all = (sorted(listed(self, name)) for name in ("relay_multiples", "admit_all_multiples"))
        return [Arm(BASELINE, 1.0), *(Arm(RELAY, k) for k in relay), *(Arm(ADMIT_ALL, k) for k in admit_all)]

    def measured_requests(self, arm: Arm) -> int:
        return self.baseline_requests if arm.mode == BASELINE else self.requests

    def out_dir(self) -> Path:
        if self.name:
            return RESULTS_DIR / self.name
        return Path(tempfile.gettempdir()) / "relaygr-headline"


def load_rate(u_ms: float) -> float:
    """L, in Recommend/s, on a host whose unit is `u_ms`: `LOAD_PER_U` requests per u."""
    return round(LOAD_PER_U * 1000 / u_ms, 3)
