"""Consume-bound leases kept in deadline order with a running byte count, checked against a brute-force
reading of the entries themselves: the bytes their KV tensors hold, and which deadlines have passed."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.ranker.cache.index import CacheEntry, PrefixKey
from services.ranker.cache.leases import Leases
from services.ranker.engine.load import LoadBook
from services.ranker.engine.scheduler import Scheduler
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

TTL_S = 3.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def entry(i: int, length: int) -> CacheEntry:
    kv = PrefixKV.empty(2, 1, 2, length, 4, torch.float32, "cpu")
    made = CacheEntry(PrefixKey(f"u{i}", f"f{i}", "v"), Events.of(range(length), [0] * length))
    made.hbm = kv
    return made


operations = st.lists(
    st.tuples(st.sampled_from(["grant", "end", "pin", "unpin", "wait"]), st.integers(0, 7), st.floats(0, 2)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=8, max_size=8), operations=operations)
def test_leased_bytes_and_expiry_match_the_entries_themselves(lengths, operations):
    scheduler = Scheduler("leases-test")
    try:
        clock = Clock()
        leases = Leases(TTL_S, clock, LoadBook(scheduler, clock))
        entries = [entry(i, length) for i, length in enumerate(lengths)]
        pins: dict[int, object] = {}
        for op, i, seconds in operations:
            e = entries[i]
            if op == "grant":
                leases.grant(e, "test")
            elif op == "end":
                leases.end(e, consumed=True)
            elif op == "pin" and i not in pins:
                pins[i] = e.pin("test")
            elif op == "unpin" and i in pins:
                pins.pop(i).release()
            elif op == "wait":
                clock.now += seconds
            leased = [e for e in entries if e.lease is not None]
            # The bytes the leased entries' tensors hold, read from their storages.
            assert leases.held_bytes() == sum(e.hbm.buffer.untyped_storage().nbytes() for e in leased)
            assert len(leases) == len(leased)
            due = {id(e) for e in leased if e.lease.deadline <= clock.now and not e.pinned}
            assert {id(e) for e in leases.expired()} == due
    finally:
        scheduler.close()
