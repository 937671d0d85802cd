"""`python -m bench accelerator`'s settings, each a flag with a `RELAYGR_…` environment twin: which measures
run (`--measures`), the device path's (`device`) and the DRAM precisions' error table's (`--dram-…`)."""

from __future__ import annotations

import dataclasses

from services.common.config import grid, numbers, setting
from services.ranker.model.presets import PRESETS

# What --measures may name: the device path on --device (`device`), and the DRAM precisions' error on CPU.
MEASURES = ("device", "dram-precision")


@dataclasses.dataclass(frozen=True)
class AcceleratorBenchConfig:
    measures: str = setting(
        "device",
        "what runs, in this order, comma-separated: device (the device path on --device, written to --out) "
        "and dram-precision (each DRAM precision's score error on CPU, printed)",
        items=str,
        choices=MEASURES,
        distinct=True,
    )
    device: str = setting("cuda", "device to measure: cuda, npu, cpu (optionally with an index)")
    model_preset: str = setting("gpu-dlrmv3", f"model preset: {', '.join(PRESETS)}", choices=PRESETS)
    lengths: str = grid("512,1024,2048,4096,8192", "prefix lengths measured", int)
    short_term: int = setting(32, "short-term events of each rank", above=0)
    candidates: int = setting(512, "candidates of each rank", above=0)
    repeats: int = setting(50, "timed repetitions per point (after 3 untimed ones)", above=0)
    batch: int = setting(8, "users ranked together in the batched measurement", above=0)
    chunk_tokens: int = setting(512, "pre-inference chunk size", above=0)
    out: str = setting("bench/results/gpu-accelerator", "directory the device path's results are written to")
    dram_users: int = setting(4, "dram-precision: users ranked per history length", above=0)
    dram_lengths: str = numbers("64,256,1024", "dram-precision: history lengths of the users, in events", int)
    dram_short_term: int = setting(4, "dram-precision: short-term events of each Rank", minimum=0)
    dram_candidates: int = setting(16, "dram-precision: candidates of each Rank", above=0)
    dram_seed: int = setting(0, "dram-precision: seed of the weights and of the users' events", minimum=0)
