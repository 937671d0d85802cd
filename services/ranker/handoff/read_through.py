"""Read-through: a miss asks the peer that has the user's prefix before computing it.

For `--read-through-grace-s` after start-up or a change of the routable rankers, a ranker that finds no
prefix of a user the routers send to it asks the user's next owner (`Peers.source`: who served the user
while this ranker was away, or before it joined) with `CacheHandoffService.Fetch`, and admits the answer
into DRAM; the request then reloads it like any DRAM entry, or extends it when the peer's entry is a strict
prefix of the request's events.

- A PreInfer's read-through is a prefetch: the PreInfer is answered at once, and its production starts
  once the peer answered (or `--read-through-timeout-ms` passed), from what was fetched or from scratch.
- A Rank's is made only when the transfer is predicted to beat the recomputation (the transfer's cost
  measured from earlier fetches: a fixed cost a call and a cost a byte; the recomputation's from the
  latency curve), and it waits no longer than that recomputation, within the Rank's deadline.
- One fetch per (user, events) at a time: a Rank that arrives during its PreInfer's prefetch joins it. A
  user is asked for at most once per events, so a peer's miss is never asked again.
- A fetch that times out counts in the transfer model (it took at least its timeout for the bytes it
  asked), and its peer is not asked for `--read-through-backoff-s`: a slow peer costs one wait, not one
  a miss. At most `--read-through-max-fetches` fetches are in flight; a miss beyond them computes.
- `GIVE_UP_AFTER` answers in a row without an entry, and none with one since the routable members last
  changed (a fleet started together, whose peers hold nothing of its users), end the asking until they
  change again. Once a peer has had an entry, the asking goes on for the whole window: a ranker back from
  a restart asks for each user as it returns, and new users' empty answers come between.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

import grpc

from relaygr.v1 import handoff_pb2, handoff_pb2_grpc
from services.affinity.membership import Member
from services.ranker import metrics
from services.ranker.cache import kv_wire as codec
from services.ranker.cache.admission import Admission
from services.ranker.engine.load import LoadBook
from services.ranker.handoff.auth import call_metadata
from services.ranker.handoff.peers import Peers
from services.ranker.handoff.receive import StreamError, receive
from services.ranker.handoff.settings import HandoffSettings
from services.ranker.model.events import Events

log = logging.getLogger(__name__)

ASKED_MAX = 100_000  # (user, events) remembered as asked
GIVE_UP_AFTER = 16
READ_THROUGH_OUTCOMES = ("hit", "miss", "timeout", "error", "skipped")
EWMA_WEIGHT = 0.2


class TransferModel:
    """A fetch's predicted seconds: a fixed cost a call plus a cost a byte, each the moving average of what
    fetches measured (a miss measures the fixed cost). Until measured: 2 ms and 200 MB/s, a loopback
    gRPC stream's order of magnitude, which the first fetches correct."""

    def __init__(self, call_s: float = 0.002, byte_s: float = 1 / 200e6) -> None:
        self.call_s = call_s
        self.byte_s = byte_s

    def predict(self, nbytes: int) -> float:
        return self.call_s + nbytes * self.byte_s

    def observe(self, nbytes: int, seconds: float) -> None:
        if nbytes <= 0:
            self.call_s += EWMA_WEIGHT * (seconds - self.call_s)
        else:
            per_byte = max(0.0, seconds - self.call_s) / nbytes
            self.byte_s += EWMA_WEIGHT * (per_byte - self.byte_s)


