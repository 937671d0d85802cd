"""The DRAM tier's host pool: one arena, contiguous slabs that never overlap, neighbours that coalesce,
frees deferred until the copy reading a slab completes, and never more bytes out than the arena holds."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from services.ranker.device.host_pool import HostPool
from tests.ranker.harness import PendingEvent


def assert_disjoint_within(pool: HostPool, slabs) -> None:
    ranges = sorted((slab.offset, slab.end) for slab in slabs)
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end <= start, f"slabs overlap: {ranges}"
    assert all(start >= 0 and end <= pool.capacity_bytes for start, end in ranges)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["allocate", "free", "free_after", "complete"]),
            st.integers(0, 15),
            st.integers(0, 3000),
        ),
        max_size=60,
    )
)
def test_random_allocations_never_overlap_nor_exceed_the_arena(operations):
    pool = HostPool(8192, alignment=256)
    held, deferred = [], []  # slabs we own; (slab, event) freed after a pending event
    for op, index, nbytes in operations:
        if op == "allocate":
            slab = pool.allocate(nbytes)
            if slab is not None:
                assert slab.nbytes >= nbytes and slab.nbytes % 256 == 0
                held.append(slab)
            else:  # refused only when no free range (after waiting for deferred frees) is large enough
                assert pool.largest_free() < max(nbytes, 1) and not pool.pending_frees()
        elif op == "free" and held:
            pool.free(held.pop(index % len(held)))
        elif op == "free_after" and held:
            event = PendingEvent()
            slab = held.pop(index % len(held))
            pool.free(slab, after=event)
            deferred.append((slab, event))
        elif op == "complete" and deferred:
            deferred.pop(index % len(deferred))[1].done = True
        # What is out is what we hold plus what waits on an event not yet complete: measured from the slabs.
        live = held + [slab for slab, event in deferred if not event.done]
        out = pool.slabs()
        assert_disjoint_within(pool, out)
        assert {s.offset for s in live} <= {s.offset for s in out}
        assert pool.used_bytes == sum(s.nbytes for s in out) <= pool.capacity_bytes
        assert pool.largest_free() <= pool.free_bytes


def test_freed_neighbours_coalesce_into_one_range():
    pool = HostPool(3 * 512)
    a, b, c = (pool.allocate(512) for _ in range(3))
    assert [a.offset, b.offset, c.offset] == [0, 512, 1024] and pool.largest_free() == 0
    pool.free(a)
    pool.free(c)
    assert pool.free_bytes == 1024 and pool.largest_free() == 512  # two ranges, not adjacent
    assert pool.allocate(1024) is None
    pool.free(b)
    assert pool.largest_free() == 3 * 512
    whole = pool.allocate(3 * 512)
    assert whole is not None and whole.offset == 0


def test_a_deferred_free_waits_for_its_event():
    pool = HostPool(3 * 512)
    reading, other = pool.allocate(512), pool.allocate(512)
    event = PendingEvent()
    pool.free(reading, after=event)
    assert pool.pending_frees() == 1 and pool.used_bytes == 1024
    # Room elsewhere: the slab still being read is not handed out, and the host did not wait for it.
    spare = pool.allocate(512)
    assert spare.offset == 1024 and event.waited == 0
    # Full: the allocation waits for the deferred free's event, then reuses that slab.
    again = pool.allocate(512)
    assert event.waited == 1 and again.offset == reading.offset
    assert pool.pending_frees() == 0
    pool.free(other)
    done = PendingEvent()
    done.done = True
    pool.free(spare, after=done)  # already complete: freed at once
    assert pool.used_bytes == 512


def test_a_double_free_raises():
    pool = HostPool(1024)
    slab = pool.allocate(100)
    pool.free(slab, after=PendingEvent())
    with pytest.raises(ValueError, match="freed twice"):
        pool.free(slab)
    other = pool.allocate(100)
    pool.free(other)
    with pytest.raises(ValueError, match="freed twice"):
        pool.free(other)


def test_a_view_is_the_slabs_own_bytes():
    pool = HostPool(4096, arena=torch.zeros(4096, dtype=torch.uint8))
    first, second = pool.allocate(1000), pool.allocate(64)
    values = torch.arange(250, dtype=torch.float32).reshape(2, 5, 25)
    view = pool.view(first, values.shape, torch.float32)
    view.copy_(values)
    assert view.untyped_storage().data_ptr() == pool.arena.untyped_storage().data_ptr()
    assert_close(pool.arena[first.offset : first.offset + 1000].view(torch.float32).reshape(2, 5, 25), values)
    assert second.offset == 1024 and not pool.arena[1024:1088].any()  # the next slab's bytes are untouched
    with pytest.raises(ValueError, match="needs 4096 bytes"):
        pool.view(second, (1024,), torch.float32)


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="capacity_bytes"):
        HostPool(-1)
    with pytest.raises(ValueError, match="alignment"):
        HostPool(1024, alignment=100)
    with pytest.raises(ValueError, match="arena"):
        HostPool(1024, arena=torch.empty(512, dtype=torch.uint8))
    assert HostPool(0).allocate(1) is None
