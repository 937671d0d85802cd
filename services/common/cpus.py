"""The CPUs this process may use: the smaller of its CPU affinity and its cgroup's CPU quota.

Torch sizes its intra-op thread pool by the host's cores, not by what the process may run on: a pod with
`limits.cpu: 2` on a 64-core node starts 64 threads that the CFS quota then throttles, and two rankers
started on one 2-core host with two threads each spin-wait for cores the other holds. `cpu_budget()` is
what a process should size its pools by instead: the CPUs in its affinity mask (`os.sched_getaffinity`,
which a cpuset or `taskset` narrows), and the CPUs its cgroup's quota pays for (cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us` over `cpu.cfs_period_us`; a container sees its own cgroup at these paths), whichever
is fewer. A fractional quota rounds down, to at least one CPU: a thread more than the quota pays for is
throttled at every period's end.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

# cgroup v2's quota file, then v1's quota and period (the `cpu` controller, alone or joined with cpuacct).
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_DIRS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))
# What a budget's `source` names, in words.
SOURCES = {
    "affinity": "affinity mask",
    "cgroup_v2": "cgroup v2 cpu.max",
    "cgroup_v1": "cgroup v1 cfs_quota_us",
}


@dataclasses.dataclass(frozen=True)
class CpuBudget:
    """Whole CPUs this process may use, and what decided it."""

    cpus: int
    affinity: int  # CPUs in the affinity mask
    quota: float | None  # CPUs the cgroup quota pays for; None: no quota
    source: str  # what decided: "affinity", "cgroup_v2" (cpu.max) or "cgroup_v1" (cfs_quota_us)

    def describe(self) -> str:
        quota = (
            "no CPU quota" if self.quota is None else f"a {SOURCES[self.source]} quota of {self.quota:g} CPUs"
        )
        decided = "the affinity mask" if self.source == "affinity" else f"the {SOURCES[self.source]} quota"
        return f"{self.cpus}, from {decided} ({self.affinity} CPUs in the affinity mask, {quota})"


def cgroup_quota(
    v2: Path = CGROUP_V2_CPU_MAX, v1_dirs: Sequence[Path] = CGROUP_V1_DIRS
) -> tuple[float, str] | None:
    """The CPUs the cgroup's quota pays for and which cgroup version says so (a `SOURCES` key); None
    without a quota."""
    try:
        quota, period = v2.read_text().split()[:2]
    except (OSError, ValueError):
        pass
    else:
        if quota == "max":
            return None
        return int(quota) / int(period), "cgroup_v2"
    for folder in v1_dirs:
        try:
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            period_us = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return (quota_us / period_us, "cgroup_v1") if quota_us > 0 and period_us > 0 else None
    return None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (the host's CPU count where the platform has no masks)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_budget() -> CpuBudget:
    """This process's CPU budget, read from the system."""
    return budget_of(affinity_cpus(), cgroup_quota())


def budget_of(affinity: int, quota: tuple[float, str] | None) -> CpuBudget:
    """The budget of a process with `affinity` CPUs in its mask and a cgroup `quota` (`cgroup_quota()`)."""
    if quota is None:
        return CpuBudget(affinity, affinity, None, "affinity")
    cpus, source = quota
    allowed = max(1, math.floor(cpus))
    if allowed < affinity:
        return CpuBudget(allowed, affinity, cpus, source)
    return CpuBudget(affinity, affinity, cpus, "affinity")
