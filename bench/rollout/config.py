"""`python -m bench rollout`'s settings, each a flag with a `RELAYGR_…` environment twin.

Defaults, and why:

- `cpu-tiny`, 3 rankers with one thread each, one spare member: a fleet of four ranker processes, a
  router, a trigger, a retrieval stub and the load generator share 2 cores; a bigger model would measure
  the machine's queueing, not where each prefix came from.
- The relay off (`--relay false`: no Admit, no PreInfer): a Rank's cache source then says whether the
  cache followed its user. With the relay on, a moved user's PreInfer recomputes (handoff off) or
  reloads (on) the prefix off the critical path and the Rank finds it in HBM either way: the handoff
  shows in the rankers' device seconds and PreInfer outcomes, not in the tiers (`--relay true` runs it).
- 16 Recommend/s with 90 % of requests from a user of the last 30 s (`bench.lib.workload.RevisitSampler`):
  returning users dominate, each within the rankers' 60 s DRAM TTL; every user has 1024 long-term events
  (256 of room to grow, so a return extends its prefix instead of sliding it).
- Phases: 20 s of warm-up (not measured: the users' first visits), 30 s steady, the rolling restart (a
  20 s slot per ranker: SIGTERM, the drain and its handoff, gone after about 2 s on this machine, Ready
  again about 3 s later, then the users settle back), 30 s after the scale-out, 20 s after the scale-in,
  10 s of tail: 170 s of load a run, 3.0 minutes measured with the fleet's start and stop; 3 seeds of
  both modes take about 18-19 minutes.
"""

from __future__ import annotations

import dataclasses
import shlex

from bench.lib.fleets import FleetSettings
from services.common.config import listed, setting

SHORT_TERM = 16
NUM_CANDIDATES = 128
GROWTH_HEADROOM = 256  # long-term events a user may gain before its history slides
MODES = ("off", "on")
CPU_PRESETS = ("cpu-tiny", "cpu-small")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(FleetSettings):
    """The rollout benchmark's settings; the fleet's are `FleetSettings`' (CPU presets only)."""

    output: str = setting("bench/results/rollout", "results folder (relative to the repository root)")
    model_preset: str = setting("cpu-tiny", "every ranker's model preset", choices=CPU_PRESETS)
    rankers: int = setting(3, "rankers started (ranker-0 …); one more is declared as the spare", above=0)
    modes: str = setting(
        "off,on", "handoff modes run for each seed, in turn (the figures pair off with on)", items=str,
        distinct=True, choices=MODES,
    )  # fmt: skip
    handoff_off_flags: str = setting(
        "--handoff-budget-s 0 --read-through-grace-s 0",
        "ranker flags that turn the cache handoff off (the off mode); the on mode passes none: the rankers' "
        "defaults",
    )
    seeds: int = setting(3, "load seeds; each runs every mode with the same arrivals and users", above=0)
    load_seed: int = setting(0, "the first load seed: seeds are load_seed … load_seed + seeds - 1")
    rate: float = setting(16.0, "offered Recommend load, calls/s (open loop, Poisson)", above=0)
    revisit_probability: float = setting(
        0.9, "share of requests from a user seen within --revisit-window-s", minimum=0, below=1
    )
    population: int = setting(
        0,
        "a closed population of this many users, each first seen in the warm-up, then returning uniformly at "
        "random (0: the revisits of --revisit-probability)",
        minimum=0,
    )
    revisit_window_s: float = setting(
        30.0,
        "a revisit repeats the user of a request of the last this many s (keep it under the TTL)",
        above=0,
    )
    long_term: int = setting(1024, "long-term events of every user at the stub's start", above=0)
    dram_ttl_s: float = setting(
        60.0, "the rankers' DRAM TTL (--dram-ttl-s): a prefix idle longer is gone, handoff or not", above=0
    )
    relay: bool = setting(False, "run the relay (Admit and PreInfer) as well; see the module docstring")
    rank_timeout_ms: float = setting(
        1000.0, "the stub's Rank deadline (a missed one is a failed call)", above=0
    )
    warmup_s: float = setting(20.0, "seconds of load before the steady phase (not measured)", minimum=0)
    steady_s: float = setting(30.0, "seconds of the steady phase", above=0)
    restart_slot_s: float = setting(
        20.0,
        "seconds from one ranker's SIGTERM to the next's in the rolling restart (a restart not Ready by "
        "then delays the next, as kubectl's does)",
        above=0,
    )
    scale_out_s: float = setting(30.0, "seconds from starting the spare ranker to its SIGTERM", above=0)
    scale_in_s: float = setting(20.0, "seconds from the spare's SIGTERM to the tail", above=0)
    tail_s: float = setting(10.0, "seconds of load after the scale-in phase", minimum=0)
    scrape_interval_s: float = setting(1.0, "seconds between scrapes of every ranker's metrics", above=0)
    bucket_s: float = setting(1.0, "width of the timeline's buckets, s", above=0)
    confidence: float = setting(0.95, "confidence of every interval", above=0, below=1)
    block_s: float = setting(
        1.0, "the P99 bootstrap resamples blocks of this many seconds of requests (0: single requests)",
        minimum=0,
    )  # fmt: skip
    ranker_profile_lengths: str = setting(
        "128,1024", "prefix lengths of each ranker's warm-up curve (each restart measures it again)"
    )

    def validate(self) -> None:
        shlex.split(self.handoff_off_flags)
        if self.revisit_window_s >= self.dram_ttl_s:
            raise ValueError("--revisit-window-s must be under --dram-ttl-s: returning users come back in it")
        if self.population > self.rate * self.warmup_s:
            raise ValueError("--population: every user's first visit must fall in the warm-up (at most "
                             f"--rate x --warmup-s = {self.rate * self.warmup_s:g} users)")  # fmt: skip
        if self.population and self.population / self.rate >= self.dram_ttl_s:
            raise ValueError("--population: a user returns every population / rate s on average, which must "
                             "be under --dram-ttl-s")  # fmt: skip

    def mode_names(self) -> list[str]:
        return listed(self, "modes")

    def seed_list(self) -> list[int]:
        return list(range(self.load_seed, self.load_seed + self.seeds))

    def block(self) -> int:
        """Requests per bootstrap block."""
        return max(1, round(self.rate * self.block_s))
