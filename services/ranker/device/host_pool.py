"""The DRAM tier's host memory: one arena allocated once, handed out as contiguous slabs.

Pinning host memory is slow (a system call and page locking per allocation), so an accelerator ranker
pins one arena, sized by the DRAM budget, at start-up and places every DRAM copy in a slab of it. Slabs
are found first-fit in a free list kept sorted by offset, whose neighbours coalesce on free, so the arena
never holds more than its capacity and a freed slab is whole again for the next long prefix.

A slab that an in-flight copy still reads (a reload to the device) is freed `after` that copy's event:
it rejoins the free list only once the event has completed, so a slab is never reused under a copy.
Thread-safe: the copy thread allocates, the event loop frees.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import threading

import torch


@dataclasses.dataclass(frozen=True, eq=False)
class Slab:
    """A contiguous range of the arena: `nbytes` (a multiple of the pool's alignment) from `offset`."""

    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


class PoolExhausted(Exception):
    """The host pool has no contiguous free range large enough for a DRAM copy."""


class HostPool:
    def __init__(self, capacity_bytes: int, arena: torch.Tensor | None = None, alignment: int = 512) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"HostPool capacity_bytes must be >= 0, got {capacity_bytes}")
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"HostPool alignment must be a power of two, got {alignment}")
        if arena is None:
            arena = torch.empty(capacity_bytes, dtype=torch.uint8)
        if arena.dtype != torch.uint8 or arena.dim() != 1 or arena.numel() < capacity_bytes:
            raise ValueError(f"HostPool arena must be a 1-D uint8 tensor of at least {capacity_bytes} bytes")
        self.arena = arena
        self.capacity_bytes = capacity_bytes
        self.alignment = alignment
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, capacity_bytes)] if capacity_bytes else []  # (offset, size)
        self._allocated: dict[int, Slab] = {}
        self._deferred: dict[int, object] = {}  # slab offset -> the event it is freed after
        self.used_bytes = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def largest_free(self) -> int:
        """The largest slab `allocate` could hand out now (frees whose events completed count)."""
        with self._lock:
            self._reap(block=False)
            return max((size for _, size in self._free), default=0)

    def allocate(self, nbytes: int) -> Slab | None:
        """A slab of at least `nbytes`, first fit; None when no free range is large enough, even after
        waiting for the copies that deferred frees are waiting for."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        size = max(self.alignment, math.ceil(nbytes / self.alignment) * self.alignment)
        with self._lock:
            self._reap(block=False)
            slab = self._first_fit(size)
            if slab is None and self._deferred:
                self._reap(block=True)
                slab = self._first_fit(size)
            return slab

    def free(self, slab: Slab, after=None) -> None:
        """Returns `slab` to the pool; with `after` (an event), only once the event has completed."""
        with self._lock:
            if self._allocated.get(slab.offset) is not slab or slab.offset in self._deferred:
                raise ValueError(f"slab at {slab.offset} is not allocated from this pool (freed twice?)")
            if after is not None and not after.query():
                self._deferred[slab.offset] = after
                return
            self._release(slab)

    def view(self, slab: Slab, shape, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
        """The slab's bytes from `offset` (a multiple of `dtype`'s size) as a contiguous tensor of `shape`
        and `dtype`."""
        nbytes = math.prod(shape) * dtype.itemsize
        if offset < 0 or offset % dtype.itemsize or offset + nbytes > slab.nbytes:
            raise ValueError(
                f"a {list(shape)} {dtype} view at {offset} needs {offset + nbytes} bytes, the slab has "
                f"{slab.nbytes}"
            )
        start = slab.offset + offset
        return self.arena[start : start + nbytes].view(dtype).view(shape)

    def slabs(self) -> list[Slab]:
        """The slabs handed out and not yet back in the free list, by offset."""
        with self._lock:
            return sorted(self._allocated.values(), key=lambda slab: slab.offset)

    def pending_frees(self) -> int:
        """Slabs freed after an event that has not completed yet."""
        with self._lock:
            self._reap(block=False)
            return len(self._deferred)

    # ---- internals, under the lock ----

    def _first_fit(self, size: int) -> Slab | None:
        for index, (offset, free_size) in enumerate(self._free):
            if free_size >= size:
                if free_size == size:
                    del self._free[index]
                else:
                    self._free[index] = (offset + size, free_size - size)
                slab = Slab(offset, size)
                self._allocated[offset] = slab
                self.used_bytes += size
                return slab
        return None

    def _release(self, slab: Slab) -> None:
        """Puts `slab` back in the free list, merged with the free ranges either side of it."""
        del self._allocated[slab.offset]
        self.used_bytes -= slab.nbytes
        offset, size = slab.offset, slab.nbytes
        index = bisect.bisect_left(self._free, (offset, 0))
        if index < len(self._free) and self._free[index][0] == offset + size:  # the next range
            size += self._free.pop(index)[1]
        if index > 0 and sum(self._free[index - 1]) == offset:  # the previous range
            index -= 1
            previous_offset, previous_size = self._free.pop(index)
            offset, size = previous_offset, previous_size + size
        self._free.insert(index, (offset, size))

    def _reap(self, block: bool) -> None:
        """Completes the deferred frees whose events are done; with `block`, waits for all of them."""
        for offset, event in list(self._deferred.items()):
            if block:
                event.synchronize()
            elif not event.query():
                continue
            del self._deferred[offset]
            self._release(self._allocated[offset])
