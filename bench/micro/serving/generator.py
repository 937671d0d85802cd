"""The load generator: a process of its own, on CPUs of its own, that drives PreInfer + Rank pairs.

A benchmark that drives a ranker from its own event loop shares the host's cores with it, and on a small
host the ranker's figures then hold some of the driver's work (its wake-ups, its gRPC client, the CPU it
takes from the ranker's core). `Generator` runs the open-loop driver (`pairs.Driver`) in a child process
born on `cpus` (the ranker gets the rest), builds each point's requests there before the clock starts, and
reports with each point's answers the CPU the generator itself took, so a report can say how much that was
and whether it was the generator, not the ranker, that ran out of core.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from multiprocessing.connection import Connection

from bench.micro.serving.pairs import SINGLE, Driven, LocalLoad, PairSpec, Via


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


class Generator:
    """The driver in a child process (see the module); `run` sends it one run and waits for the result."""

    def __init__(self, cpus: frozenset[int] | None) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        with born_on(cpus):
            self._process = context.Process(target=_serve, args=(child,), name="generator", daemon=True)
            self._process.start()
        child.close()
        self.pid = self._process.pid

    async def run(
        self, address: str, spec: PairSpec, rate: float, delay_s: float, via: Via = SINGLE
    ) -> Driven:
        """As `pairs.LocalLoad.run`, in the generator's process."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self._call, (address, spec, rate, delay_s, via)
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


def _serve(conn: Connection) -> None:
    asyncio.run(_loop(conn))


async def _loop(conn: Connection) -> None:
    load = LocalLoad()
    loop = asyncio.get_running_loop()
    try:
        while (job := await loop.run_in_executor(None, conn.recv)) is not None:
            try:
                driven: Driven | Exception = await load.run(*job)
            except Exception as exc:  # handed to the parent, which raises it there
                driven = exc
            conn.send(driven)
    finally:
        await load.close()
