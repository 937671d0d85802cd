"""Coalescing: the PreInfers bound for one ranker within a short window go as one PreInferBatch call.

At a ranker's few hundred PreInfers a second, gRPC's fixed cost per call (a large part of a millisecond of
the ranker's CPU in Python) is much of what a PreInfer costs it. A trigger that routes directly knows the
member each admitted prefix goes to, so it gathers them per member:

- the first item for a member opens a batch that is sent `window_s` later, or at once when it holds
  `max_size` items (a full batch does not wait);
- a window is opened only where another item is due within it: once a member's items have come further
  apart than the window (their gaps' moving average, `GAP_WEIGHT`), an item that finds no batch open goes
  at once, alone, so a quiet member's PreInfers wait for nothing; a member's first items, with no gaps
  measured yet, open windows;
- each caller waits for its own item's answer (or its own error), so the caller's latency grows by at most
  the window; a call that fails fails every item of the batch with the call's error;
- the call gets the time its earliest item has left of its timeout, and runs in the context of the caller
  that opened the batch (a traced call has one parent: that caller's).

`Coalescer` knows nothing of PreInfer: `send(key, items, timeout_s)` is given the batch and returns one
result per item, in order, each a value or the exception that item's caller gets. When a prefix goes alone
instead, and why (`Alone`), is the data plane's rule (`services.trigger.dataplane`).

Not thread-safe: the trigger's event loop owns it.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Sends one batch: (key, items, timeout in seconds) -> one result per item, in order (a value, or the
# exception its caller gets); raises when the whole call fails.
Send = Callable[[str, list[T], float], Awaitable[Sequence[R | Exception]]]


# The weight of the newest gap in a key's moving average of the gaps between its items.
GAP_WEIGHT = 0.25


class Alone(enum.StrEnum):
    """Why a PreInfer went alone, as a single call at once: the `reason` label of the trigger's metric."""

    WINDOW_OFF = "window_off"  # coalescing is off (--pre-infer-batch-window-ms 0)
    WOULD_MISS_RANK = "would_miss_rank"  # its pre-inference plus the window would outlast the relay window
    THROUGH_ROUTER = "through_router"  # no member is known: the router places it


@dataclasses.dataclass(eq=False)
class _Batch(Generic[T, R]):
    """The items gathered for one key, each with its caller's future, the earliest deadline among them (the
    loop's clock) and the context of the caller that opened it."""

    deadline: float
    context: contextvars.Context
    items: list[T] = dataclasses.field(default_factory=list)
    futures: list[asyncio.Future[R]] = dataclasses.field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Coalescer(Generic[T, R]):
    """Gathers the items submitted for one key within `window_s` (at most `max_size`) into one `send`."""

    def __init__(
        self, send: Send, window_s: float, max_size: int, clock: Callable[[], float] | None = None
    ) -> None:
        """`clock`: what the gaps between a key's items are measured by (seconds; the loop's time)."""
        if window_s <= 0 or max_size < 1:
            raise ValueError("a coalescer needs a positive window and room for one item")
        self._send = send
        self.window_s = window_s
        self.max_size = max_size
        self._open: dict[str, _Batch[T, R]] = {}
        self._sending: set[asyncio.Task] = set()
        self._clock = clock
        # Of each key: when its last item came, and the moving average of the gaps between its items.
        self._last: dict[str, float] = {}
        self._gap: dict[str, float] = {}

    async def submit(self, key: str, item: T, timeout_s: float) -> R:
        """`item`'s own result, once the batch it joined for `key` was sent and answered; raises its own
        error, or the failed call's."""
        loop = asyncio.get_running_loop()
        quiet = self._quiet(key)
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch(loop.time() + timeout_s, contextvars.copy_context())
            batch.timer = loop.call_later(self.window_s, self._flush, key, batch)
        future: asyncio.Future[R] = loop.create_future()
        batch.items.append(item)
        batch.futures.append(future)
        batch.deadline = min(batch.deadline, loop.time() + timeout_s)
        if len(batch.items) >= self.max_size or (quiet and len(batch.items) == 1):
            self._flush(key, batch)
        return await future

    def _quiet(self, key: str) -> bool:
        """Whether `key`'s items come further apart than the window (an item now is one more gap)."""
        now = (self._clock or asyncio.get_running_loop().time)()
        last = self._last.get(key)
        self._last[key] = now
        if last is None:
            return False
        gap = self._gap.get(key)
        self._gap[key] = now - last if gap is None else gap + GAP_WEIGHT * (now - last - gap)
        return self._gap[key] > self.window_s

    def _flush(self, key: str, batch: _Batch[T, R]) -> None:
        """Closes `batch` and sends the items whose callers still wait (a cancelled caller's item is left
        out)."""
        if self._open.get(key) is batch:
            del self._open[key]
        batch.timer.cancel()
        waiting = [(item, f) for item, f in zip(batch.items, batch.futures, strict=True) if not f.done()]
        if not waiting:
            return
        call = self._call(key, waiting, batch.deadline)
        task = asyncio.get_running_loop().create_task(call, context=batch.context)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _call(self, key: str, waiting: list[tuple[T, asyncio.Future[R]]], deadline: float) -> None:
        items = [item for item, _ in waiting]
        try:
            results = await self._send(key, items, max(0.0, deadline - asyncio.get_running_loop().time()))
            if len(results) != len(items):
                raise RuntimeError(f"{len(results)} results for a batch of {len(items)}")
        except Exception as exc:  # the call failed: each caller gets its error
            results = [exc] * len(items)
        except asyncio.CancelledError:  # closing: no caller is left waiting
            for _, future in waiting:
                future.cancel()
            raise
        for (_, future), result in zip(waiting, results, strict=True):
            if future.done():  # its caller gave up meanwhile
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def close(self) -> None:
        """Cancels the open batches' callers and the calls in flight."""
        for batch in self._open.values():
            batch.timer.cancel()
            for future in batch.futures:
                future.cancel()
        self._open.clear()
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
