"""What sends a point's pairs: `LocalLoad`, `pairs.Driver` in this process, or `Generator`, the same in a
process of its own born on CPUs of its own, so that the measured ranker's figures hold none of the driver's
work; it builds each point's requests before the clock and returns with the answers the CPU it took."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection

from bench.micro.pairs import SINGLE, Answers, Driver, Pair, Via

# What builds a run's pairs, picklable for the generator: a `functools.partial` of `pairs.make_pairs`.
Pairs = Callable[[], list[Pair]]


@contextlib.contextmanager
def born_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """This thread runs on `cpus` inside, and the processes it starts there are born on them (a child's
    affinity mask is its parent thread's at fork); None: as this thread. Its own mask is restored after."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def split_cpus(generator: str) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(the ranker's CPUs, the generator's) from `--generator-cpus` (a comma list; empty: the last CPU this
    process may use). With a single CPU there is nothing to split: (None, None)."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return None, None
    try:
        chosen = frozenset(int(c) for c in generator.split(",") if c.strip()) or frozenset(mine[-1:])
    except ValueError:
        raise ValueError(f"--generator-cpus: {generator!r} must list CPU numbers") from None
    if not chosen <= set(mine):
        raise ValueError(f"--generator-cpus: {generator!r} names CPUs outside this process's {mine}")
    rest = frozenset(mine) - chosen
    if not rest:
        raise ValueError(f"--generator-cpus: {generator!r} leaves the ranker no CPU of {mine}")
    return rest, chosen


@dataclasses.dataclass(frozen=True)
class Driven:
    """One run of pairs: the answers and the CPU seconds the driver's process took over it."""

    answers: Answers
    cpu_s: float


class LocalLoad:
    """Pairs sent from this process's event loop, a driver per address and `Via`."""

    def __init__(self) -> None:
        self.drivers: dict[tuple[str, Via], Driver] = {}

    async def run(self, address: str, pairs: Pairs, rate: float, delay_s: float, via: Via = SINGLE) -> Driven:
        """The pairs `pairs` builds, sent to `address` as `Driver.run` sends them, their PreInfers as `via`
        says."""
        driver = self.drivers.get((address, via))
        if driver is None:
            driver = self.drivers[(address, via)] = Driver(address, via=via)
        built, cpu = pairs(), time.process_time()
        answers = await driver.run(built, rate, delay_s)
        return Driven(answers, time.process_time() - cpu)

    async def close(self) -> None:
        for driver in self.drivers.values():
            await driver.close()


class Generator:
    """`LocalLoad` in a child process (see the module); `run` sends it one run and waits for the result."""

    def __init__(self, cpus: frozenset[int] | None) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        with born_on(cpus):
            self._process = context.Process(target=_serve, args=(child,), name="generator", daemon=True)
            self._process.start()
        child.close()

    async def run(self, address: str, pairs: Pairs, rate: float, delay_s: float, via: Via = SINGLE) -> Driven:
        return await asyncio.get_running_loop().run_in_executor(
            None, self._call, (address, pairs, rate, delay_s, via)
        )

    def _call(self, job: tuple) -> Driven:
        self._conn.send(job)
        result = self._conn.recv()
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._conn.close()


Load = LocalLoad | Generator


def _serve(conn: Connection) -> None:
    asyncio.run(_loop(conn))


async def _loop(conn: Connection) -> None:
    load, loop = LocalLoad(), asyncio.get_running_loop()
    try:
        while (job := await loop.run_in_executor(None, conn.recv)) is not None:
            try:
                driven: Driven | Exception = await load.run(*job)
            except Exception as exc:  # handed to the parent, which raises it there
                driven = exc
            conn.send(driven)
    finally:
        await load.close()