class ReadThrough:
    def __init__(
        self,
        admission: Admission,
        peers: Peers,
        settings: HandoffSettings,
        load: LoadBook,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.admission = admission
        self.peers = peers
        self.grace_s = settings.read_through_grace_s
        self.timeout_s = settings.read_through_timeout_ms / 1000
        self.max_fetches = settings.read_through_max_fetches
        self.backoff_s = settings.read_through_backoff_s
        self.metadata = call_metadata(settings)
        self.load = load
        self.clock = clock
        self.transfer = TransferModel()
        self._fetches: dict[tuple[str, str], asyncio.Future[bool]] = {}
        self._asked: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self._empty_in_a_row = 0
        self._gave_up_at: float | None = None  # the change whose window the asking ended in
        self._hit_at: float | None = None  # the change whose window had an entry from a peer
        self._slow_until: dict[str, float] = {}  # a peer that timed out, and until when it is not asked

    def _source(self, user_id: str, events: Events) -> Member | None:
        """The peer to ask for this prefix, if any: within the grace window, never asked for these events,
        and no local strict prefix to extend."""
        key = (user_id, events.fingerprint)
        if key in self._asked or self.peers.since_change_s() >= self.grace_s:
            return None
        if self._gave_up_at == self.peers.changed_at or len(self._fetches) >= self.max_fetches:
            return None
        cache = self.admission.cache
        if cache.index.extension_base(user_id, events, busy=lambda e: e.key in cache.productions):
            return None
        member = self.peers.source(user_id)
        if member is None or self._slow_until.get(member.name, float("-inf")) > self.clock():
            return None
        return member

    def prefetch(self, user_id: str, events: Events, then: Callable[[], object]) -> bool:
        """For a PreInfer that found nothing: starts fetching the prefix and calls `then` (the PreInfer's
        decision, made again) once it is answered; False when there is nothing to ask."""
        fetch = self._running(user_id, events)
        if fetch is None:
            member = self._source(user_id, events)
            if member is None:
                return False
            fetch = self._fetch(member, user_id, events, self.timeout_s)
        task = asyncio.get_running_loop().create_task(_then(fetch, then))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def before_compute(self, user_id: str, events: Events, deadline: float | None) -> bool:
        """For a Rank about to compute its prefix: fetches it when that is predicted to be faster, or joins
        the fetch under way. True when it waited for a fetch, whatever the fetch found: the cache may hold
        the prefix now, or another request may have started producing it, so the Rank looks again (it is
        never asked twice for the same events, so it looks again once)."""
        running = self._running(user_id, events)
        if running is not None:
            await asyncio.shield(running)
            return True
        member = self._source(user_id, events)
        if member is None:
            return False
        recompute_s = self.load.cost_ms("pre_infer_ms", len(events)) / 1000
        budget_s = recompute_s if deadline is None else min(recompute_s, deadline - time.monotonic())
        if self.transfer.predict(self._nbytes(events)) >= budget_s:
            metrics.READ_THROUGH.labels("skipped").inc()
            return False
        await asyncio.shield(self._fetch(member, user_id, events, budget_s))
        return True

    def _running(self, user_id: str, events: Events) -> asyncio.Future[bool] | None:
        """The fetch of these events under way; not one that has finished (until its done callback has
        forgotten it, awaiting it would not yield, and a Rank would look again and again without end)."""
        fetch = self._fetches.get((user_id, events.fingerprint))
        return None if fetch is None or fetch.done() else fetch

    def _fetch(self, member: Member, user_id: str, events: Events, timeout_s: float) -> asyncio.Future[bool]:
        key = (user_id, events.fingerprint)
        self._asked[key] = None
        while len(self._asked) > ASKED_MAX:
            self._asked.popitem(last=False)
        future = asyncio.ensure_future(self._ask(member, user_id, events, timeout_s))
        self._fetches[key] = future
        future.add_done_callback(lambda _: self._fetches.pop(key, None))
        return future

    async def _ask(self, member: Member, user_id: str, events: Events, timeout_s: float) -> bool:
        cache = self.admission.cache
        request = handoff_pb2.FetchRequest(
            user_id=user_id, model_version=cache.runner.model_version, layout=self.admission.layout,
            long_term=codec.sequence(events),
        )  # fmt: skip
        started = self.clock()
        stub = handoff_pb2_grpc.CacheHandoffServiceStub(member.channel)
        try:
            fetch = stub.Fetch(request, timeout=timeout_s, metadata=self.metadata)
            tally = await receive(fetch, self.admission, wanted=events)
        except StreamError as exc:  # the peer broke the wire's rules: its entry was given back
            metrics.READ_THROUGH.labels("error").inc()
            log.warning("read-through of %s from %s refused: %s", user_id, member.name, exc)
            return self._answered(False)
        except grpc.aio.AioRpcError as exc:
            timed_out = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            metrics.READ_THROUGH.labels("timeout" if timed_out else "error").inc()
            if timed_out:
                # It took at least this long for at most the prefix's bytes: the model learns it, and the
                # peer rests, so that the next misses compute rather than wait on it again.
                self.transfer.observe(self._nbytes(events), self.clock() - started)
                self._slow_until[member.name] = self.clock() + self.backoff_s
                log.info("read-through: %s timed out after %.0f ms; not asked for %g s",
                         member.name, timeout_s * 1000, self.backoff_s)  # fmt: skip
            else:
                log.warning("read-through of %s from %s failed: %s", user_id, member.name, exc.code().name)
            return self._answered(False)
        self.transfer.observe(tally.received_bytes, self.clock() - started)
        hit = tally.admitted > 0 or tally.held > 0
        metrics.READ_THROUGH.labels("hit" if hit else "miss").inc()
        metrics.READ_THROUGH_BYTES.inc(tally.admitted_bytes)
        return self._answered(hit)

    def _nbytes(self, events: Events) -> int:
        """The bytes a fetch of `events`' prefix brings, at most (a peer may hold a strict prefix)."""
        return self.admission.cache.moves.dram_nbytes(len(events))

    def _answered(self, hit: bool) -> bool:
        if hit:
            self._hit_at = self.peers.changed_at
        self._empty_in_a_row = 0 if hit else self._empty_in_a_row + 1
        if self._empty_in_a_row >= GIVE_UP_AFTER and self._hit_at != self.peers.changed_at:
            self._empty_in_a_row = 0
            self._gave_up_at = self.peers.changed_at
            log.info("read-through: %d answers in a row and none since the ring changed held an entry; "
                     "asking again after its next change", GIVE_UP_AFTER)  # fmt: skip
        return hit

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _then(fetch: asyncio.Future[bool], then: Callable[[], object]) -> None:
    """`then()` once `fetch` is done, whatever it found; not when cancelled (the ranker is closing)."""
    try:
        await asyncio.shield(fetch)
    except Exception:
        log.warning("read-through failed", exc_info=True)
    then()
