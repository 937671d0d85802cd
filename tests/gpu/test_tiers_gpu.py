"""Tier copies on a CUDA GPU (`make test-gpu`; skipped without one, see conftest.py).

Their speed is measured, never asserted: `python -m bench accelerator` prints the reload bandwidth
against the pinned host-to-device peak of the same machine.

- A demoted and reloaded entry equals the original bitwise (and a lossy bf16 copy equals the original
  rounded to bf16, an FP8 copy the CPU's FP8 round trip of it), read layer by layer on the rank stream
  through its ready markers alone.
"""

from __future__ import annotations

import torch

from services.ranker.device.accelerator import Accelerator
from services.ranker.device.copier import TierCopier
from services.ranker.device.host_pool import HostPool
from services.ranker.model.kv_precision import FP8, dequantize, quantize
from services.ranker.model.prefix_kv import PrefixKV
from services.ranker.model.presets import get_preset

CUDA = torch.device("cuda")
DLRM = get_preset("gpu-dlrmv3")


def dlrm_entry(length: int, dtype: torch.dtype = DLRM.dtype, seed: int = 0) -> PrefixKV:
    """A `gpu-dlrmv3`-shaped entry of `length` tokens on the GPU."""
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    shape = (DLRM.num_layers, 2, 1, DLRM.num_heads, length, DLRM.head_dim)
    return PrefixKV(torch.randn(shape, generator=generator, device=CUDA).to(dtype))


def copier_for(accelerator: Accelerator, nbytes: int, dram_dtype: torch.dtype = DLRM.dtype) -> TierCopier:
    pool = HostPool(nbytes, accelerator.pinned(nbytes))
    return TierCopier(accelerator, DLRM.dtype, dram_dtype, pool)


def test_a_reloaded_entry_equals_the_original_bitwise():
    accelerator = Accelerator(CUDA)
    kv = dlrm_entry(length=3000, seed=1)
    copier = copier_for(accelerator, kv.nbytes())
    dram = copier.to_dram(kv)
    assert dram.buffer.is_pinned() and dram.buffer.device.type == "cpu"
    reloaded = copier.to_hbm(dram)
    assert reloaded.ready is not None and len(reloaded.ready) == DLRM.num_layers
    with accelerator.on(accelerator.rank_stream):  # read through the markers only, no host wait
        layers = [
            torch.cat([keys, values]).clone() for keys, values in map(reloaded.layer, range(kv.num_layers))
        ]
        done = accelerator.record()
    done.synchronize()
    for index, layer in enumerate(layers):
        assert torch.equal(layer, torch.cat([kv.buffer[index, 0], kv.buffer[index, 1]]))
    # The rank stream waited for every layer's copy before `done`: the slab is free at once.
    copier.release(dram, after=done)
    assert copier.pool.pending_frees() == 0 and copier.pool.used_bytes == 0


def test_a_lossy_round_trip_equals_the_original_rounded_to_bf16():
    accelerator = Accelerator(CUDA)
    kv = dlrm_entry(length=1000, dtype=torch.float32, seed=2)
    pool = HostPool(kv.nbytes(), accelerator.pinned(kv.nbytes()))
    copier = TierCopier(accelerator, torch.float32, torch.bfloat16, pool)
    dram = copier.to_dram(kv)
    assert dram.dtype == torch.bfloat16 and pool.used_bytes <= kv.nbytes() // 2 + pool.alignment
    with accelerator.on(accelerator.rank_stream):
        back = copier.to_hbm(dram).wait().buffer.clone()
        done = accelerator.record()
    done.synchronize()
    assert torch.equal(back, kv.buffer.to(torch.bfloat16).to(torch.float32))


def test_an_fp8_round_trip_equals_the_cpus_bit_for_bit():
    accelerator = Accelerator(CUDA)
    kv = dlrm_entry(length=1000, dtype=torch.float32, seed=3)
    copier = TierCopier(
        accelerator, torch.float32, FP8, HostPool(kv.nbytes(), accelerator.pinned(kv.nbytes()))
    )
    dram = copier.to_dram(kv)
    assert dram.dtype == FP8 and dram.scale.is_pinned() and dram.buffer.is_pinned()
    quantized, scale = quantize(kv.buffer.cpu())
    assert torch.equal(dram.scale, scale)
    assert torch.equal(dram.buffer.view(torch.uint8), quantized.view(torch.uint8))
    with accelerator.on(accelerator.rank_stream):
        back = copier.to_hbm(dram).wait().buffer.clone()
        done = accelerator.record()
    done.synchronize()
    assert torch.equal(back.cpu(), dequantize(quantized, scale, torch.float32))
