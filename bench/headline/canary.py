"""The host's unit u and its slowdown s, measured in one helper process beside the fleets.

A `Canary` spawns one process that builds the preset's model once (with the rankers' thread count) and
answers on demand:

- `unit_timings(n)`: n full passes at the mix's cap, wall time each, after one untimed pass; u is their
  median (`bench.headline.stats.host_unit`). The run times it before its fleets start and again on the
  drained host before every block.
- `readings(n)`: n canary readings, each the CPU time of the calling thread for one small fixed pass
  (`CANARY_LENGTH` events, `CANARY_CANDIDATES` candidates: a few ms). CPU time, not wall time: a reading
  grows when the same instructions take longer (a slower or shared physical core), not when it waits for
  a core behind the fleets' work. What the hypervisor takes outright is steal, read from /proc/stat
  (`steal_share`); `bench.headline.stats.slowdown` combines both.

The run reads the canary on the drained host before every trial, which decides a block's slowdown, and
once a second during every trial (`beside`), reported beside it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Iterator

from bench.lib.floor import UNIT_CANDIDATES, _timer
from services.ranker.engine.latency_curve import Timer
from services.ranker.engine.scheduler import Scheduler

CANARY_LENGTH = 256
CANARY_CANDIDATES = 16
CANARY_PERIOD_S = 1.0

_TIMERS: dict[tuple, Timer] = {}  # in the canary's process: the models, built on first use


def passes(
    preset: str,
    threads: int,
    short_term: int,
    chunk: int,
    length: int,
    candidates: int,
    count: int,
    clock: str,
) -> list[float]:
    """In the canary's process: `count` full passes at `length` after an untimed one, each pass's wall
    (`clock` "wall") or thread-CPU ms, the model built on first use."""
    key = (preset, threads, length, short_term, candidates, chunk)
    if key not in _TIMERS:
        _TIMERS[key] = _timer(
            preset, threads, [length], short_term, candidates, 1, chunk, Scheduler("canary")
        )
    timer = _TIMERS[key]
    read = time.perf_counter if clock == "wall" else time.thread_time
    runner, history = timer.runner, timer.histories[length]
    runner.uncached_sync(history, timer.short_events, timer.candidate_ids)
    out = []
    for _ in range(count):
        started = read()
        runner.uncached_sync(history, timer.short_events, timer.candidate_ids)
        out.append(round((read() - started) * 1000, 4))
    return out


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of every core since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the cores' time the hypervisor took between two `cpu_times` readings."""
    total = after[1] - before[1]
    return 0.0 if total <= 0 else round((after[0] - before[0]) / total, 5)


class Canary:
    """The helper process; use as a context manager (it stops the process)."""

    def __init__(self, preset: str, threads: int, short_term: int, chunk_tokens: int) -> None:
        self._args = (preset, threads, short_term, chunk_tokens)
        self._pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")
        )
        self._lock = threading.Lock()  # one request at a time: the background sampler and the caller

    def __enter__(self) -> Canary:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown()

    def _passes(self, length: int, candidates: int, count: int, clock: str) -> list[float]:
        with self._lock:
            return self._pool.submit(passes, *self._args, length, candidates, count, clock).result()

    def unit_timings(self, length: int, count: int) -> list[float]:
        return self._passes(length, UNIT_CANDIDATES, count, "wall")

    def readings(self, count: int) -> list[float]:
        return self._passes(CANARY_LENGTH, CANARY_CANDIDATES, count, "cpu")

    @contextlib.contextmanager
    def beside(self, period_s: float = CANARY_PERIOD_S) -> Iterator[list[float]]:
        """One reading every `period_s` in a background thread while the block runs; the list it yields
        fills with them."""
        readings: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(period_s):
                readings.extend(self.readings(1))

        thread = threading.Thread(target=sample, name="canary", daemon=True)
        thread.start()
        try:
            yield readings
        finally:
            stop.set()
            thread.join()
