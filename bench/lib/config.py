"""Benchmark settings: each is a flag with a `RELAYGR_…` environment twin (see services.common.config).

The profiles run the same experiments on the same workload and grids and differ in how much they measure
(`Profile`): `quick` (`make bench`) and `full` (`make bench-full`, refined loads, more seeds, two more
relay windows) measure every experiment; `gpu` runs `bench.run.gpu` with its own defaults
(`PROFILE_DEFAULTS`). How long each takes and why each default is what it is: docs/benchmark.md ("How
long a run takes", "Why the defaults", "The gpu profile's defaults").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import ClassVar

from bench.lib.fleets import ABLATIONS, WorkloadSettings
from bench.lib.groups import RankerProfileSettings
from services.common.config import env_name, flag_name, grid, listed, load, setting
from services.common.presets import MODEL_PRESET_NAMES
from services.launcher.config import ROUTINGS

ABLATION_NAMES = tuple(mode.name for mode in ABLATIONS)

PROFILES = ("quick", "full", "gpu")


@dataclasses.dataclass(frozen=True)
class Profile:
    """How much a run measures."""

    measured: int  # measured requests per load point
    floor_repeats: int  # timed repeats per length of the in-process floor (median kept)
    cached_rank_iterations: int  # Ranks per length through the router
    window_delays_ms: tuple[float, ...]  # extra relay windows of the length sweep
    refine_steps: int  # loads measured between a load sweep's best grid value and the next one
    # Load seeds at which some committed runs re-measured their verdict points (`bench.lib.schema.Repeat`);
    # 1 in every profile: a load's verdict pools its own seeds, up to `seed_cap`.
    seeds: int = 1
    # With `measured_s`, a point measures its rate times this many seconds of requests, within
    # [measured_min, measured]: a slow point stays short, a fast one still has `measured` requests.
    measured_s: float = 0.0  # 0: every point measures `measured` requests
    measured_min: int = 0
    # The most load seeds a load's sequential verdict pools (`bench.lib.sweep.pooled_verdict`); 1: every
    # verdict is one seed's (what a results file without it means).
    seed_cap: int = 1
    # What the retired headline profile recorded: a bound on a point's seconds, points stopped once they
    # passed clearly, and load before each fleet's first point (`bench.headline` runs its own experiment).
    RETIRED: ClassVar[tuple[str, ...]] = ("measured_max_s", "stop_passing", "fleet_warmup_s")

    def measured_at(self, rate: float) -> int:
        """Requests a point at `rate` measures."""
        if not self.measured_s:
            return self.measured
        return min(self.measured, max(self.measured_min, round(rate * self.measured_s)))


QUICK = Profile(
    measured=200, floor_repeats=3, cached_rank_iterations=20, window_delays_ms=(), refine_steps=0, seed_cap=3
)
PROFILE_SETTINGS = {
    "quick": QUICK,
    # More of everything: refined loads, up to five load seeds a verdict, two more relay windows.
    "full": dataclasses.replace(
        QUICK,
        measured=1000,
        floor_repeats=7,
        cached_rank_iterations=100,
        window_delays_ms=(30.0, 200.0),
        refine_steps=2,
        seed_cap=5,
    ),
    # Points sized by their rate (4 s of requests, 150-300), the floor timed twice, one seed a verdict
    # (the time budget has no room for more).
    "gpu": dataclasses.replace(
        QUICK, measured=300, floor_repeats=2, measured_s=4.0, measured_min=150, seed_cap=1
    ),
}

# The profiles' own defaults, each applied where neither its flag nor its RELAYGR_ variable is given
# (`profile_environ`); a profile not named here takes the settings' documented defaults.
PROFILE_DEFAULTS: dict[str, dict[str, object]] = {
    "gpu": {
        "name": "gpu-fleet",
        "slo_ms": 80.0,
        "relay_window_ms": 80.0,
        "model_preset": "gpu-dlrmv3",
        "rankers": 1,
        "torch_threads": 2,
        "pre_infer_chunk_tokens": 2048,
        "hbm_budget_mb": -1.0,
        "dram_budget_mb": -1.0,
        "ranker_profile_lengths": "128,512,2048,8192,16000",
        "ranker_profile_repeats": 1,
        "lengths": "1024,2048,3072,4096,6144,8192,12288,16000",
        "length_rate": 50.0,
        "loads": "4,6,9,13,20,30,45,64,90,128,180,256,360,512,720,1024",
        "mix_median": 4096,
        "mix_max": 8192,
        "mix2_median": 8192,
        "mix2_max": 16000,
        "abandon_fractions": "0",
        "warmup_s": 2.0,
        "startup_timeout_s": 120.0,
        "time_budget_s": 330.0,
        "floor_device": "auto",
    },
}


@dataclasses.dataclass(frozen=True)
class BenchConfig(WorkloadSettings, RankerProfileSettings):
    # Settings whose mechanism is gone, which committed results record: the host-speed waits and the run
    # checks (a run's drift is recorded, not judged; the headline measures it per block, `bench.headline`).
    RETIRED: ClassVar[tuple[str, ...]] = (
        "host_wait_s",
        "floor_drift_limit",
        "stop_when_flagged",
        "foreign_cores_limit",
    )
    profile: str = setting(
        "quick",
        "the run's profile: quick (make bench), full (make bench-full) or gpu (one ranker on a GPU, within "
        "--time-budget-s)",
        choices=PROFILES,
    )
    name: str = setting("", "results go to bench/results/<name>/ (empty: the profile's name)")
    slo_u: float = setting(
        2.87,
        "ranking-latency P99 SLO (the Rank as the stub sees it) in the host's unit u, the in-process "
        "full pass at the first mix's cap timed at the run's start (2.87 u: 100 ms where u is 34.9 ms)",
        above=0,
    )
    slo_ms: float = setting(
        0.0, "an absolute ranking-latency P99 SLO, ms, in place of --slo-u (0: --slo-u times u)", minimum=0
    )
    slo_multiples: str = setting(
        "2,2.87,4",
        "SLO multiples of u at which the first mix's load sweeps find each mode's capacity (the capacity "
        "against the SLO; --slo-u among them is the headline's)",
        items=float,
        increasing=True,
        above=0,
    )
    relay_window_u: float = setting(
        2.87, "the relay window in the host's unit u (the stub's pre-processing time)", minimum=0
    )
    max_error_fraction: float = setting(
        0.001, "a point meets the SLO only with fewer errors than this share", above=0, maximum=1
    )
    relay_window_ms: float = setting(
        0.0,
        "an absolute relay window, ms, in place of --relay-window-u (the stub's pre-processing time, the "
        "trigger's placement window; 0: --relay-window-u times u)",
        minimum=0,
    )
    model_preset: str = setting("cpu-small", "every ranker's model preset", choices=MODEL_PRESET_NAMES)
    rankers: int = setting(2, "rankers per fleet", above=0)
    torch_threads: int = setting(1, "intra-op threads per ranker (and of the in-process floor)", above=0)
    pre_infer_chunk_tokens: int = setting(
        512, "the rankers' pre-inference chunk (a Rank waits at most one); 512 is the fastest on CPU", above=0
    )
    hbm_budget_mb: float = setting(256.0, "HBM-tier budget per ranker, MiB (-1: the ranker's auto budget)")
    dram_budget_mb: float = setting(
        1024.0, "DRAM-tier budget per ranker, MiB (the baseline and no-dram: 0; -1: the ranker's auto budget)"
    )
    lengths: str = grid(
        "512,768,1024,1536,2048,3072,4096,6144,8192",
        "long-term lengths of the length sweep (experiment 1)",
        int,
    )
    length_rate: float = setting(8.0, "offered load of the length sweep, Recommend calls per second", above=0)
    loads: str = grid(
        "1,1.5,2,3,4,6,8,11,16,23,32,45,64,90,128",
        "offered loads of the throughput sweeps (experiment 2), calls/s",
    )
    mix2_median: int = setting(
        1536, "median long-term length of the second, longer mix (same sigma)", above=0
    )
    mix2_max: int = setting(4096, "longest long-term history of the second mix", above=0)
    abandon_fractions: str = setting(
        "0,0.1,0.3",
        "shares of requests abandoned after retrieval (Admit sent, no Rank) at which both modes' load "
        "sweeps run on the first mix; 0 is the throughput sweep itself",
        items=float,
        increasing=True,
        minimum=0,
        below=1,
    )
    ablations: str = setting(
        ",".join(ABLATION_NAMES),
        "the ablations swept on the first mix (experiment 4; comma list, may be empty)",
        items=str,
        choices=ABLATION_NAMES,
        distinct=True,
        may_be_empty=True,
    )
    growth_headroom: int = setting(
        256, "events a fixed-length history may grow by before it slides", minimum=0
    )
    warmup_s: float = setting(5.0, "seconds of each point's load that are not measured", minimum=0)
    load_seed: int = setting(0, "seed of arrivals and user draws (the same in every mode)")
    startup_timeout_s: float = setting(300.0, "seconds each service gets to become healthy", above=0)
    time_budget_s: float = setting(
        0.0,
        "gpu profile: wall-clock seconds of the whole run, fleet starts included; a point that would end "
        "past it is not measured (or is stopped) and its sweep is marked cut short (0: no budget)",
        minimum=0,
    )
    floor_device: str = setting(
        "cpu", "device of the in-process floor: cpu, cuda, npu or auto (as the rankers' --device)"
    )
    routing: str = setting(
        "direct",
        "how each fleet's trigger and stubs reach the rankers (the launcher's --routing): direct, or "
        "router (every PreInfer and Rank through the router)",
        choices=ROUTINGS,
    )

    def validate(self) -> None:
        """The bounds `setting()` cannot declare: -1 (auto) budgets, and each mix's median below its cap."""
        if not (self.hbm_budget_mb > 0 or self.hbm_budget_mb == -1):
            raise ValueError("--hbm-budget-mb must be positive or -1 (auto)")
        if not (self.dram_budget_mb >= 0 or self.dram_budget_mb == -1):
            raise ValueError("--dram-budget-mb must not be negative, or be -1 (auto)")
        WorkloadSettings.validate(self)
        if self.mix2_median >= self.mix2_max:
            raise ValueError("--mix2-median must be below --mix2-max")
        if not self.slo_ms and self.slo_u not in self.slo_multiple_grid():
            raise ValueError("--slo-multiples must hold --slo-u, the headline's multiple")

    def in_host_unit(self, u_ms: float) -> BenchConfig:
        """These settings with the SLO and the relay window in ms: each one not set absolute is its
        multiple of the host's unit `u_ms`."""
        return dataclasses.replace(
            self,
            slo_ms=self.slo_ms or round(self.slo_u * u_ms, 1),
            relay_window_ms=self.relay_window_ms or round(self.relay_window_u * u_ms, 1),
        )

    def slo_multiple_grid(self) -> list[float]:
        return listed(self, "slo_multiples")

    @property
    def unit_length(self) -> int:
        """The long-term length whose full pass is the host's unit u: the first mix's cap."""
        return self.mix_max

    @property
    def settings(self) -> Profile:
        return PROFILE_SETTINGS[self.profile]

    @property
    def results_name(self) -> str:
        return self.name or self.profile

    def length_grid(self) -> list[int]:
        return listed(self, "lengths")

    def load_grid(self) -> list[float]:
        return listed(self, "loads")

    def abandon_grid(self) -> list[float]:
        return listed(self, "abandon_fractions")

    def ablation_names(self) -> list[str]:
        return listed(self, "ablations")

    @property
    def longest_long_term(self) -> int:
        """The longest long-term history any universe of the run serves (growth included)."""
        return max(self.length_grid()[-1] + self.growth_headroom, self.mix_max, self.mix2_max)


def profile_environ(argv: Sequence[str] | None, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the chosen profile's defaults (`PROFILE_DEFAULTS`) added as `RELAYGR_…` variables
    where the variable is not set. `load` reads variables as defaults that flags override, so a setting
    comes from its flag, else its variable, else the profile, else its documented default."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument(flag_name("profile"), dest="profile", default=None)
    chosen = chooser.parse_known_args(list(argv) if argv is not None else sys.argv[1:])[0].profile
    profile = chosen or environ.get(env_name("profile")) or BenchConfig.profile
    merged = dict(environ)
    for name, value in PROFILE_DEFAULTS.get(profile, {}).items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        merged.setdefault(env_name(name), text)
    return merged


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, description: str = ""
) -> BenchConfig:
    """The benchmark's settings from flags, variables and the chosen profile's defaults."""
    environ = os.environ if environ is None else environ
    merged = profile_environ(argv, environ)
    return load(BenchConfig, argv, environ=merged, prog="python -m bench run", description=description)
