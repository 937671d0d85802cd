"""What the device scheduler queues: a job's priority and op, the batch it may join, and the job itself.

`Priority` orders the queue (most urgent first), `Op` labels what a job does in the model-time metrics,
and `Job` is one queued callable with the future it resolves (`scheduler.py` runs them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable
from typing import Any

from services.ranker.engine.device_time import DeviceTime


class Priority(enum.IntEnum):
    """Most urgent first. A cached rank is short; a prefix a Rank waits for is long, so the ranks queued
    behind it run between its chunks (shortest first among the work Ranks wait on: a queue of ready ranks
    never waits behind a prefix computation)."""

    RANK = 0  # a rank against a ready prefix (and a Rank's reload, on the copy thread)
    AWAITED = 1  # a prefix a Rank waits for: a miss's computation, or a pre-inference a Rank joined
    RELOAD = 2  # a reload a PreInfer asked for, before its Rank arrives
    PRE_INFER = 3  # background pre-inference


# The priorities of device work that Ranks are waiting on (the bound of `--max-queued-ranks`).
FOR_RANKS = (Priority.RANK, Priority.AWAITED)


class Op(enum.StrEnum):
    """What a job does: the `op` label of relaygr_model_seconds."""

    PRE_INFER = "pre_infer"  # a prefix computed in chunks: for a PreInfer, or for a Rank that missed
    EXTEND = "extend"  # a cached prefix extended with the events appended since
    RANK = "rank"  # short-term events and candidates scored against a prefix
    UNCACHED = "uncached"  # a prefix computed, ranked against and dropped (no room to cache it)
    RELOAD = "reload"  # a copy DRAM -> HBM (copy thread)
    DEMOTE = "demote"  # a copy HBM -> DRAM (copy thread)
    HANDOFF = "handoff"  # a copy HBM -> host of a prefix handed to another ranker (copy thread)
    PROFILE = "profile"  # the warm-up latency curve


@dataclasses.dataclass(eq=False)
class Batch:
    """Jobs that may run together: `run(items)` returns one result per item, in order."""

    run: Callable[[list[Any]], list[Any]]
    max_size: int

    def __post_init__(self) -> None:
        if self.max_size < 1:
            raise ValueError("a batch holds at least one job")


# The jobs that run the model (the others copy tensors or measure).
MODEL_PASSES = (Op.PRE_INFER, Op.EXTEND, Op.RANK, Op.UNCACHED)


@dataclasses.dataclass(order=True)
class Job:
    """A queued callable. Jobs order by priority, then by submission (FIFO within a priority)."""

    priority: Priority
    seq: int
    deadline: float | None = dataclasses.field(compare=False)
    fn: Callable[[], Any] = dataclasses.field(compare=False)
    future: asyncio.Future = dataclasses.field(compare=False)
    op: Op = dataclasses.field(compare=False)
    # Set for a job that may run with others of its batch; `fn` runs it alone.
    batch: Batch | None = dataclasses.field(default=None, compare=False)
    item: Any = dataclasses.field(default=None, compare=False)
    # Set for a job that yields between its steps: `fn` takes the running job's `Yield`.
    yields: bool = dataclasses.field(default=False, compare=False)
    # The events its model pass covers, for the observer (0: none told).
    work: int = dataclasses.field(default=0, compare=False)
    time: DeviceTime = dataclasses.field(default_factory=lambda: DeviceTime(time.time_ns()), compare=False)


@dataclasses.dataclass
class Running:
    """A job on the device thread: its priority (raised by `promote`) and the future it resolves."""

    priority: int
    future: asyncio.Future


def set_result(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
