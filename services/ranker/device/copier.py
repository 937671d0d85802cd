"""The copies between the HBM and DRAM tiers.

On an accelerator an entry's DRAM copy is one slab of the pinned host pool, viewed as the entry's
contiguous `[layers, 2, B, H, L, d]` buffer, and both directions run on the accelerator's copy stream,
driven from the copy thread, so they overlap the compute streams' kernels:

- `to_dram` orders the copy after the work that produced the entry (its ready markers, or the compute
  streams' work queued so far), copies the whole buffer in one copy (narrowed on the device first when
  DRAM copies are in a narrower dtype: bf16, or FP8 with its scales), and waits for that copy's event only.
- `to_hbm` allocates the device buffer and queues one copy per layer (a layer's keys and values are one
  contiguous block), recording an event after each, and returns at once: the entry's ready markers let
  the Rank that consumes it start layer 0 while later layers are still on their way. A narrower copy
  crosses the bus in its own dtype and widens on the device (an FP8 one times its scales, which cross
  first).
- `release` returns a DRAM copy's slab to the pool after the last reload that reads it has completed, so
  a slab is never reused under an in-flight copy.

An FP8 copy's slab holds its float32 scales (`[layers, 2, B, H, 1, 1]`) first, then its bytes, so the DRAM
tier's bytes and the pool's are the same (`dram_nbytes`).

On CPU (`Accelerator.copies` False) the two tiers are separate byte budgets over the same memory: moving
an entry between them copies nothing unless the DRAM tier stores a narrower (bf16 or FP8) copy.
`copies=True` forces the pool path on CPU, where the stand-in streams run each copy when it is queued.
"""

from __future__ import annotations

import threading

import torch

from services.ranker.device.accelerator import Accelerator
from services.ranker.device.host_pool import HostPool, PoolExhausted, Slab
from services.ranker.model import kv_precision
from services.ranker.model.prefix_kv import PrefixKV

__all__ = ["PoolExhausted", "TierCopier"]


class _AllOf:
    """An event that completes when all of `events` have (a slab read by a reload and by a caller)."""

    def __init__(self, *events) -> None:
        self.events = events

    def query(self) -> bool:
        return all(event.query() for event in self.events)

    def synchronize(self) -> None:
        for event in self.events:
            event.synchronize()


