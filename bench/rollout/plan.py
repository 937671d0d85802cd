"""What a rollout run does when: its phases and the fleet changes that open them (`Plan`).

Times are seconds since the run's load started. A run's load runs from 0 to `Plan.duration_s` whatever the
fleet does, so every mode of a seed sends the same requests at the same times; the fleet changes are
made at their planned times, or later when the previous one is not done by then (a restart waits for
Ready, as a rollout does), which the run records (`bench.rollout.run`). Phases are the planned windows:

- warm-up: the users' first visits (not measured);
- steady: the fleet as it runs between changes, the reference for hit rates;
- rollout: the rolling restart, one ranker at a time in the order `kubectl rollout restart` takes a
  StatefulSet's pods (`restart_order`: the highest ordinal first), each SIGTERMed (it drains and hands its
  prefixes off), started again on the same name and ports, and waited Ready before the next one's slot;
- scale-out: the spare member started (declared on every ring from the start, it was unroutable, its
  users with their next member);
- scale-in: the spare SIGTERMed and not started again (the highest ordinal goes, as a StatefulSet scales in);
- tail: the fleet back at its size.
"""

from __future__ import annotations

import dataclasses
import re

from bench.rollout.config import RolloutConfig
from services.launcher.fleet import ranker_name

WARMUP, STEADY, ROLLOUT, SCALE_OUT, SCALE_IN, TAIL = (
    "warm-up",
    "steady",
    "rollout",
    "scale-out",
    "scale-in",
    "tail",
)
MEASURED_PHASES = (STEADY, ROLLOUT, SCALE_OUT, SCALE_IN, TAIL)
# The fleet changes: a restart SIGTERMs a ranker and starts it again, a start brings the spare up, a stop
# SIGTERMs it for good.
RESTART, START, STOP = "restart", "start", "stop"


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

    def phase_at(self, at_s: float) -> str | None:
        """The phase that holds `at_s` (None outside the load)."""
        return next((phase.name for phase in self.phases if phase.holds(at_s)), None)


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
    spare = ranker_name(c.rankers)
    lengths = [
        (WARMUP, c.warmup_s), (STEADY, c.steady_s), (ROLLOUT, c.restart_slot_s * len(rankers)),
        (SCALE_OUT, c.scale_out_s), (SCALE_IN, c.scale_in_s), (TAIL, c.tail_s),
    ]  # fmt: skip
    phases, start = [], 0.0
    for name, length in lengths:
        phases.append(Phase(name, start, start + length))
        start += length
    made = Plan(tuple(phases), (), rankers, spare)
    rollout = made.phase(ROLLOUT).start_s
    changes = [
        *(
            Change(RESTART, name, rollout + k * c.restart_slot_s)
            for k, name in enumerate(restart_order(rankers))
        ),
        Change(START, spare, made.phase(SCALE_OUT).start_s),
        Change(STOP, spare, made.phase(SCALE_IN).start_s),
    ]
    return dataclasses.replace(made, changes=tuple(changes))


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
