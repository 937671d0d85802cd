"""When a job ran on the ranker's device thread: its `DeviceTime`, carried by the future the scheduler
returned for it (`device_time(future)`), which a traced request turns into its queue-wait and model-pass spans
(`trace_device`)."""

from __future__ import annotations

import asyncio
import dataclasses

from services.common import tracing


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
