"""Where the ranker's CPU goes, sampled with py-spy and classified by stack."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

# ---- where the CPU goes (py-spy) ----

# Where a sampled stack's CPU goes: its innermost frame that one of these marks (a substring of
# "function (file") names, from the innermost frame out. A stack that ends under the event loop's own
# `run` with no frame of ours is native code there: gRPC's server (Cython) and uvloop. Samples of a thread
# waiting on a lock or a condition are not CPU and are left out.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("waiting", ("Condition.wait (", "Event.wait (", "lock.acquire", "_poll_wrapper")),
    ("model", ("(services/ranker/model/", "(torch/")),
    ("response", ("_response (services/ranker/",)),
    ("decoding and validation", ("(services/common/validation.py", "(services/ranker/model/events.py",
                                 "(services/ranker/wire.py", "RankerServicer._events",
                                 "RankerServicer._known", "(protobuf/", "(numpy/")),
    ("cache bookkeeping", ("(services/ranker/cache/", "(services/ranker/engine/load.py",
                           "(services/ranker/engine/latency_curve.py")),
    ("metrics and tracing", ("(prometheus_client/", "(services/common/tracing.py", "(opentelemetry/",
                             "(services/common/metrics.py", "(services/ranker/metrics.py")),
    ("scheduling and hand-offs", ("(services/ranker/engine/", "(services/ranker/dataplane.py",
                                  "(services/ranker/servicer.py", "(asyncio/futures", "(asyncio/tasks",
                                  "(contextlib.py", "(dataclasses.py", "(threading.py")),
    ("gRPC server and event loop", ("(services/common/interceptor.py", "(grpc/", "(uvloop/",
                                    "(asyncio/runners.py", "(asyncio/base_events.py")),
]  # fmt: skip


# Threads of gRPC and of the metrics server, named by py-spy after their Python target.
THREAD_STAGES = {"(_poll_wrapper)": "gRPC server and event loop", "(serve_forever)": "metrics and tracing"}


def classify(stack: str) -> str:
    """The stage of one sampled stack (`thread (tid): name;frame;frame;...`, outermost first)."""
    thread, _, frames = stack.partition(";")
    for mark, stage in THREAD_STAGES.items():
        if mark in thread:
            return "waiting" if "Condition.wait (" in frames else stage
    for frame in reversed(frames.split(";")):
        for stage, marks in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    return "other"


def sample_stages(pid: int, seconds: float) -> subprocess.Popen:
    """Starts py-spy on `pid` for `seconds` (raw collapsed stacks, every thread, non-blocking)."""
    handle, out = tempfile.mkstemp(suffix=".txt")
    os.close(handle)
    command = [
        str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--rate", "250",
        "--duration", str(max(1, round(seconds))), "--format", "raw", "--threads", "--nonblocking",
        "--output", out,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process.out = out  # type: ignore[attr-defined]
    return process


def stage_shares(raw_path: str) -> dict[str, float]:
    """Share of the sampled CPU (busy stacks, waits left out) each stage took."""
    counts: dict[str, int] = {}
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():  # not a sample line (py-spy's own notes)
            continue
        stage = classify(stack)
        counts[stage] = counts.get(stage, 0) + int(count)
    Path(raw_path).unlink()
    counts.pop("waiting", None)
    total = sum(counts.values()) or 1
    return {stage: round(n / total, 4) for stage, n in sorted(counts.items(), key=lambda kv: -kv[1])}
