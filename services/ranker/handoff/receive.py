"""Receiving entries from another ranker: a stream of `HandoffChunk`s (a drain's `PushRequest`s or a
Fetch's `FetchResponse`s, each carrying one), each entry admitted into DRAM at its last chunk
(`services.ranker.cache.admission`). The same loop serves a drain's Push and a read-through's Fetch. An
entry whose stream ends, breaks or starts another entry before its last chunk is torn: its reservation
and buffer are given back, and nothing of it is indexed. So is one whose next chunk does not come within
the chunk timeout (a stalled sender holds no reservation), or one a chunk of more than
`kv_wire.CHUNK_BYTES` of data would overfill: either ends the stream with a `StreamError`. The entries
a stream admitted are never evicted by its later ones, so its tally's `admitted` are all held when it
ends."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterable

import grpc

from relaygr.v1 import handoff_pb2
from services.ranker import metrics
from services.ranker.cache import kv_wire
from services.ranker.cache.admission import ADMITTED, HELD, Admission, Incoming
from services.ranker.cache.index import PrefixKey
from services.ranker.model.events import Events

Refusal = handoff_pb2.HandoffRefusal


def outcome_label(outcome: int) -> str:
    """The metric label of an admission's outcome: admitted is counted apart; held, or the refusal's name."""
    return "held" if outcome == HELD else Refusal.Name(outcome).removeprefix("HANDOFF_REFUSAL_").lower()


# The labels of what a receiver did with an entry besides admitting it or finding it torn.
RECEIVED = ("held", *(outcome_label(value) for value in Refusal.values() if value != HELD))


class StreamError(Exception):
    """A stream the receiver ends: the status a Push answers with, and why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class Tally:
    admitted: int = 0
    admitted_bytes: int = 0
    held: int = 0
    torn: int = 0
    received_bytes: int = 0
    refused: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def count(self, label: str) -> None:
        metrics.HANDOFF_RECEIVED_ENTRIES.labels(label).inc()

    def receipt(self, instance: str) -> handoff_pb2.PushResponse:
        return handoff_pb2.PushResponse(
            instance=instance, admitted=self.admitted, admitted_bytes=self.admitted_bytes, held=self.held,
            received_bytes=self.received_bytes,
            refused=[handoff_pb2.RefusalCount(reason=r, entries=n) for r, n in sorted(self.refused.items())],
        )  # fmt: skip


async def receive(
    messages: AsyncIterable[handoff_pb2.PushRequest | handoff_pb2.FetchResponse],
    admission: Admission,
    wanted: Events | None = None,
    chunk_timeout_s: float | None = None,
) -> Tally:
    """Admits the entries of the chunks `messages` carry; their tally. An exception of the stream (the
    sender died), a chunk over `kv_wire.CHUNK_BYTES` or, within an entry, no chunk for `chunk_timeout_s`
    (None: no limit) is raised after the entry it tore has been given back."""
    tally = Tally()
    admitted: set[PrefixKey] = set()  # by this stream: its later entries may not evict them
    current: Incoming | None = None
    started = False  # an entry's header was read and its last chunk not yet
    iterator = aiter(messages)
    try:
        while True:
            try:
                if started and chunk_timeout_s is not None:
                    message = await asyncio.wait_for(anext(iterator), chunk_timeout_s)
                else:
                    message = await anext(iterator)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise StreamError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"chunk: none for {chunk_timeout_s:g} s within entry "
                    f"{'?' if current is None else current.key.user_id!r}; the entry was given back",
                ) from None
            chunk = message.chunk
            if len(chunk.data) > kv_wire.CHUNK_BYTES:
                raise StreamError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"chunk.data: {len(chunk.data)} bytes, over the {kv_wire.CHUNK_BYTES} a chunk carries",
                )
            tally.received_bytes += len(chunk.data)
            metrics.HANDOFF_RECEIVED_BYTES.inc(len(chunk.data))
            if chunk.HasField("entry"):
                if started:
                    _tear(admission, current, tally)
                current, started = _begin(admission, chunk.entry, wanted, admitted, tally), True
            if current is not None:
                current.assembly.write(chunk.data)
            if chunk.last and started:
                if current is not None:
                    _finish(admission, current, admitted, tally)
                current, started = None, False
    finally:
        if started:
            _tear(admission, current, tally)
    return tally


def _begin(
    admission: Admission, entry, wanted: Events | None, admitted: set[PrefixKey], tally: Tally
) -> Incoming | None:
    incoming = admission.begin(entry, wanted, protected=admitted)
    if isinstance(incoming, Incoming):
        return incoming
    _refused(incoming, tally)
    return None


def _finish(admission: Admission, incoming: Incoming, admitted: set[PrefixKey], tally: Tally) -> None:
    outcome = admission.finish(incoming, admitted)
    if outcome != ADMITTED:
        _refused(outcome, tally)
        return
    tally.admitted += 1
    tally.admitted_bytes += incoming.kv.nbytes()
    tally.count("admitted")


def _refused(outcome: int, tally: Tally) -> None:
    if outcome == HELD:
        tally.held += 1
    else:
        tally.refused[outcome] += 1
    tally.count(outcome_label(outcome))


def _tear(admission: Admission, incoming: Incoming | None, tally: Tally) -> None:
    if incoming is not None:
        admission.abort(incoming)
    tally.torn += 1
    tally.count("torn")
