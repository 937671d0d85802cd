"""When a job ran on the ranker's device thread: its `DeviceTime`, carried by the future the scheduler
returned for it (`device_time(future)`), which a traced request turns into its queue-wait and model-pass spans
(`trace_device`); and how long each job took there (`JobClock`), which the scheduler counts."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from services.common import tracing
from services.common.metrics import Children
from services.ranker import metrics


@dataclasses.dataclass
class DeviceTime:
    """When a job was queued, started and ended on the device thread (`time.time_ns()`, the clock traces
    use; 0 until it happens) and how many jobs its pass ran. A nested job's time is inside its outer one's."""

    queued_ns: int
    started_ns: int = 0
    ended_ns: int = 0
    batch_size: int = 1


def device_time(future: asyncio.Future) -> DeviceTime | None:
    """The `DeviceTime` of the job that resolves `future` (None for a future no scheduler made)."""
    return getattr(future, "device_time", None)


def trace_device(future: asyncio.Future, name: str, **attributes: object) -> None:
    """Tells a finished job's time on the device thread as two spans of the current (sampled) request: the
    wait in the queue (`queue`), then the pass itself (`name`), with its batch size."""
    timing = device_time(future)
    if timing is None or not timing.ended_ns or not tracing.sampled():
        return
    tracing.record("queue", timing.queued_ns, timing.started_ns, op=name)
    tracing.record(name, timing.started_ns, timing.ended_ns, batch_size=timing.batch_size, **attributes)


class JobClock:
    """The time of each job a scheduler's thread runs, jobs run nested at a `Yield` inside their outer job's:
    `start` as a job (or a batch's pass) starts, `stop` as it ends, before any caller is handed an outcome.
    Only the scheduler's own thread calls it."""

    def __init__(self) -> None:
        # Seconds the thread has spent running jobs (nested ones are inside their outer job's time).
        self.busy_s = 0.0
        self._cpu_seconds = Children(metrics.MODEL_CPU_SECONDS)
        self._model_seconds = Children(metrics.MODEL_SECONDS)
        # Of each job on the thread, innermost last: [thread CPU at its start, CPU of the jobs nested in it,
        # wall time at its start, wall time of the jobs nested in it].
        self._frames: list[list[float]] = []

    def start(self) -> None:
        self._frames.append([time.thread_time(), 0.0, time.perf_counter(), 0.0])

    def stop(self, op: str, served: int) -> float:
        """Counts the job's own thread CPU time and returns its own wall time: the jobs run nested at its
        `Yield` count theirs, so the per-op sums add up to the thread's time in jobs. The outermost job's
        whole wall time goes to `busy_s`. relaygr_model_seconds counts the `served` jobs (0: none, a batch
        that failed and runs again job by job) with an equal share each of the whole wall time: the count
        stays the jobs served, the sum the device time."""
        cpu_started, cpu_nested, wall_started, wall_nested = self._frames.pop()
        cpu, wall = time.thread_time() - cpu_started, time.perf_counter() - wall_started
        if self._frames:
            self._frames[-1][1] += cpu
            self._frames[-1][3] += wall
        else:
            self.busy_s += wall
        self._cpu_seconds(op).inc(cpu - cpu_nested)
        seconds = self._model_seconds(op)
        for _ in range(served):
            seconds.observe(wall / served)
        return wall - wall_nested
