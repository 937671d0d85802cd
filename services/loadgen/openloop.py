"""Open-loop load: requests sent at Poisson arrival times, whatever the server's state.

A closed-loop client waits for answers before sending more, so a slow server slows its own load and hides
its queueing ("coordinated omission"). Here every request has an intended send time drawn in advance
from the schedule; it is sent then (or at once when the loop is behind), and its latency is measured from
the intended time, so time spent waiting to be sent counts against the server, as a user would see it.
There is no concurrency limit: in-flight requests are bounded only by rate times latency.

`run_open_loop` works with any grpc.aio unary-unary callable (e.g. `RankerServiceStub(channel).Rank`)
and returns one `CallRecord` per request, in send order.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np

from services.loadgen.schedule import RateSchedule, poisson_arrivals

UnaryCall = Callable[..., Any]  # awaitable call(request, timeout=..., metadata=...) -> response


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One request of an open-loop run. Times are seconds since the run started."""

    index: int
    intended_s: float
    sent_s: float
    latency_s: float  # completion minus the intended send time
    code: grpc.StatusCode
    details: str  # the error message; empty when OK
    response: Any  # the response message; None on error

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    @property
    def send_lag_s(self) -> float:
        """How late the request left: the generator's own delay, included in `latency_s`."""
        return self.sent_s - self.intended_s


async def run_open_loop(
    call: UnaryCall,
    requests: Sequence[Any] | Callable[[int], Any],
    rate: float | RateSchedule,
    duration_s: float | None = None,
    total: int | None = None,
    timeout_s: float | None = None,
    metadata: Sequence[tuple[str, str]] = (),
    seed: int | None = None,
    stop: asyncio.Event | None = None,
    on_record: Callable[[CallRecord], None] | None = None,
    collect: bool = True,
) -> list[CallRecord]:
    """Send requests at Poisson arrivals until `duration_s` passes, `total` are sent or `stop` is set.

    `requests` is used round-robin (like ghz's data arrays), or called with the request's index. Each
    finished request is passed to `on_record`; with `collect` the records are also returned (pass False
    for unbounded runs). Requests in flight when sending ends are awaited.
    """
    if duration_s is None and total is None and stop is None:
        raise ValueError("an open-loop run needs a duration, a total or a stop event")
    schedule = rate if isinstance(rate, RateSchedule) else RateSchedule.constant(rate)
    request_at = requests if callable(requests) else lambda index: requests[index % len(requests)]
    if not callable(requests) and not requests:
        raise ValueError("no requests to send")

    loop = asyncio.get_running_loop()
    started = loop.time()
    records: list[CallRecord] = []
    in_flight: set[asyncio.Task] = set()

    async def send(index: int, intended_s: float) -> None:
        request = request_at(index)
        sent_s = loop.time() - started
        response, code, details = None, grpc.StatusCode.OK, ""
        try:
            response = await call(request, timeout=timeout_s, metadata=tuple(metadata) or None)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
        latency_s = loop.time() - started - intended_s
        record = CallRecord(index, intended_s, sent_s, latency_s, code, details, response)
        if collect:
            records.append(record)
        if on_record is not None:
            on_record(record)

    stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        for index, intended_s in enumerate(poisson_arrivals(schedule, np.random.default_rng(seed))):
            if total is not None and index >= total:
                break
            if duration_s is not None and intended_s >= duration_s:
                break
            delay = started + intended_s - loop.time()
            if stopped is not None:
                if delay > 0:
                    await asyncio.wait({stopped}, timeout=delay)
                if stopped.done():
                    break
            elif delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send(index, intended_s))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)
    finally:
        if stopped is not None:
            stopped.cancel()
        for task in in_flight:
            task.cancel()
    records.sort(key=lambda record: record.index)
    return records
