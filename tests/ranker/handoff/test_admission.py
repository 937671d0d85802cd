"""Admission of entries that come from another ranker, by mechanism: the bytes that arrive are the bytes
sent, into DRAM only, and only whole, matching and within budget (real bytes measured, not the tier's
counter); a Rank from an admitted entry equals a full recomputation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
import pytest
import torch

from relaygr.v1 import handoff_pb2, ranker_pb2
from services.ranker.cache import kv_wire
from services.ranker.cache.acquired import Source
from services.ranker.handoff.receive import StreamError, receive
from tests.exact import assert_scores_equal
from tests.ranker.handoff.support import (
    cached,
    deliver,
    history,
    item_action_model,
    made_up,
    ranked,
    reference,
    run,
    wire,
)
from tests.ranker.harness import cache_app, events, held_bytes, settle

Refusal = handoff_pb2.HandoffRefusal
Outcome = ranker_pb2.PreInferOutcome


@run
async def test_entries_arrive_byte_for_byte_into_dram_and_rank_exactly() -> None:
    async with cache_app(instance_name="a") as sender, cache_app(instance_name="b") as receiver:
        entries = await cached(sender, range(3))
        chunks = await wire(sender, entries)
        sent = sum(len(c.data) for c in chunks)
        tally = await deliver(receiver, chunks)
        assert (tally.admitted, tally.held, tally.torn, dict(tally.refused)) == (3, 0, 0, {})
        assert tally.received_bytes == sent == tally.admitted_bytes
        assert held_bytes(receiver.cache) == {"hbm": 0, "dram": sent}
        for entry in entries:
            (got,) = receiver.cache.index.of_user(entry.key.user_id)
            assert got.key == entry.key and got.hbm is None
            assert torch.equal(got.dram.buffer, entry.dram.buffer)
        for user in range(3):
            scores, source = await ranked(receiver, user)
            assert source is Source.PEER  # its first use here: without the sender, a miss
            assert_scores_equal(scores, reference(receiver, user))
            await settle(receiver)
            again, source = await ranked(receiver, user)
            assert source in (Source.HBM, Source.DRAM)  # from then on, this ranker's own
            assert_scores_equal(again, reference(receiver, user))


@run
async def test_a_key_already_held_is_acknowledged_and_stored_once() -> None:
    async with cache_app(instance_name="a") as sender, cache_app(instance_name="b") as receiver:
        chunks = await wire(sender, await cached(sender, [1]))
        assert (await deliver(receiver, chunks)).admitted == 1
        before = held_bytes(receiver.cache)
        again = await deliver(receiver, chunks)
        assert (again.admitted, again.held) == (0, 1)
        assert held_bytes(receiver.cache) == before and receiver.cache.dram.used_bytes == before["dram"]


def _with(chunks, **changes):
    first = handoff_pb2.HandoffChunk()
    first.CopyFrom(chunks[0])
    for field, value in changes.items():
        if field in ("layout", "events"):
            getattr(first.entry, field).CopyFrom(value)
        else:
            setattr(first.entry, field, value)
    return [first, *chunks[1:]]


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda c, e: _with(c, model_version="other"), Refusal.HANDOFF_REFUSAL_MODEL_VERSION),
        (
            lambda c, e: _with(c, layout=handoff_pb2.KvLayout(dtype="float32", layers=e.layers + 1,
                                                                heads=e.heads, head_dim=e.head_dim,
                                                                tokens_per_event=1)),
            Refusal.HANDOFF_REFUSAL_LAYOUT,
        ),
        (
            lambda c, e: _with(c, layout=handoff_pb2.KvLayout(dtype="bfloat16", layers=e.layers,
                                                                heads=e.heads, head_dim=e.head_dim,
                                                                tokens_per_event=1)),
            Refusal.HANDOFF_REFUSAL_LAYOUT,
        ),
        (
            lambda c, e: _with(c, layout=handoff_pb2.KvLayout(dtype="float32", layers=e.layers,
                                                                heads=e.heads, head_dim=e.head_dim,
                                                                tokens_per_event=2)),
            Refusal.HANDOFF_REFUSAL_LAYOUT,
        ),
        (lambda c, e: _with(c, crc32=c[0].entry.crc32 ^ 1), Refusal.HANDOFF_REFUSAL_CHECKSUM),
        (lambda c, e: [*c[:-1], _flipped(c[-1])], Refusal.HANDOFF_REFUSAL_CHECKSUM),
        (lambda c, e: _with(c, nbytes=c[0].entry.nbytes * 2), Refusal.HANDOFF_REFUSAL_INVALID),
    ],
    ids=["model-version", "layers", "dtype", "tokens-per-event", "header-crc", "flipped-byte", "size"],
)  # fmt: skip
@run
async def test_a_mismatched_entry_is_refused_and_leaves_nothing(change, reason) -> None:
    async with cache_app(instance_name="a") as sender, cache_app(instance_name="b") as receiver:
        chunks = change(await wire(sender, await cached(sender, [7])), receiver.admission.layout)
        tally = await deliver(receiver, chunks)
        assert (tally.admitted, dict(tally.refused)) == (0, {reason: 1})
        assert not receiver.cache.index.entries and receiver.cache.dram.used_bytes == 0
        assert held_bytes(receiver.cache) == {"hbm": 0, "dram": 0}


def _flipped(chunk: handoff_pb2.HandoffChunk) -> handoff_pb2.HandoffChunk:
    data = bytearray(chunk.data)
    data[len(data) // 2] ^= 0x40
    return handoff_pb2.HandoffChunk(entry=chunk.entry if chunk.HasField("entry") else None, data=bytes(data),
                                    last=chunk.last)  # fmt: skip


@run
async def test_a_torn_stream_admits_nothing_of_its_last_entry() -> None:
    async with cache_app(instance_name="a") as sender, cache_app(instance_name="b") as receiver:
        entries = await cached(sender, [1, 2])
        chunks = await wire(sender, entries)
        torn = [*chunks[:-1], _cut(chunks[-1])]
        tally = await deliver(receiver, torn)
        assert (tally.admitted, tally.torn) == (1, 1)
        assert [e.key for e in receiver.cache.index] == [entries[0].key]
        assert receiver.cache.dram.used_bytes == held_bytes(receiver.cache)["dram"] == tally.admitted_bytes


def _cut(chunk: handoff_pb2.HandoffChunk) -> handoff_pb2.HandoffChunk:
    """The chunk with half its bytes and no `last`: the sender died while sending it."""
    return handoff_pb2.HandoffChunk(entry=chunk.entry if chunk.HasField("entry") else None,
                                    data=chunk.data[: len(chunk.data) // 2])  # fmt: skip


@run
async def test_the_dram_budget_holds_in_real_bytes_and_recent_entries_are_not_evicted() -> None:
    entry_bytes = 40 * 512  # cpu-tiny: 512 bytes of KV a token, 40 events a history
    # Room for four entries and a half. The receiver's own two are used after the sender's six were: an
    # incoming entry may evict only entries used before it was, so they stay and two of six fit.
    budget_mb = 4.5 * entry_bytes / 2**20
    async with (
        cache_app(instance_name="a") as sender,
        cache_app(instance_name="b", dram_budget_mb=budget_mb) as receiver,
    ):
        entries = await cached(sender, range(6))
        assert entries[0].dram.nbytes() == entry_bytes
        own = await cached(receiver, [100, 101])
        tally = await deliver(receiver, await wire(sender, entries))
        assert tally.admitted == 2 and dict(tally.refused) == {Refusal.HANDOFF_REFUSAL_BUDGET: 4}
        assert [e.key for e in receiver.cache.index][-2:] == [e.key for e in entries[:2]]  # most recent first
        held = held_bytes(receiver.cache)["dram"]
        assert held == 4 * entry_bytes <= receiver.cache.dram.budget_bytes
        assert all(receiver.cache.index.get(entry.key) is entry for entry in own)


@run
async def test_an_incoming_entry_evicts_what_was_used_before_it_never_a_leased_one() -> None:
    entry_bytes = 40 * 512
    budget_mb = 2.5 * entry_bytes / 2**20
    async with (
        cache_app(instance_name="b", dram_budget_mb=budget_mb) as receiver,
        cache_app(instance_name="a") as sender,
    ):
        old = await cached(receiver, [100, 101])  # used first: evictable
        incoming = await cached(sender, [1, 2])
        tally = await deliver(receiver, await wire(sender, incoming))
        assert tally.admitted == 2 and not tally.refused
        assert all(receiver.cache.index.get(entry.key) is None for entry in old)
        assert held_bytes(receiver.cache)["dram"] == 2 * entry_bytes


@run
async def test_a_leased_entry_is_never_a_victim_however_old() -> None:
    entry_bytes = 40 * 512
    budget_mb = 2.5 * entry_bytes / 2**20
    # The lease outlasts the test however slow the host (an expired lease would leave the entry in DRAM
    # alone, the oldest there, which admission may then rightly evict).
    async with (
        cache_app(instance_name="b", dram_budget_mb=budget_mb, lease_ttl_ms=600_000) as receiver,
        cache_app(instance_name="a") as sender,
    ):
        (old,) = await cached(receiver, [200])  # in DRAM, used before anything the sender has
        outcome, _ = await receiver.cache.pre_infer("user-200", events(history(200)))
        await settle(receiver)
        # Reloaded for its Rank and leased: its DRAM copy is kept (unchanged), and it is the oldest.
        assert (
            outcome == Outcome.PRE_INFER_OUTCOME_RELOADED and old.lease is not None and old.dram is not None
        )
        sent = await cached(sender, [1, 2, 3])
        # In a push's order, most recently used first (sent the other way, the entries used earlier would
        # arrive first, and the later ones could rightly evict them again, by a race of clocks).
        assert sender.admission.resident() == sent[::-1]
        tally = await deliver(receiver, await wire(sender, sender.admission.resident()))
        assert tally.admitted == 1 and dict(tally.refused) == {Refusal.HANDOFF_REFUSAL_BUDGET: 2}
        assert receiver.cache.index.get(old.key) is old and old.dram is not None and old.lease is not None
        assert held_bytes(receiver.cache)["dram"] == 2 * entry_bytes


@run
async def test_item_action_entries_arrive_as_two_kv_rows_an_event_and_rank_exactly(tmp_path) -> None:
    """Every imported recsys-examples checkpoint interleaves an item and an action token an event: its
    entries hold two KV rows an event, and are admitted as such (not refused for their length)."""
    model = item_action_model(tmp_path / "model")
    async with (
        cache_app(instance_name="a", checkpoint=model) as sender,
        cache_app(instance_name="b", checkpoint=model) as receiver,
    ):
        assert receiver.runner.model.tokens_per_event == 2
        entries = await cached(sender, range(2))
        assert entries[0].dram.buffer.shape[4] == 2 * entries[0].length
        chunks = await wire(sender, entries)
        assert chunks[0].entry.layout.tokens_per_event == 2
        tally = await deliver(receiver, chunks)
        assert (tally.admitted, dict(tally.refused)) == (2, {})
        assert held_bytes(receiver.cache)["dram"] == tally.admitted_bytes == sum(len(c.data) for c in chunks)
        for user in range(2):
            scores, source = await ranked(receiver, user)
            assert source is Source.PEER
            assert_scores_equal(scores, reference(receiver, user))
        # The same bytes named as one event fewer (78 rows for 39 events, 80 sent) are refused.
        async with cache_app(instance_name="c", checkpoint=model) as other:
            short = handoff_pb2.HandoffEntry()
            short.CopyFrom(chunks[0].entry)
            for field in (short.events.item_ids, short.events.action_types, short.events.timestamps_ms):
                del field[len(field) - 1 :]
            tally = await deliver(other, _with(chunks[:1], events=short.events))
            assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_INVALID: 1})


ENTRY_BYTES = 40 * 512  # cpu-tiny: 512 bytes of KV a token, 40 events a history
MIB = 2**20


def counted_walks(tier) -> Callable[[], int]:
    """Counts the keys the tier's walks of its order yield (its eviction order, and its order of last use):
    the entries an admission visits. The count so far, when called."""
    visited = [0]
    for name in ("victims", "by_last_use"):
        walk = getattr(tier, name, None)
        if walk is None:
            continue

        def counting(walk=walk):
            for item in walk():
                visited[0] += 1
                yield item

        setattr(tier, name, counting)
    return lambda: visited[0]


@run
async def test_an_entry_refused_for_budget_visits_no_more_than_the_entries_older_than_it() -> None:
    """A full tier of many entries, all used after the incoming ones were: each incoming entry is refused
    after visiting at most the first entry of the tier's order (nothing after it can be a victim), not the
    whole tier; and entries that do evict visit their victims, not the tier."""
    n, refused, fresh = 300, 20, 10
    async with cache_app(instance_name="b", dram_budget_mb=n * ENTRY_BYTES / MIB, dram_ttl_s=600) as receiver:
        dram = receiver.cache.dram
        tally = await deliver(receiver, [c for user in range(n) for c in made_up(receiver, user, idle_s=0.0)])
        assert tally.admitted == n and dram.free_bytes() == 0
        visits = counted_walks(dram)
        old = [c for user in range(1000, 1000 + refused) for c in made_up(receiver, user, idle_s=300.0)]
        tally = await deliver(receiver, old)
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_BUDGET: refused})
        assert visits() <= refused
        # The oldest `fresh` entries of the tier made older than what comes next: each evicts one of them.
        clock = receiver.cache.clock()
        for user in range(fresh):
            dram.touch(receiver.cache.key(f"user-{user}", events(history(user))), now=clock - 500.0)
        before = visits()
        new = [c for user in range(2000, 2000 + fresh) for c in made_up(receiver, user, idle_s=0.0)]
        tally = await deliver(receiver, new)
        assert tally.admitted == fresh and not tally.refused
        assert visits() - before <= 2 * 2 * fresh  # the victim and the entry after it, when judged and taken
        assert all(receiver.cache.index.of_user(f"user-{user}") == [] for user in range(fresh))
        assert held_bytes(receiver.cache)["dram"] == dram.used_bytes == n * ENTRY_BYTES


@run
async def test_nothing_is_evicted_for_an_entry_before_its_bytes_are_whole_and_verified(monkeypatch) -> None:
    """An entry that needs room made arrives into a staging buffer of its own: while it arrives, and when
    its checksum fails, the entries it would evict stay, and DRAM never holds more than its budget; a
    verified one then evicts and is admitted."""
    monkeypatch.setattr(kv_wire, "CHUNK_BYTES", 4096)  # five chunks an entry
    async with cache_app(instance_name="b", dram_budget_mb=2 * ENTRY_BYTES / MIB, dram_ttl_s=600) as receiver:
        cache = receiver.cache
        await deliver(receiver, [c for user in (1, 2) for c in made_up(receiver, user, idle_s=100.0)])
        old = list(cache.index)
        assert len(old) == 2 and cache.dram.free_bytes() == 0

        def unchanged() -> None:
            assert [e.key for e in cache.index] == [e.key for e in old]
            assert held_bytes(cache)["dram"] == cache.dram.used_bytes == 2 * ENTRY_BYTES

        async def watched(chunks):
            for i, chunk in enumerate(chunks):
                if i:  # the chunks before it have been received
                    unchanged()
                    assert receiver.admission.staging.used_bytes == ENTRY_BYTES  # its bytes, staged
                yield handoff_pb2.PushRequest(chunk=chunk)

        chunks = made_up(receiver, 3, idle_s=0.0)
        assert len(chunks) == 5
        tally = await receive(watched([*chunks[:-1], _flipped(chunks[-1])]), receiver.admission)
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_CHECKSUM: 1})
        unchanged()
        assert receiver.admission.staging.used_bytes == 0 and len(receiver.admission.staging) == 0
        tally = await receive(watched(chunks), receiver.admission)
        assert tally.admitted == 1 and not tally.refused
        (new,) = cache.index.of_user("user-3")
        assert len(cache.index.entries) == 2 and cache.index.get(old[0].key) is None  # the oldest went
        assert kv_wire.crc32(kv_wire.as_bytes(new.dram.buffer)) == chunks[0].entry.crc32
        assert held_bytes(cache)["dram"] == cache.dram.used_bytes == 2 * ENTRY_BYTES
        assert receiver.admission.staging.used_bytes == 0


@pytest.mark.parametrize("idle_s", [float("nan"), float("inf"), float("-inf"), -1.0, 61.0])
@run
async def test_an_idle_time_that_is_no_time_or_past_the_ttl_is_refused_as_invalid(idle_s, caplog) -> None:
    async with cache_app(instance_name="b", dram_ttl_s=60) as receiver:
        with caplog.at_level(logging.WARNING):
            tally = await deliver(receiver, made_up(receiver, 1, idle_s=idle_s))
        assert (tally.admitted, dict(tally.refused)) == (0, {Refusal.HANDOFF_REFUSAL_INVALID: 1})
        assert not receiver.cache.index.entries and receiver.cache.dram.used_bytes == 0
        assert held_bytes(receiver.cache) == {"hbm": 0, "dram": 0}
        assert "entry.idle_s" in caplog.text


@run
async def test_an_admitted_entry_is_stamped_with_its_last_use_on_the_sender() -> None:
    async with cache_app(instance_name="b", dram_ttl_s=60) as receiver:
        before = receiver.cache.clock()
        tally = await deliver(receiver, made_up(receiver, 1, idle_s=42.0))
        after = receiver.cache.clock()
        assert tally.admitted == 1
        (entry,) = receiver.cache.index.of_user("user-1")
        assert before - 42.0 <= receiver.cache.dram.last_used(entry.key) <= after - 42.0
        assert receiver.cache.dram.oldest_use() == receiver.cache.dram.last_used(entry.key)


def _reserved(receiver) -> int:
    """Bytes the receiver's DRAM and staging tiers account for, reservations included."""
    return receiver.cache.dram.used_bytes + receiver.admission.staging.used_bytes


