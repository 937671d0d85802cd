"""The precision a ranker's DRAM tier stores prefix KV in (`--dram-precision`), and the FP8 codec.

- `exact`: the model's compute dtype. A reload is the HBM copy bit for bit.
- `bf16`: bfloat16, half of fp32's bytes; a reload widens it back (lossy when the model computes in fp32).
- `fp8`: float8 e4m3 (`torch.float8_e4m3fn`), a quarter of fp32's bytes plus one float32 scale per layer,
  keys or values, user and head: `scale = amax / 448` over that head's rows and dimensions (448, e4m3's
  largest finite value; a head of zeros gets scale 1). The KV is divided by its scale, saturated to ±448
  and cast down (`quantize`); a reload casts it up and multiplies by the scale (`dequantize_into`).
  e4m3 keeps 3 mantissa bits, so for a scaled value in e4m3's normal range the rounding error is at most
  2^-4 of it, and below that range (2^-6) at most 2^-10: |x - x̂| <= 2^-4·|x| + 2^-10·scale, elementwise.

Every DRAM copy that is not the compute dtype makes the Ranks served from it lossy (`CacheEntry.lossy`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_DTYPE = torch.float32

# --dram-precision: the DRAM dtype, None for the model's own.
DRAM_PRECISIONS: dict[str, torch.dtype | None] = {"exact": None, "bf16": torch.bfloat16, "fp8": FP8}

# DRAM dtypes stored with a scale beside their bytes.
SCALED = frozenset({FP8})


def dram_dtype(precision: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype of DRAM copies at `precision` (a key of `DRAM_PRECISIONS`) for a model computing in
    `compute_dtype`."""
    if precision not in DRAM_PRECISIONS:
        raise ValueError(f"unknown DRAM precision {precision!r}; valid: {', '.join(DRAM_PRECISIONS)}")
    return DRAM_PRECISIONS[precision] or compute_dtype


def scale_shape(shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    """The scales' shape for a `[layers, 2, B, H, L, d]` buffer: `[layers, 2, B, H, 1, 1]`."""
    return (*tuple(shape)[:4], 1, 1)


def scale_nbytes(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> int:
    """Bytes of the scales a buffer of `shape` in `dtype` carries (0 for an unscaled dtype)."""
    return math.prod(scale_shape(shape)) * SCALE_DTYPE.itemsize if dtype in SCALED else 0


def kv_nbytes(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> int:
    """Bytes of a prefix's KV of `shape` stored in `dtype`: its buffer, and its scales if it has any."""
    return math.prod(shape) * dtype.itemsize + scale_nbytes(shape, dtype)


def quantize(buffer: Tensor) -> tuple[Tensor, Tensor]:
    """`buffer` ([layers, 2, B, H, L, d], any float dtype) in FP8 with its float32 scales
    ([layers, 2, B, H, 1, 1]), on `buffer`'s device."""
    wide = buffer.to(SCALE_DTYPE)
    scale = wide.abs().amax(dim=(4, 5), keepdim=True).div_(FP8_MAX)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all zeros (or underflowing): 1
    quantized = (wide / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return quantized.contiguous(), scale.contiguous()


def dequantize_into(out: Tensor, buffer: Tensor, scale: Tensor) -> Tensor:
    """Writes FP8 `buffer` times `scale` into `out` (its dtype: the compute dtype; the product is taken in
    float32 and rounded once), and returns `out`. The one definition of a reload's values, so that every
    path (in place, through the host pool, layer by layer) gives the same bits."""
    out.copy_(buffer)  # e4m3 values are exact in fp32, bf16 and fp16
    return out.mul_(scale)


def dequantize(buffer: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """FP8 `buffer` times `scale`, a new tensor in `dtype`."""
    return dequantize_into(torch.empty(buffer.shape, dtype=dtype, device=buffer.device), buffer, scale)
