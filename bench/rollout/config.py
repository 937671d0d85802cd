"""`python -m bench rollout`'s settings (`RolloutConfig`, each a flag with a `RELAYGR_…` environment twin)
and the plan they make (`plan`): the phases and the fleet changes that open them, in seconds since the
run's load started. Why the defaults are what they are, and the phases: docs/benchmark.md ("Cache handoff
through a rollout"); the relay is off by default so that a Rank's cache source says whether the cache
followed its user (with it on, a moved user's PreInfer recomputes or reloads the prefix off the critical
path, and the handoff shows only in the device seconds and PreInfer outcomes).

The load runs from 0 to `Plan.duration_s` whatever the fleet does, so every mode of a seed sends the same
requests at the same times; a change is made at its planned time, or later when the previous one is not
done (a restart waits for Ready, as a rollout does). The rolling restart takes the rankers in the order
`kubectl rollout restart` takes a StatefulSet's pods (`restart_order`); the scale-out starts the spare
member (declared on every ring from the start, unroutable until it serves), the scale-in SIGTERMs it.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from bench.lib.fleets import FleetSettings
from bench.lib.groups import SeedSettings, redefault
from services.common.config import listed, setting
from services.common.presets import MODEL_PRESET_NAMES
from services.launcher.fleet import ranker_name

MODES = ("off", "on")
CPU_PRESETS = tuple(name for name in MODEL_PRESET_NAMES if name.startswith("cpu-"))

WARMUP, STEADY, ROLLOUT = "warm-up", "steady", "rollout"
SCALE_OUT, SCALE_IN, TAIL = "scale-out", "scale-in", "tail"
MEASURED_PHASES = (STEADY, ROLLOUT, SCALE_OUT, SCALE_IN, TAIL)
# The fleet changes: a restart SIGTERMs a ranker and starts it again, a start brings the spare up, a stop
# SIGTERMs it for good.
RESTART, START, STOP = "restart", "start", "stop"


@dataclasses.dataclass(frozen=True)
class RolloutConfig(FleetSettings, SeedSettings):
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
    seeds: int = redefault(SeedSettings, "seeds", 3)
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


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    start_s: float
    end_s: float

    def holds(self, at_s: float) -> bool:
        return self.start_s <= at_s < self.end_s


@dataclasses.dataclass(frozen=True)
class Change:
    """One planned fleet change: `action` on `ranker` at `at_s`."""

    action: str
    ranker: str
    at_s: float


@dataclasses.dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    changes: tuple[Change, ...]
    rankers: tuple[str, ...]  # started with the fleet
    spare: str

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s

    def phase(self, name: str) -> Phase:
        return next(phase for phase in self.phases if phase.name == name)


def ordinal(name: str) -> int:
    """A StatefulSet pod's ordinal: the number its name ends with."""
    found = re.search(r"(\d+)$", name)
    if found is None:
        raise ValueError(f"{name!r} has no ordinal")
    return int(found.group(1))


def restart_order(names: list[str] | tuple[str, ...]) -> list[str]:
    """The order `kubectl rollout restart` updates a StatefulSet's pods in (RollingUpdate): the highest
    ordinal first, down to 0, one at a time."""
    return sorted(names, key=ordinal, reverse=True)


def plan(config: RolloutConfig) -> Plan:
    c = config
    rankers = tuple(ranker_name(i) for i in range(c.rankers))
    lengths = [
        (WARMUP, c.warmup_s), (STEADY, c.steady_s), (ROLLOUT, c.restart_slot_s * len(rankers)),
        (SCALE_OUT, c.scale_out_s), (SCALE_IN, c.scale_in_s), (TAIL, c.tail_s),
    ]  # fmt: skip
    phases, start = [], 0.0
    for name, length in lengths:
        phases.append(Phase(name, start, start + length))
        start += length
    made = Plan(tuple(phases), (), rankers, ranker_name(c.rankers))
    restarts = [
        Change(RESTART, name, made.phase(ROLLOUT).start_s + k * c.restart_slot_s)
        for k, name in enumerate(restart_order(rankers))
    ]
    spare = [Change(START, made.spare, made.phase(SCALE_OUT).start_s),
             Change(STOP, made.spare, made.phase(SCALE_IN).start_s)]  # fmt: skip
    return dataclasses.replace(made, changes=(*restarts, *spare))


def describe(made: Plan, runs: int, overhead_s: float) -> str:
    """The plan in a few lines, with the whole run's duration: `runs` runs of the load, each with
    `overhead_s` of fleet start and stop."""
    phases = ", ".join(f"{p.name} {p.end_s - p.start_s:g} s" for p in made.phases if p.end_s > p.start_s)
    order = " → ".join(change.ranker for change in made.changes if change.action == RESTART)
    total_s = runs * (made.duration_s + overhead_s)
    return (
        f"plan: {made.duration_s:g} s of load a run ({phases}); restart order {order}; spare {made.spare}\n"
        f"{runs} run(s), each with about {overhead_s:g} s of fleet start and stop: "
        f"about {total_s / 60:.1f} min"
    )