@run
async def test_a_chunk_over_the_limit_ends_the_stream_and_its_entry_is_given_back(monkeypatch) -> None:
    """Chunks carry at most `CHUNK_BYTES` of data: the first one over it ends the stream with an error
    naming the field, and the entry it belonged to leaves neither its reservation nor its bytes."""
    monkeypatch.setattr(kv_wire, "CHUNK_BYTES", 4096)
    async with cache_app(instance_name="b", dram_ttl_s=600) as receiver:
        first, second, *_ = made_up(receiver, 1)
        seen = []

        async def oversized():
            yield handoff_pb2.PushRequest(chunk=first)
            seen.append(_reserved(receiver))  # the entry's reservation, held while it arrives
            yield handoff_pb2.PushRequest(chunk=handoff_pb2.HandoffChunk(data=second.data + b"\0"))

        with pytest.raises(StreamError, match=r"chunk\.data: 4097 bytes") as caught:
            await receive(oversized(), receiver.admission)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert seen == [ENTRY_BYTES]
        assert _reserved(receiver) == 0 and held_bytes(receiver.cache) == {"hbm": 0, "dram": 0}
        assert receiver.cache.index.of_user("user-1") == []


@run
async def test_a_sender_stalled_within_an_entry_holds_no_reservation_past_the_chunk_timeout(
    monkeypatch,
) -> None:
    """A sender that stops after an entry's first chunk: once the chunk timeout passes, its reservation is
    given back while the stream is still open, and the stream ends with DEADLINE_EXCEEDED. Between entries
    a quiet stream holds nothing and is left alone."""
    monkeypatch.setattr(kv_wire, "CHUNK_BYTES", 4096)
    async with cache_app(instance_name="b", dram_ttl_s=600) as receiver:
        whole, (first, *_) = made_up(receiver, 1, length=8), made_up(receiver, 2)
        assert len(whole) == 1  # 8 events: one chunk
        resumed = asyncio.Event()

        async def stalling():
            yield handoff_pb2.PushRequest(chunk=whole[0])
            await asyncio.sleep(0.3)  # between entries: longer than the timeout, and harmless
            yield handoff_pb2.PushRequest(chunk=first)
            await resumed.wait()  # never set while the receiver waits

        task = asyncio.ensure_future(receive(stalling(), receiver.admission, chunk_timeout_s=0.1))
        for _ in range(200):
            if _reserved(receiver) > 8 * 512:
                break
            await asyncio.sleep(0.005)
        assert _reserved(receiver) == 8 * 512 + ENTRY_BYTES  # the first entry held, the second reserved
        with pytest.raises(StreamError, match=r"none for 0\.1 s within entry 'user-2'") as caught:
            await asyncio.wait_for(task, 5)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _reserved(receiver) == held_bytes(receiver.cache)["dram"] == 8 * 512
        assert receiver.cache.index.of_user("user-2") == []
        assert len(receiver.cache.index.of_user("user-1")) == 1
