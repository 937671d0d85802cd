"""The ranker's CPU, by thread (/proc), and the CPU its model passes took (its own counter)."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

MODEL_OPS = ("pre_infer", "extend", "rank", "uncached")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


THREAD_GROUPS = ("event_loop", "device", "copy", "other")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread group of process `pid`: event_loop (its main thread), device, copy,
    other (every thread the service did not name); and `switches`, the context switches of them all
    (voluntary and not: a thread that waits for the GIL or a wake-up switches)."""
    groups = dict.fromkeys((*THREAD_GROUPS, "switches", "page_faults"), 0.0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            task = Path(f"/proc/{pid}/task/{tid}")
            text, state = (task / "stat").read_text(), (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
        group = "event_loop" if int(tid) == pid else comm if comm in ("device", "copy") else "other"
        groups[group] += seconds
        groups["page_faults"] += int(fields[7]) + int(fields[9])  # minor and major
        groups["switches"] += sum(
            int(line.split()[1]) for line in state.splitlines() if "ctxt_switches:" in line
        )
    return groups


def model_cpu_s(metrics_url: str) -> float:
    """CPU seconds the ranker's device thread has spent inside model passes so far."""
    with urllib.request.urlopen(metrics_url, timeout=5) as page:
        text = page.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("relaygr_model_cpu_seconds_total{"):
            op = line.split('op="', 1)[1].split('"', 1)[0]
            if op in MODEL_OPS:
                total += float(line.rsplit(" ", 1)[1])
    return total
