"""The DRAM tier's precisions and the FP8 codec: a scale per layer, keys or values, user and head that is
amax / 448, a round trip within e4m3's rounding step, and a `PrefixKV` that carries its scales wherever it
goes and refuses them where they do not belong."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from services.ranker.model import kv_precision
from services.ranker.model.kv_precision import FP8, FP8_MAX, dequantize, quantize
from services.ranker.model.prefix_kv import PrefixKV

# e4m3 keeps 3 mantissa bits: rounding to nearest moves a normal value (scaled: at least 2^-6) by at most
# 2^-4 of it, a subnormal one by at most half the smallest step, 2^-10. The fp32 division and product add
# a few ulps, 2^-20 of |x| covers them.
RELATIVE, ABSOLUTE = 2**-4 + 2**-20, 2**-10


def assert_within_the_e4m3_step(x: torch.Tensor, back: torch.Tensor, scale: torch.Tensor) -> None:
    bound = RELATIVE * x.abs() + ABSOLUTE * scale
    error = (x - back).abs()
    assert bool((error <= bound).all()), f"worst excess {(error - bound).max().item():.3g}"


def test_the_precisions_name_their_dram_dtypes():
    assert kv_precision.dram_dtype("exact", torch.float32) is torch.float32
    assert kv_precision.dram_dtype("exact", torch.bfloat16) is torch.bfloat16
    assert kv_precision.dram_dtype("bf16", torch.float32) is torch.bfloat16
    assert kv_precision.dram_dtype("fp8", torch.float32) is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="valid: exact, bf16, fp8"):
        kv_precision.dram_dtype("int4", torch.float32)
    # Bytes of a [2, 2, 1, 2, 10, 16] entry: its buffer, plus a float32 a layer, keys or values and head.
    shape = (2, 2, 1, 2, 10, 16)
    assert kv_precision.kv_nbytes(shape, torch.float32) == 1280 * 4
    assert kv_precision.kv_nbytes(shape, torch.bfloat16) == 1280 * 2
    assert kv_precision.kv_nbytes(shape, FP8) == 1280 + 8 * 4


def test_the_scale_is_amax_over_448_per_layer_kv_user_and_head():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((3, 2, 2, 4, 9, 8), generator=generator)
    x *= torch.logspace(-3, 3, 4).reshape(1, 1, 1, 4, 1, 1)  # heads of very different magnitudes
    x[1, 0, 1, 2] = 0.0  # one head all zeros
    quantized, scale = quantize(x)
    assert quantized.dtype == FP8 and quantized.shape == x.shape and quantized.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (3, 2, 2, 4, 1, 1)
    expected = x.abs().amax(dim=(4, 5), keepdim=True) / 448
    expected[1, 0, 1, 2] = 1.0  # a head of zeros gets scale 1
    assert torch.equal(scale, expected)
    # Each head's largest magnitude lands on e4m3's largest value, 448 (the head of zeros aside).
    top = quantized.to(torch.float32).abs().amax(dim=(4, 5))
    assert top[1, 0, 1, 2] == 0
    top[1, 0, 1, 2] = FP8_MAX
    assert torch.equal(top, torch.full_like(top, FP8_MAX))
    back = dequantize(quantized, scale, torch.float32)
    assert torch.equal(back[1, 0, 1, 2], torch.zeros(9, 8))
    assert_within_the_e4m3_step(x, back, scale)


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 3),
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    rows=st.integers(1, 12),
    head_dim=st.sampled_from([1, 4, 16]),
    exponent=st.integers(-20, 20),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_a_round_trip_is_within_the_e4m3_step_of_every_value(
    layers, batch, heads, rows, head_dim, exponent, seed, dtype
):
    generator = torch.Generator().manual_seed(seed)
    shape = (layers, 2, batch, heads, rows, head_dim)
    # Magnitudes spread over six decades within an entry, around 10^exponent.
    spread = torch.exp(torch.empty(shape).uniform_(-7, 7, generator=generator))
    x = (torch.randn(shape, generator=generator) * spread * 10.0**exponent).to(dtype)
    quantized, scale = quantize(x)
    amax = x.float().abs().amax(dim=(4, 5), keepdim=True)
    assert torch.equal(scale, torch.where(amax / 448 > 0, amax / 448, 1.0))
    back = dequantize(quantized, scale, torch.float32)
    assert_within_the_e4m3_step(x.float(), back, scale)
    # Widened into the compute dtype in one rounding: in bf16, the fp32 round trip rounded once more.
    assert torch.equal(dequantize(quantized, scale, dtype), back.to(dtype))


def test_a_prefix_kv_carries_its_scales_through_every_move():
    generator = torch.Generator().manual_seed(1)
    kv = PrefixKV(torch.randn((2, 2, 3, 2, 5, 4), generator=generator))
    fp8 = kv.to(dtype=FP8)
    quantized, scale = quantize(kv.buffer)
    assert torch.equal(fp8.buffer.view(torch.uint8), quantized.view(torch.uint8))
    assert torch.equal(fp8.scale, scale)
    assert fp8.nbytes() == kv.nbytes() // 4 + 2 * 2 * 3 * 2 * 4
    assert fp8.to(dtype=FP8) is fp8
    back = fp8.to(dtype=torch.float32)
    assert back.scale is None and torch.equal(back.buffer, dequantize(quantized, scale, torch.float32))
    one = fp8.user(1)
    assert torch.equal(one.scale, scale[:, :, 1:2]) and one.batch_size == 1
    stacked = PrefixKV.stack([fp8.user(0), fp8.user(1), fp8.user(2)])
    assert torch.equal(stacked.scale, fp8.scale)
    assert torch.equal(stacked.to(dtype=torch.float32).buffer, back.buffer)


def test_a_prefix_kv_refuses_missing_misplaced_or_misshapen_scales():
    fp8 = torch.zeros((2, 2, 1, 3, 4, 8), dtype=FP8)
    good = torch.ones((2, 2, 1, 3, 1, 1))
    PrefixKV(fp8, scale=good)
    with pytest.raises(ValueError, match="needs its scale"):
        PrefixKV(fp8)
    with pytest.raises(ValueError, match="takes no scale"):
        PrefixKV(torch.zeros((2, 2, 1, 3, 4, 8)), scale=good)
    for bad in (torch.ones((2, 2, 1, 3, 1)), torch.ones((2, 2, 1, 2, 1, 1)), good.double()):
        with pytest.raises(ValueError, match=r"scale must be contiguous torch.float32 \[2, 2, 1, 3, 1, 1\]"):
            PrefixKV(fp8, scale=bad)
