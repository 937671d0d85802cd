"""What a point cost the fleet: CPU seconds per process and the rankers' own counters; and the one scrape of
a ranker's Prometheus metrics (`scrape`), read flat by family (`metric_values`: `key`, or `key/label
value` for a split family, summed over its samples; a family a ranker does not export is absent).

`snapshot` reads the machine's busy CPU time (/proc/stat), every fleet process's CPU time and, from every
ranker, `RANKER_KEYS` (a counter a ranker does not export reads as 0). `difference` of two snapshots taken
around a point says where its CPU went: the rankers' pre-inference against ranking, the router, trigger,
stub and load generator, and the processes that are not ours (`foreign_cores`: other users of a shared
machine). A pre-inference's device seconds include the Ranks it let run between its chunks.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Collection, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

LOAD_GENERATOR = "bench (load generator)"
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SCRAPE_TIMEOUT_S = 5.0

# Every ranker family a benchmark reads: Prometheus family -> (the key it gets here, the label that splits
# it, the sample suffix to read).
FAMILIES = {
    "relaygr_productions": ("productions", "kind", "_total"),
    "relaygr_pre_infer": ("pre_infer", "outcome", "_total"),
    "relaygr_production_joins": ("joins", None, "_total"),
    "relaygr_model_seconds": ("device_s", "op", "_sum"),
    "relaygr_pre_infer_tokens": ("pre_infer_tokens", "fate", "_total"),
    "relaygr_pre_infer_wasted_seconds": ("pre_infer_wasted_s", None, "_total"),
    "relaygr_handoff_sent_entries": ("handoff_sent", "outcome", "_total"),
    "relaygr_handoff_sent_bytes": ("handoff_sent_bytes", None, "_total"),
    "relaygr_handoff_received_entries": ("handoff_received", "outcome", "_total"),
    "relaygr_handoff_received_bytes": ("handoff_received_bytes", None, "_total"),
    "relaygr_read_through": ("read_through", "outcome", "_total"),
    "relaygr_read_through_bytes": ("read_through_bytes", None, "_total"),
    "relaygr_handoff_duration_seconds": ("handoff_duration_s", None, ""),
    "relaygr_kv_cache_bytes": ("kv_bytes", "tier", ""),
}
# The keys a point's snapshot reads: prefix productions by kind, PreInfer outcomes, joins of in-flight
# productions, device-thread seconds by operation, pre-inferred tokens by fate and the wasted ones' seconds.
RANKER_KEYS = ("productions", "pre_infer", "joins", "device_s", "pre_infer_tokens", "pre_infer_wasted_s")


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


def scrape(metrics_url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> str:
    """A service's Prometheus exposition (an OSError when it does not answer)."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as answer:
        return answer.read().decode()


def metric_values(text: str, keys: Collection[str]) -> dict[str, float]:
    """The families of `keys` (`FAMILIES`) in one exposition, flat: `key` or `key/label value`."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key, label, suffix = FAMILIES.get(family.name, ("", None, ""))
        if key not in keys:
            continue
        for sample in family.samples:
            if sample.name == family.name + suffix:
                name = key if label is None else f"{key}/{sample.labels[label]}"
                values[name] = values.get(name, 0.0) + sample.value
    return values


def counters_from_text(text: str) -> dict[str, Any]:
    """The `RANKER_KEYS` counters of one ranker's exposition, a split family's as a dict by label."""
    counters: dict[str, Any] = {
        key: ({} if label else 0.0) for key, label, _ in FAMILIES.values() if key in RANKER_KEYS
    }
    for name, value in metric_values(text, RANKER_KEYS).items():
        key, _, label = name.partition("/")
        if label:
            counters[key][label] = value
        else:
            counters[key] = value
    return counters


def snapshot(pids: Mapping[str, int], ranker_metrics: Mapping[str, str]) -> dict[str, Any]:
    """CPU seconds of every named process (and of this one), and every ranker's counters summed."""
    cpu = {name: process_cpu_s(pid) for name, pid in pids.items()}
    cpu[LOAD_GENERATOR] = time.process_time()
    rankers: dict[str, Any] = {}
    for url in ranker_metrics.values():
        _add(rankers, counters_from_text(scrape(url)))
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