class TierCopier:
    """Copies prefix KV between device memory (HBM tier) and host memory (DRAM tier).

    Call `to_dram` and `to_hbm` on the copy thread; `reserve`, `release` and `discard` on the event loop.
    `to_dram` returns once its copy is complete; `to_hbm` returns an entry whose per-layer ready markers
    complete with the copy. The compute streams are never blocked by a copy, nor the device by a host wait.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        compute_dtype: torch.dtype,
        dram_dtype: torch.dtype,
        pool: HostPool | None = None,
    ) -> None:
        if accelerator.copies and pool is None:
            raise ValueError("a TierCopier that copies (an accelerator, or copies=True) needs a HostPool")
        self.accelerator = accelerator
        self.device = accelerator.device
        self.compute_dtype = compute_dtype
        self.dram_dtype = dram_dtype
        self.pool = pool if accelerator.copies else None
        self._lock = threading.Lock()
        self._slabs: dict[int, Slab] = {}  # data_ptr of a DRAM copy's buffer -> its slab
        self._readers: dict[int, object] = {}  # data_ptr -> event of the last reload that read it

    @property
    def lossy(self) -> bool:
        """DRAM copies lose precision (stored in a narrower dtype than the model computes in)."""
        return self.dram_dtype != self.compute_dtype

    def dram_nbytes(self, shape: tuple[int, ...] | torch.Size) -> int:
        """Bytes a DRAM copy of a `shape` buffer takes: its bytes in the DRAM dtype, and its scales in FP8."""
        return kv_precision.kv_nbytes(shape, self.dram_dtype)

    @property
    def copies(self) -> bool:
        """DRAM copies are real copies in slabs of the host pool (else: the same memory, budgeted apart)."""
        return self.pool is not None

    @property
    def in_place(self) -> bool:
        """A move between the tiers copies nothing (CPU, full precision): the DRAM copy is the same tensor,
        so a move completes where it is asked for, with no hand-off to the copy thread and back."""
        return self.pool is None and not self.lossy

    def reserve(self, nbytes: int) -> Slab | None:
        """A slab for a DRAM copy of `nbytes`, taken on the event loop before the copy is queued; None when
        the pool has no contiguous range that large (or when not copying: nothing to reserve)."""
        return None if self.pool is None else self.pool.allocate(nbytes)

    def discard(self, slab: Slab | None) -> None:
        """Returns a reserved slab that no copy was made into."""
        if slab is not None and self.pool is not None:
            self.pool.free(slab)

    def new_dram(self, shape: tuple[int, ...]) -> PrefixKV | None:
        """An empty DRAM copy of `shape` in the DRAM dtype (its scales unset, in FP8), for bytes that arrive
        from elsewhere (a peer's handoff): a slab of the pool, released as any DRAM copy is; None when the
        pool cannot hold it."""
        if self.pool is None:
            scale = None
            if self.dram_dtype in kv_precision.SCALED:
                scale = torch.empty(kv_precision.scale_shape(shape), dtype=kv_precision.SCALE_DTYPE)
            return PrefixKV(torch.empty(shape, dtype=self.dram_dtype), scale=scale)
        slab = self.pool.allocate(self.dram_nbytes(shape))
        if slab is None:
            return None
        host = self._view(slab, shape)
        with self._lock:
            self._slabs[host.buffer.data_ptr()] = slab
        return host

    def _view(self, slab: Slab, shape) -> PrefixKV:
        """A DRAM copy of `shape` in `slab`: its scales first (FP8), then its buffer."""
        scale_bytes = kv_precision.scale_nbytes(shape, self.dram_dtype)
        scale = None
        if scale_bytes:
            scale = self.pool.view(slab, kv_precision.scale_shape(shape), kv_precision.SCALE_DTYPE)
        return PrefixKV(self.pool.view(slab, shape, self.dram_dtype, offset=scale_bytes), scale=scale)

    def to_host(self, kv: PrefixKV) -> PrefixKV:
        """`kv` in host memory and the DRAM dtype (quantized, in FP8), complete on return (itself when it is
        there already): what a handoff sends. Call on the copy thread."""
        kv = kv.wait()
        if kv.device.type == "cpu" and kv.dtype == self.dram_dtype:
            return kv
        acc = self.accelerator
        with acc.on(acc.copy_stream):
            for stream in (acc.rank_stream, acc.pre_infer_stream, acc.default_stream()):
                acc.copy_stream.wait_stream(stream)
            host = kv.to(dtype=self.dram_dtype).to("cpu")
            acc.record(acc.copy_stream).synchronize()
        return host

    def to_dram(self, kv: PrefixKV, slab: Slab | None = None) -> PrefixKV:
        """The DRAM copy of `kv`, complete on return. With a pool it lands in `slab` (taken by `reserve`;
        allocated here when None); raises `PoolExhausted` when the pool cannot hold it, the slab freed."""
        if self.pool is None:
            kv = kv.wait()
            return kv if kv.dtype == self.dram_dtype else kv.to(dtype=self.dram_dtype)
        nbytes = self.dram_nbytes(kv.buffer.shape)
        if slab is None:
            slab = self.pool.allocate(nbytes)
            if slab is None:
                raise PoolExhausted(f"no free host-pool range of {nbytes} bytes for a DRAM copy")
        if slab.nbytes < nbytes:
            self.pool.free(slab)
            raise PoolExhausted(f"the DRAM copy needs {nbytes} bytes, its slab has {slab.nbytes}")
        try:
            host = self._copy_out(kv, self._view(slab, kv.buffer.shape))
        except BaseException:
            self.pool.free(slab)
            raise
        with self._lock:
            self._slabs[host.buffer.data_ptr()] = slab
        return host

    def _copy_out(self, kv: PrefixKV, host: PrefixKV) -> PrefixKV:
        """One copy of `kv`'s buffer (and scales) into `host` on the copy stream, after the work that
        produced it."""
        acc = self.accelerator
        with acc.on(acc.copy_stream):
            if kv.ready is not None:  # written by another stream: wait for each layer's marker
                for marker in kv.ready:
                    marker.wait()
            else:  # produced on a compute stream: order after the work queued there so far
                for stream in (acc.rank_stream, acc.pre_infer_stream, acc.default_stream()):
                    acc.copy_stream.wait_stream(stream)
            source = kv if kv.dtype == self.dram_dtype else PrefixKV(kv.buffer).to(dtype=self.dram_dtype)
            if host.scale is not None:
                host.scale.copy_(source.scale, non_blocking=acc.asynchronous)
            host.buffer.copy_(source.buffer, non_blocking=acc.asynchronous)
            done = acc.record(acc.copy_stream)
        done.synchronize()  # this copy only: the compute streams keep running
        return host

    def to_hbm(self, kv: PrefixKV) -> PrefixKV:
        """A device copy of the DRAM copy `kv`, returned as soon as its copies are queued: layer l's ready
        marker completes when layer l has arrived, so a consumer overlaps the reload layer by layer."""
        if self.pool is None:
            return kv if kv.dtype == self.compute_dtype else kv.to(dtype=self.compute_dtype)
        acc = self.accelerator
        shape = kv.buffer.shape
        with acc.on(acc.copy_stream):
            device_buffer = torch.empty(shape, dtype=self.compute_dtype, device=self.device)
            # A narrower copy crosses the bus in its own dtype and widens on the device, a layer at a time
            # (an FP8 one times its scales, which cross first).
            staging, scale = None, None
            if kv.dtype != self.compute_dtype:
                staging = torch.empty(shape[1:], dtype=kv.dtype, device=self.device)
            if kv.scale is not None:
                scale = kv.scale.to(self.device, non_blocking=acc.asynchronous)
            ready = []
            for layer in range(kv.num_layers):
                if staging is None:
                    device_buffer[layer].copy_(kv.buffer[layer], non_blocking=acc.asynchronous)
                else:
                    staging.copy_(kv.buffer[layer], non_blocking=acc.asynchronous)
                    if scale is None:
                        device_buffer[layer].copy_(staging)
                    else:
                        kv_precision.dequantize_into(device_buffer[layer], staging, scale[layer])
                ready.append(acc.record(acc.copy_stream))
        # Allocated on the copy stream, read on the compute streams: the allocator must know.
        for stream in (acc.rank_stream, acc.pre_infer_stream, acc.default_stream()):
            acc.used_by(device_buffer, stream)
        with self._lock:
            if kv.buffer.data_ptr() in self._slabs:
                self._readers[kv.buffer.data_ptr()] = ready[-1]  # the copy stream runs them in order
        return PrefixKV(device_buffer, ready)

    def release(self, dram_kv: PrefixKV, after=None) -> None:
        """Gives back the slab of the DRAM copy `dram_kv` once the last reload that reads it (and `after`,
        an event, if given) has completed. Exactly once per copy; nothing to do when not copying."""
        if self.pool is None:
            return
        pointer = dram_kv.buffer.data_ptr()
        with self._lock:
            slab = self._slabs.pop(pointer, None)
            reader = self._readers.pop(pointer, None)
        if slab is None:
            raise ValueError("release of a DRAM copy that this copier does not hold (released twice?)")
        events = [event for event in (reader, after) if event is not None]
        self.pool.free(slab, after=_AllOf(*events) if len(events) > 1 else (events[0] if events else None))

    def held(self) -> int:
        """DRAM copies whose slabs are held (not released)."""
        with self._lock:
            return len(self._slabs)
