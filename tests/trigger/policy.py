"""The admission policy's test bench: limits, a fake clock, a policy over a fleet view, prefixes whose costs
scale like the model's, and the load reports rankers send."""

from __future__ import annotations

from relaygr.v1 import ranker_pb2
from services.trigger.admission import AdmissionPolicy, Limits, Prefix
from services.trigger.fleet_load import FleetLoad

MIB = 1024 * 1024
RANKERS = ("ranker-a", "ranker-b")
LIMITS = Limits(
    slo_ms=100.0,
    relay_overhead_ms=2.0,
    duplicate_window_s=3.0,
    waste_budget=0.1,
    hbm_lease_fraction=0.5,
    max_backlog_ms=400.0,
    high_water=0.8,
    low_water=0.5,
    adjust_s=0.1,
    step=2.0,
    floor_events=256,
    max_events=8192,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(limits: Limits = LIMITS) -> tuple[AdmissionPolicy, FleetLoad, Clock]:
    clock = Clock()
    fleet = FleetLoad(waste_window_s=10.0, clock=clock)
    fleet.set_members(RANKERS)
    fleet.assume_hbm_capacity(64 * MIB)  # the fleet profile's, until a ranker reports its own
    return AdmissionPolicy(limits, fleet, clock), fleet, clock


CALL_MS = 0.5  # a model call's fixed cost on the device


def prefix(user: str, length: int = 2048, miss_ms: float = 40.0, seq: int = 0) -> Prefix:
    """A prefix whose costs scale with its length like the model's: pre-inferring it costs most of the miss,
    and relay moves that work (without the call's fixed cost) off the critical path."""
    pre_infer_ms = miss_ms * 0.8
    return Prefix(
        key=(user, length, seq),
        user_id=user,
        length=length,
        nbytes=length * 1024,
        miss_ms=miss_ms,
        gain_ms=pre_infer_ms - CALL_MS,
        pre_infer_ms=pre_infer_ms,
    )


def report(instance: str, **fields) -> ranker_pb2.LoadReport:
    defaults = {"hbm_capacity_bytes": 64 * MIB, "lease_ttl_ms": 3000}
    return ranker_pb2.LoadReport(instance=instance, **{**defaults, **fields})


def user_on(fleet: FleetLoad, member: str, start: int = 0) -> str:
    return next(f"u{i}" for i in range(start, start + 10_000) if fleet.target(f"u{i}") == member)
