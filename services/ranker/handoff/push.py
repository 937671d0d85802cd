"""A draining ranker's handoff: its cached prefixes pushed to each user's next owner.

A drain (`RankerApp.drain`) starts it as soon as the ranker is NOT_SERVING, so that the entries are on
their way while the routers move the users, and calls `Pusher.push` once more when it has drained, for the
entries its last Ranks made. Each round plans the resident entries not planned yet, most recently used
first (`Admission.resident`): an entry goes to its user's next owner (`Peers.next_owner`, where the routers
now send that user); one whose DRAM TTL would run out before it could arrive at the handoff's rate, or
that would arrive after the time budget (counted from the drain's start), is skipped. An entry the drain's
Ranks extend afterwards is a new key, sent in the second round; the first copy is its strict prefix, which
the receiver extends. Each peer gets
one client stream (`CacheHandoffService.Push`), all streams together paced to `--handoff-rate-mb-s`, and
none runs past `--handoff-budget-s`: what has not been sent by then is dropped, as any cache is on exit.
A receiver admits what is whole, fits and matches; it answers with its tally.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from relaygr.v1 import handoff_pb2, handoff_pb2_grpc
from services.affinity.membership import Member
from services.ranker import metrics
from services.ranker.cache import kv_wire as codec
from services.ranker.cache.admission import Admission
from services.ranker.cache.index import CacheEntry, PrefixKey
from services.ranker.handoff.auth import call_metadata
from services.ranker.handoff.peers import Peers
from services.ranker.handoff.settings import HandoffSettings

log = logging.getLogger(__name__)
MIB = 1024 * 1024
SENT_OUTCOMES = ("sent", "skipped_ttl", "skipped_time", "failed", "no_owner")


class Pacer:
    """Paces byte transfers to `bytes_per_s`, shared by every stream of one handoff."""

    def __init__(self, bytes_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.bytes_per_s = bytes_per_s
        self.clock = clock
        self._next = clock()

    def done_at(self, nbytes: int) -> float:
        """When `nbytes` taken now would have gone out."""
        return max(self._next, self.clock()) + nbytes / self.bytes_per_s

    async def take(self, nbytes: int) -> None:
        now = self.clock()
        start = max(self._next, now)
        self._next = start + nbytes / self.bytes_per_s
        if start > now:
            await asyncio.sleep(start - now)


@dataclasses.dataclass
class HandoffSummary:
    """What a drain's handoff did, entry by entry (the metrics count the same)."""

    sent: int = 0
    sent_bytes: int = 0
    skipped_ttl: int = 0
    skipped_time: int = 0
    failed: int = 0
    no_owner: int = 0
    receipts: list[handoff_pb2.PushResponse] = dataclasses.field(default_factory=list)
    duration_s: float = 0.0

    def count(self, outcome: str, entries: int = 1) -> None:
        setattr(self, outcome, getattr(self, outcome) + entries)
        metrics.HANDOFF_SENT_ENTRIES.labels(outcome).inc(entries)


class Pusher:
    def __init__(
        self,
        admission: Admission,
        peers: Peers,
        settings: HandoffSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.admission = admission
        self.peers = peers
        self.budget_s = settings.handoff_budget_s
        self.bytes_per_s = settings.handoff_rate_mb_s * MIB
        self.metadata = call_metadata(settings)
        self.clock = clock
        self.started = clock()
        self.deadline = self.started + self.budget_s
        self.pacer = Pacer(self.bytes_per_s, clock)
        self.summary = HandoffSummary()
        self._planned: set[PrefixKey] = set()
        self._peers: set[str] = set()

    async def push(self) -> HandoffSummary:
        """Hands off the resident entries not planned yet, within what is left of the time budget; what the
        handoff has done so far. A drain calls it as it begins and once more when it has drained, for the
        entries its last Ranks made."""
        summary = self.summary
        plan: dict[Member, list[CacheEntry]] = {}
        queued = 0
        for entry in self.admission.resident():
            if entry.key in self._planned:
                continue
            self._planned.add(entry.key)
            owner = self.peers.next_owner(entry.key.user_id)
            nbytes = self.admission.nbytes(entry)
            arrival = self.pacer.done_at(queued + nbytes)
            if owner is None:
                summary.count("no_owner")
            elif arrival > self.admission.expires_at(entry):
                summary.count("skipped_ttl")
            elif arrival > self.deadline:
                summary.count("skipped_time")
            else:
                queued += nbytes
                plan.setdefault(owner, []).append(entry)
        self._peers.update(member.name for member in plan)
        await asyncio.gather(*(self._stream(m, e, summary) for m, e in plan.items()))
        summary.duration_s = self.clock() - self.started
        metrics.HANDOFF_DURATION.set(summary.duration_s)
        log.info(
            "handoff: %d entries (%d bytes) sent to %d peers in %.2fs of %.1fs; skipped %d (ttl) %d (time), "
            "%d failed, %d without an owner",
            summary.sent, summary.sent_bytes, len(self._peers), summary.duration_s, self.budget_s,
            summary.skipped_ttl, summary.skipped_time, summary.failed, summary.no_owner,
        )  # fmt: skip
        return summary

    async def _stream(self, member: Member, entries: list[CacheEntry], summary: HandoffSummary) -> None:
        pacer, deadline = self.pacer, self.deadline
        streamed: list[int] = []  # bytes of each entry streamed whole
        gone = 0  # entries evicted (by their TTL) before their turn

        async def chunks() -> AsyncIterator[handoff_pb2.PushRequest]:
            nonlocal gone
            for entry in entries:
                payload = await self.admission.payload(entry)
                if payload is None:  # evicted meanwhile: nothing to send
                    gone += 1
                    continue
                header, data = payload
                if pacer.done_at(len(data)) > deadline:
                    return
                for chunk in codec.chunks(header, data):
                    await pacer.take(len(chunk.data))
                    yield handoff_pb2.PushRequest(chunk=chunk)
                streamed.append(len(data))

        stub = handoff_pb2_grpc.CacheHandoffServiceStub(member.channel)
        try:
            receipt = await stub.Push(
                chunks(), timeout=max(0.001, deadline - self.clock()), metadata=self.metadata
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("handoff to %s failed (%s): %s", member.name, exc.code().name, exc.details())
            summary.count("failed", len(streamed))
            summary.count("skipped_ttl", gone)
            summary.count("skipped_time", len(entries) - len(streamed) - gone)
            return
        summary.receipts.append(receipt)
        summary.count("sent", len(streamed))
        summary.sent_bytes += sum(streamed)
        metrics.HANDOFF_SENT_BYTES.inc(sum(streamed))
        summary.count("skipped_ttl", gone)
        summary.count("skipped_time", len(entries) - len(streamed) - gone)
