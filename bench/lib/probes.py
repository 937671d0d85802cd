"""What a point cost the fleet: CPU seconds per process, and the rankers' own counters.

`snapshot` reads the machine's busy CPU time (/proc/stat), for every process of a fleet its CPU time
(user + system, from /proc/<pid>/stat) and, from every
ranker's Prometheus endpoint, the prefix productions by kind (compute, reload, extend), the PreInfer
outcomes, the joins of in-flight productions, the device-thread seconds by operation, and the tokens
pre-inferred by fate (consumed by a Rank, or wasted: the lease expired or the entry was dropped first)
with the wasted ones' device seconds. A counter a ranker does not export reads as 0. `difference`
of two snapshots taken around a point says where that point's CPU went: how much the rankers spent on
pre-inference against ranking, how much the router, trigger, stub and load generator took, and how much
went to processes that are not ours (`foreign_cores`: other users of a shared machine, the noise).
A pre-inference's device seconds include the Ranks it let run between its chunks.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

LOAD_GENERATOR = "bench (load generator)"
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SCRAPE_TIMEOUT_S = 5.0

# Prometheus family -> (the key it gets here, the label that splits it, the sample suffix to read).
RANKER_FAMILIES = {
    "relaygr_productions": ("productions", "kind", "_total"),
    "relaygr_pre_infer": ("pre_infer", "outcome", "_total"),
    "relaygr_production_joins": ("joins", None, "_total"),
    "relaygr_model_seconds": ("device_s", "op", "_sum"),
    "relaygr_pre_infer_tokens": ("pre_infer_tokens", "fate", "_total"),
    "relaygr_pre_infer_wasted_seconds": ("pre_infer_wasted_s", None, "_total"),
}


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / _TICKS_PER_S  # guest time is already in user


def ranker_counters(metrics_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(metrics_url, timeout=SCRAPE_TIMEOUT_S) as answer:
        return counters_from_text(answer.read().decode())


def counters_from_text(text: str) -> dict[str, Any]:
    """The counters of one ranker's Prometheus exposition."""
    counters: dict[str, Any] = {key: ({} if label else 0.0) for key, label, _ in RANKER_FAMILIES.values()}
    for family in text_string_to_metric_families(text):
        spec = RANKER_FAMILIES.get(family.name)
        if spec is None:
            continue
        key, label, suffix = spec
        for sample in family.samples:
            if sample.name != family.name + suffix:
                continue
            if label is None:
                counters[key] += sample.value
            else:
                counters[key][sample.labels[label]] = sample.value
    return counters


def snapshot(pids: Mapping[str, int], ranker_metrics: Mapping[str, str]) -> dict[str, Any]:
    """CPU seconds of every named process (and of this one), and every ranker's counters summed."""
    cpu = {name: process_cpu_s(pid) for name, pid in pids.items()}
    cpu[LOAD_GENERATOR] = time.process_time()
    rankers: dict[str, Any] = {}
    for url in ranker_metrics.values():
        _add(rankers, ranker_counters(url))
    return {"at": time.monotonic(), "machine_busy_s": machine_busy_s(), "cpu_s": cpu, "rankers": rankers}


def _add(total: dict[str, Any], part: Mapping[str, Any]) -> None:
    for key, value in part.items():
        if isinstance(value, Mapping):
            _add(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0.0) + value


def difference(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """`after` minus `before`, key by key (rounded), with the wall seconds between them."""

    def minus(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in b.items():
            if isinstance(value, Mapping):
                out[key] = minus(a.get(key, {}), value)
            else:
                out[key] = round(value - a.get(key, 0.0), 3)
        return out

    result = minus(before, after)
    wall_s = result.pop("at")
    ours_s = sum(result["cpu_s"].values())
    result["wall_s"] = wall_s
    result["foreign_cores"] = (
        round(max(result.pop("machine_busy_s") - ours_s, 0.0) / wall_s, 3) if wall_s else 0.0
    )
    return result
