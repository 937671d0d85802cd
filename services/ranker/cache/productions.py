"""Single-flight productions of prefix KV: at most one per key at a time, shared by everyone who wants it.

A production makes one entry's HBM KV in one of three ways (`Kind`): compute the whole prefix, reload a
DRAM copy, or extend a cached shorter prefix with the events appended since. Every PreInfer or Rank for a
key that is being produced joins the running production instead of starting another. The work runs as
its own task: a joiner's cancellation never cancels it, and a Rank that joins a pre-inference promotes
its device job to `Priority.AWAITED`, where a miss's computation runs, so it does not wait behind later
pre-inferences.

Pins are handed out at completion, not taken by the waiters: when the work is done the production pins
the entry once per waiter before any of them resumes, so nothing can demote the entry in between; a
waiter cancelled after that point gets its pin back through `on_abandoned`.

What a finished production does to the cache (tiers, index, leases) is the cache's business: it passes
`finish` and `fail` callbacks, run on the event loop exactly once per production.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Callable, Iterator, Mapping

from opentelemetry.trace import SpanContext

from relaygr.v1 import common_pb2
from services.common import tracing
from services.common.tasks import cancel_and_wait
from services.ranker.cache.acquired import Source
from services.ranker.cache.index import CacheEntry, Pin, PrefixKey
from services.ranker.device.copier import TierCopier
from services.ranker.engine.device_time import trace_device
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Op, Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV


class Kind(enum.Enum):
    COMPUTE = "compute"
    RELOAD = "reload"
    EXTEND = "extend"


@dataclasses.dataclass(eq=False)
class Production:
    key: PrefixKey
    events: Events
    kind: Kind
    for_rank: bool  # started by a Rank (a miss), not by a PreInfer
    priority: Priority
    # The pin that holds the entry it reloads or extends, until it is done.
    base_pin: Pin | None = None
    task: asyncio.Task | None = None
    # The device job computing it, once submitted: a Rank that joins promotes it to AWAITED.
    job: asyncio.Future | None = None
    # Lease the entry when done: a PreInfer started or joined this production.
    lease: bool = False
    # Why the Rank that started a compute missed; Ranks that join it share the reason.
    miss_reason: int = common_pb2.MissReason.MISS_REASON_UNSPECIFIED
    # Ranks awaiting it; when it completes, it pins the entry once for each, and each takes its pin.
    waiters: int = 0
    handed: list[Pin] = dataclasses.field(default_factory=list)
    # Tokens it computes (0 for a reload), their device ms and the HBM reserved, as the load book counts them.
    tokens: int = 0
    cost_ms: float = 0.0
    reserved_bytes: int = 0
    # The sampled PreInfer call that started or joined it: a Rank served from its prefix links to it.
    pre_infer: SpanContext | None = None

    @property
    def base(self) -> CacheEntry | None:
        """The entry it reloads or extends (held by `base_pin` until the cache releases it)."""
        return None if self.base_pin is None else self.base_pin.entry

    @property
    def source(self) -> Source:
        """Where a Rank served by it says its prefix came from."""
        if self.kind is Kind.RELOAD:
            return Source.DRAM
        if self.kind is Kind.EXTEND:
            return Source.EXTENDED
        return Source.MISS if self.for_rank else Source.HBM

    def hand_out(self, entry: CacheEntry) -> None:
        """Pins `entry` once for every waiter, before any of them resumes."""
        self.handed = [entry.pin("rank") for _ in range(self.waiters)]


Finish = Callable[[Production, PrefixKV, bool], CacheEntry]  # (production, kv, base was reloaded) -> entry
Fail = Callable[[Production], None]


class Productions(Mapping[PrefixKey, Production]):
    """The running productions by key, and the work each does on the device and copy workers."""

    def __init__(self, runner: ModelRunner, copier: TierCopier, copy_worker: Scheduler) -> None:
        self.runner = runner
        self.copier = copier
        self.copy_worker = copy_worker
        self._running: dict[PrefixKey, Production] = {}
        self._pre_infers = 0  # of them, those a PreInfer started

    def __getitem__(self, key: PrefixKey) -> Production:
        return self._running[key]

    def __iter__(self) -> Iterator[PrefixKey]:
        return iter(self._running)

    def __len__(self) -> int:
        return len(self._running)

    def pending_pre_infer(self) -> int:
        return self._pre_infers

    def start(
        self,
        key: PrefixKey,
        events: Events,
        kind: Kind,
        priority: Priority,
        *,
        for_rank: bool,
        base: CacheEntry | None,
        deadline: float | None,
        finish: Finish,
        fail: Fail,
    ) -> Production:
        """Starts producing `key`'s KV from `events` (and `base`, pinned until the cache releases
        `base_pin`, for a reload or an extension). `deadline` (`time.monotonic()`) is the starting Rank's:
        past it, the device drops the work unstarted. A production whose first step is the device's (a
        compute, or an extension of a base in HBM) submits its job here and now, so that the jobs of several
        started together (`Scheduler.together`) are handed over together; one that copies from DRAM first
        submits it once the copy is done."""
        base_pin = None if base is None else base.pin(f"{kind.value} of {key.user_id}")
        production = Production(key, events, kind, for_rank, priority, base_pin=base_pin, lease=not for_rank)
        if not for_rank:
            production.pre_infer = tracing.current_context()
        if kind is not Kind.RELOAD and (base is None or base.hbm is not None):
            production.job = self._compute(production, None if base is None else base.hbm, deadline)
        work = self._run(production, deadline, finish, fail)
        production.task = asyncio.get_running_loop().create_task(work)
        # Its waiters may all be gone (cancelled) when it fails: mark the failure seen, or asyncio logs it.
        production.task.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._running[key] = production
        self._pre_infers += not for_rank
        return production

    async def _run(
        self, production: Production, deadline: float | None, finish: Finish, fail: Fail
    ) -> CacheEntry:
        # A task of the call that started it: in a sampled trace, a child span of that PreInfer or Rank
        # that outlives the call when a PreInfer answered at once.
        with tracing.span("production", kind=production.kind.value, tokens=production.tokens):
            return await self._produce(production, deadline, finish, fail)

    async def _produce(
        self, production: Production, deadline: float | None, finish: Finish, fail: Fail
    ) -> CacheEntry:
        try:
            kv, reloaded = await self._make(production, deadline)
        except BaseException:
            self._done(production)
            fail(production)
            raise
        self._done(production)
        return finish(production, kv, reloaded)

    def _done(self, production: Production) -> None:
        del self._running[production.key]
        self._pre_infers -= not production.for_rank

    async def _make(self, production: Production, deadline: float | None) -> tuple[PrefixKV, bool]:
        """The KV, and whether the base had to be reloaded from DRAM first."""
        base, reloaded = production.base, False
        if production.job is None:  # a reload, or an extension of a base in DRAM: the copy first
            base_kv, reloaded = base.hbm, base.hbm is None
            if reloaded:
                # Returns once the copies are queued: the KV's per-layer ready markers complete with them,
                # so the consumer (this production's extension, or the Ranks it hands the entry to) waits
                # layer by layer on its own stream. The production is done, for single flight, right here.
                dram_copy = base.dram
                if self.copier.in_place:  # nothing to copy: the DRAM copy is the device copy
                    base_kv = self.copier.to_hbm(dram_copy)
                else:
                    copy = self.copy_worker.submit(
                        lambda: self.copier.to_hbm(dram_copy), production.priority, Op.RELOAD, deadline
                    )
                    base_kv = await copy
                    trace_device(copy, "reload", bytes=dram_copy.nbytes())
            if production.kind is Kind.RELOAD:
                return base_kv, reloaded
            production.job = self._compute(production, base_kv, deadline)
        kv = await production.job
        trace_device(production.job, "compute", tokens=production.tokens)
        return kv, reloaded

    def _compute(
        self, production: Production, base_kv: PrefixKV | None, deadline: float | None
    ) -> asyncio.Future[PrefixKV]:
        """Submits the device job of a compute, or of an extension of `base_kv`."""
        if production.kind is Kind.EXTEND:
            suffix = production.events.suffix(production.base.length)
            return self.runner.extend(base_kv, suffix, production.priority, deadline)
        return self.runner.pre_infer(production.events, production.priority, deadline)

    def promote(self, production: Production) -> None:
        """A Rank waits on this production now: it must not wait behind later pre-inferences or misses."""
        if production.priority > Priority.AWAITED:
            production.priority = Priority.AWAITED
            if production.job is not None:
                self.runner.worker.promote(production.job, Priority.AWAITED)

    @staticmethod
    async def join(production: Production, on_abandoned: Callable[[Pin], None]) -> tuple[CacheEntry, Pin]:
        """Waits for the production: its entry and this waiter's pin. The production's own errors
        propagate; a waiter cancelled after the entry was pinned for it gives the pin to `on_abandoned`."""
        production.waiters += 1
        try:
            entry = await asyncio.shield(production.task)
        except asyncio.CancelledError:
            task = production.task
            if task.done() and not task.cancelled() and task.exception() is None:
                on_abandoned(production.handed.pop())
            else:
                production.waiters -= 1
            raise
        return entry, production.handed.pop()

    async def close(self) -> None:
        for production in self._running.values():
            if production.job is not None:  # submitted before its task ran: its task may never await it
                production.job.cancel()
        await cancel_and_wait([production.task for production in self._running.values()])
