"""A process's CPU budget: the fewer of its affinity mask's CPUs and its cgroup quota's, read from cgroup v2
and v1 files as a container sees them."""

from __future__ import annotations

import os

import pytest

from services.common.cpus import budget_of, cgroup_quota, cpu_budget


def test_cgroup_v2_quota_is_quota_over_period(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("250000 100000\n")
    assert cgroup_quota(cpu_max, ()) == (2.5, "cgroup_v2")
    cpu_max.write_text("max 100000\n")
    assert cgroup_quota(cpu_max, ()) is None


def test_cgroup_v1_quota_is_read_where_v2_has_none(tmp_path):
    v1 = tmp_path / "cpu,cpuacct"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path / "absent", (tmp_path / "cpu", v1)) == (2.0, "cgroup_v1")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert cgroup_quota(tmp_path / "absent", (v1,)) is None
    assert cgroup_quota(tmp_path / "absent", (tmp_path / "none",)) is None


@pytest.mark.parametrize(
    ("affinity", "quota", "cpus", "source"),
    [
        (64, None, 64, "affinity"),
        (64, (2.0, "cgroup_v2"), 2, "cgroup_v2"),
        (64, (2.5, "cgroup_v1"), 2, "cgroup_v1"),  # a thread beyond the quota is throttled: rounds down
        (64, (0.5, "cgroup_v2"), 1, "cgroup_v2"),  # never below one
        (2, (4.0, "cgroup_v2"), 2, "affinity"),  # a cpuset narrower than the quota
    ],
)
def test_the_budget_is_the_fewer_of_affinity_and_quota(affinity, quota, cpus, source):
    budget = budget_of(affinity, quota)
    assert (budget.cpus, budget.source) == (cpus, source)
    assert str(cpus) in budget.describe()


def test_this_process_budget_fits_its_affinity():
    budget = cpu_budget()
    assert budget.affinity == len(os.sched_getaffinity(0))
    assert 1 <= budget.cpus <= budget.affinity
