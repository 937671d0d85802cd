"""`PrefixKV`: one prefix's per-layer keys and values, the currency of the prefix cache.

The model produces it (`HSTURanker.pre_infer`, `PrefixBuilder`), the cache holds it in its tiers, the device
code copies it between them, and a cached rank consumes it. Its layout is the model's compute layout, one
contiguous buffer `[layers, 2, B, H, L, d]`, so a move between tiers is one copy and a rank transposes
nothing. A DRAM copy in FP8 carries its scales beside the buffer (`scale`, see `kv_precision`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from services.ranker.model import kv_precision


class Ready(Protocol):
    """Marks when a layer's KV is ready on the device: a `torch.cuda.Event` / `torch.npu.Event`, or the
    ranker's CPU stand-in. `wait()` makes work queued afterwards on the current stream wait for it (the host
    does not block)."""

    def wait(self) -> None: ...


@dataclass
class PrefixKV:
    """Per-layer keys and values of the first `length` tokens of B users' sequences, in one contiguous
    buffer ``[layers, 2, B, H, L, d]`` (keys at index 0, values at 1).

    One buffer makes every move of an entry one copy (and one allocation), and the layer-major layout makes
    each layer's keys and values one contiguous block, so a reload can hand layers over one at a time.
    ``keys[l]`` is [B, H, L, dqk] and ``values[l]`` [B, H, L, dv], contiguous views in the layout attention
    consumes, so ranking never transposes.

    `ready` (None: ready now) holds one `Ready` per layer while the buffer is still being written by another
    stream (a reload, a pre-inference): `layer(l)` waits for layer l only. Treat entries as immutable: every
    method returns a new one.

    `scale` is given exactly when the buffer is in a scaled dtype (FP8: a DRAM copy at `--dram-precision
    fp8`): float32 ``[layers, 2, B, H, 1, 1]``, one per layer, keys or values, user and head, on the
    buffer's device; the values are `buffer * scale` (`to` a compute dtype multiplies them out).
    """

    buffer: Tensor
    ready: Sequence[Ready] | None = None
    scale: Tensor | None = None

    def __post_init__(self) -> None:
        shape = list(self.buffer.shape)
        if self.buffer.dim() != 6 or shape[0] < 1 or shape[1] != 2:
            raise ValueError(f"PrefixKV's buffer must be [layers, 2, B, H, L, d], got {shape}")
        if not self.buffer.is_contiguous():
            raise ValueError("PrefixKV's buffer must be contiguous")
        if self.ready is not None and len(self.ready) != shape[0]:
            raise ValueError(f"PrefixKV needs one ready marker per layer: {len(self.ready)} for {shape[0]}")
        scaled = self.buffer.dtype in kv_precision.SCALED
        if self.scale is None:
            if scaled:
                raise ValueError(f"PrefixKV's {self.buffer.dtype} buffer needs its scale")
            return
        if not scaled:
            raise ValueError(f"PrefixKV's {self.buffer.dtype} buffer takes no scale")
        expected = kv_precision.scale_shape(shape)
        if (
            self.scale.dtype != kv_precision.SCALE_DTYPE
            or tuple(self.scale.shape) != expected
            or self.scale.device != self.buffer.device
            or not self.scale.is_contiguous()
        ):
            got = f"{self.scale.dtype} {list(self.scale.shape)} on {self.scale.device}"
            raise ValueError(
                f"PrefixKV's scale must be contiguous {kv_precision.SCALE_DTYPE} {list(expected)} on "
                f"{self.buffer.device}, got {got}"
            )

    @classmethod
    def empty(
        cls, layers: int, batch: int, heads: int, length: int, head_dim: int, dtype: torch.dtype, device
    ) -> PrefixKV:
        """An uninitialised entry (to be filled by its producer)."""
        shape = (layers, 2, batch, heads, length, head_dim)
        return cls(torch.empty(shape, dtype=dtype, device=device))

    @property
    def num_layers(self) -> int:
        return self.buffer.shape[0]

    @property
    def length(self) -> int:
        return self.buffer.shape[4]

    @property
    def batch_size(self) -> int:
        return self.buffer.shape[2]

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    @property
    def dtype(self) -> torch.dtype:
        return self.buffer.dtype

    @property
    def keys(self) -> list[Tensor]:
        return [self.buffer[layer, 0] for layer in range(self.num_layers)]

    @property
    def values(self) -> list[Tensor]:
        return [self.buffer[layer, 1] for layer in range(self.num_layers)]

    def layer(self, index: int) -> tuple[Tensor, Tensor]:
        """Layer `index`'s keys and values, once work on the current stream may read them."""
        if self.ready is not None:
            self.ready[index].wait()
        return self.buffer[index, 0], self.buffer[index, 1]

    def wait(self) -> PrefixKV:
        """This entry with every layer waited for on the current stream (and no markers left)."""
        if self.ready is None:
            return self
        for marker in self.ready:
            marker.wait()
        return PrefixKV(self.buffer, scale=self.scale)

    def nbytes(self) -> int:
        """Exact bytes of all keys and values (the buffer), and of their scales if they have any."""
        scale = 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return self.buffer.numel() * self.buffer.element_size() + scale

    def to(
        self,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        non_blocking: bool = False,
    ) -> PrefixKV:
        """A copy on `device` / in `dtype`, in one copy of the buffer; itself (markers kept) when already
        there, so that a consumer still waits layer by layer. Into FP8 it quantizes (`kv_precision.quantize`,
        on this entry's device), out of FP8 into another dtype it multiplies the scales out."""
        target = self.device if device is None else torch.device(device)
        same_device = target.type == self.device.type and target.index in (None, self.device.index)
        if same_device and dtype in (None, self.dtype):
            return self
        kv, move = self.wait(), dict(device=device, non_blocking=non_blocking)
        if dtype is not None and dtype != self.dtype and self.scale is not None:  # out of FP8
            buffer, scale = kv.buffer.to(**move), kv.scale.to(**move)
            return PrefixKV(kv_precision.dequantize(buffer, scale, dtype))
        if dtype is not None and dtype != self.dtype and dtype in kv_precision.SCALED:  # into FP8
            buffer, scale = kv_precision.quantize(kv.buffer)
            return PrefixKV(buffer.to(**move), scale=scale.to(**move))
        scale = None if kv.scale is None else kv.scale.to(**move)
        return PrefixKV(kv.buffer.to(dtype=dtype, **move), scale=scale)

    def user(self, index: int) -> PrefixKV:
        """User `index` of a batch as its own entry (B == 1), copied so that caching one user does not keep
        the whole batch's memory alive."""
        kv = self.wait()
        rows = kv.buffer[:, :, index : index + 1].clone(memory_format=torch.contiguous_format)
        scale = None if kv.scale is None else kv.scale[:, :, index : index + 1].clone()
        return PrefixKV(rows, scale=scale)

    @classmethod
    def stack(cls, entries: Sequence[PrefixKV]) -> PrefixKV:
        """Batch entries of equal length along B, to rank several users at once."""
        lengths = {entry.length for entry in entries}
        if len(lengths) != 1:
            raise ValueError(f"can only stack prefixes of one length, got {sorted(lengths)}")
        waited = [entry.wait() for entry in entries]
        scaled = [entry.scale for entry in waited if entry.scale is not None]
        scale = torch.cat(scaled, dim=2) if len(scaled) == len(waited) else None
        return cls(torch.cat([entry.buffer for entry in waited], dim=2), scale=scale)
