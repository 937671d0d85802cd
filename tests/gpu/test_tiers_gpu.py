"""Tier copies on a CUDA GPU (`make test-gpu`; skipped without one, see conftest.py).

- A DRAM -> HBM reload of a `gpu-dlrmv3`-sized entry, one copy per layer from the pinned pool on the copy
  stream, reaches at least 0.8 of the pinned host-to-device peak measured on the same machine.
- A demoted and reloaded entry equals the original bitwise (and a lossy bf16 copy equals the original
  rounded to bf16), read layer by layer on the rank stream through its ready markers alone.
"""

from __future__ import annotations

import torch

from services.ranker.copier import TierCopier
from services.ranker.device import Accelerator
from services.ranker.host_pool import HostPool
from services.ranker.model import PrefixKV
from services.ranker.presets import get_preset

CUDA = torch.device("cuda")
DLRM = get_preset("gpu-dlrmv3")
MIB = 1024 * 1024
REPEATS = 5


def dlrm_entry(length: int, dtype: torch.dtype = DLRM.dtype, seed: int = 0) -> PrefixKV:
    """A `gpu-dlrmv3`-shaped entry of `length` tokens on the GPU."""
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    shape = (DLRM.num_layers, 2, 1, DLRM.num_heads, length, DLRM.head_dim)
    return PrefixKV(torch.randn(shape, generator=generator, device=CUDA).to(dtype))


def copier_for(accelerator: Accelerator, nbytes: int, dram_dtype: torch.dtype = DLRM.dtype) -> TierCopier:
    pool = HostPool(nbytes, accelerator.pinned(nbytes))
    return TierCopier(accelerator, DLRM.dtype, dram_dtype, pool)


def timed_ms(accelerator: Accelerator, stream, work) -> float:
    """Device milliseconds of `work()` queued on `stream`, between two events recorded there."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with accelerator.on(stream):
        start.record(stream)
        work()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def pinned_h2d_peak(accelerator: Accelerator, nbytes: int) -> float:
    """Bytes per second of the best of several single pinned host-to-device copies of `nbytes`."""
    host = accelerator.pinned(nbytes)
    device = torch.empty(nbytes, dtype=torch.uint8, device=CUDA)
    best = min(
        timed_ms(accelerator, accelerator.copy_stream, lambda: device.copy_(host, non_blocking=True))
        for _ in range(REPEATS)
    )
    return nbytes / (best / 1000)


def test_a_reload_reaches_the_pinned_host_to_device_peak():
    accelerator = Accelerator(CUDA)
    kv = dlrm_entry(
        length=8192 * 4
    )  # 320 MiB in bf16 (10 KiB a token): long enough that launch costs do not count
    copier = copier_for(accelerator, kv.nbytes())
    dram = copier.to_dram(kv)
    peak = pinned_h2d_peak(accelerator, kv.nbytes())
    reloads = [
        timed_ms(accelerator, accelerator.copy_stream, lambda: copier.to_hbm(dram)) for _ in range(REPEATS)
    ]
    bandwidth = kv.nbytes() / (min(reloads) / 1000)
    print(
        f"reload of {kv.nbytes() / MIB:.0f} MiB: {bandwidth / 1e9:.2f} GB/s, "
        f"pinned H2D peak {peak / 1e9:.2f} GB/s"
    )
    assert bandwidth >= 0.8 * peak, f"reload at {bandwidth / peak:.2f} of the pinned H2D peak"


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
