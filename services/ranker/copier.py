"""The copies between the HBM and DRAM tiers.

On an accelerator, DRAM copies live in pinned host memory and both directions run on a dedicated copy
stream, driven from the copy thread, so they overlap the compute thread's kernels. On CPU the two tiers
are separate byte budgets over the same memory: moving an entry between them copies nothing unless the
DRAM tier stores a lossy (bf16) copy.
"""

from __future__ import annotations

import contextlib

import torch

from services.ranker.device import backend
from services.ranker.model import PrefixKV


class TierCopier:
    """Copies prefix KV between device memory (HBM tier) and host memory (DRAM tier).

    Call its methods on the copy thread. Each returns only when the copy is complete, so the result can
    be handed to any thread; the compute stream is never blocked by a copy.
    """

    def __init__(self, device: torch.device, compute_dtype: torch.dtype, dram_dtype: torch.dtype) -> None:
        self.device = device
        self.compute_dtype = compute_dtype
        self.dram_dtype = dram_dtype
        module = backend(device)
        self._stream = module.Stream(device) if module is not None else None
        self._backend = module

    @property
    def lossy(self) -> bool:
        """DRAM copies lose precision (stored in a narrower dtype than the model computes in)."""
        return self.dram_dtype != self.compute_dtype

    def _on_copy_stream(self):
        return self._backend.stream(self._stream) if self._stream is not None else contextlib.nullcontext()

    def to_dram(self, kv: PrefixKV) -> PrefixKV:
        if self._stream is None:
            return kv if kv.dtype == self.dram_dtype else kv.to(dtype=self.dram_dtype)
        # The KV was written on the compute stream: order the copy after it.
        self._stream.wait_stream(self._backend.current_stream(self.device))
        with self._on_copy_stream():
            host = PrefixKV(
                [_pinned_copy(t, self.dram_dtype) for t in kv.keys],
                [_pinned_copy(t, self.dram_dtype) for t in kv.values],
                kv.length,
            )
        self._stream.synchronize()
        return host

    def to_hbm(self, kv: PrefixKV) -> PrefixKV:
        if self._stream is None:
            return kv if kv.dtype == self.compute_dtype else kv.to(dtype=self.compute_dtype)
        with self._on_copy_stream():
            device_kv = kv.to(self.device, non_blocking=True).to(dtype=self.compute_dtype)
        self._stream.synchronize()
        # Memory allocated on the copy stream is now used by the compute stream: tell the allocator.
        compute = self._backend.current_stream(self.device)
        for tensor in (*device_kv.keys, *device_kv.values):
            tensor.record_stream(compute)
        return device_kv


def _pinned_copy(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=dtype, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host
