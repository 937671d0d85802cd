"""The byte budgets of the cache tiers when `--hbm-budget-mb` / `--dram-budget-mb` are -1 (auto).

A preset made for the CPU (`hbm_share` 0), and any preset on a CPU device, gets its fixed budgets
(`fixed_hbm_budget_mb`, `fixed_dram_budget_mb`: 256 and 1024 MiB). A preset made for an accelerator gets
budgets derived from the machine it runs on, by `default_budgets`, for K rankers that share the device
(`--device-sharers`, 1 by default), each with its own weights and working set:

    reserve = query_tokens x max_positions x num_heads x 4 B   (the largest attention-weight block)
            + max_positions x kv_bytes_per_token               (one prefix held outside the tiers)
            + WORKING_SET_MARGIN_BYTES                         (library workspaces, allocator slack)
    room    = min((device total - K x (weights + reserve)) / K, device free - reserve)
    HBM     = hbm_share x room
    DRAM    = min(dram_host_share x host memory / K, dram_hbm_ratio x HBM)

With K = 1 the room is what the device leaves beside the model and the largest request. With K > 1 it is
each ranker's equal share of what the K models and working sets leave, so the K rankers of one device
together hold what one ranker alone would (less the others' weights and working sets), whether the others
had loaded their weights, or filled their tiers, when this one read the free memory or not: a ranker
restarted among K running ones gets its share again. The free memory still caps it, for memory that
something else holds. A CPU device's fixed budgets are divided by K alike.

`query_tokens` is the most tokens one attention block puts against a prefix: a pre-inference chunk, or
the short-term events and one candidate microbatch together (a batched Rank attends with both at once).
The block is [heads, queries, keys]; 4 bytes per weight bound the preset's dtype plus the boolean mask.
Device free memory is measured with the model already on the device, so the weights are not counted
twice. The share left outside the HBM tier (0.4 for gpu-dlrmv3) absorbs the caching allocator's
fragmentation: prefixes of every length come and go. Host memory is the smaller of /proc/meminfo's
MemTotal and the container's cgroup memory limit, so a pod's DRAM tier is sized to its own limit, not to
the node. Both budgets are rounded down to whole MiB.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from services.ranker.config import RankerConfig
from services.ranker.device.accelerator import backend
from services.ranker.model.presets import ModelPreset

log = logging.getLogger("services.ranker")
MIB = 1024 * 1024
AUTO = -1.0
WORKING_SET_MARGIN_BYTES = 1024 * MIB
ATTENTION_WEIGHT_BYTES = 4
MEMINFO = Path("/proc/meminfo")
# cgroup v2, then v1: the container's memory limit ("max" or a huge number when unlimited).
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


@dataclasses.dataclass(frozen=True)
class Budgets:
    """Byte budgets of the HBM and DRAM tiers."""

    hbm_bytes: int
    dram_bytes: int


def _whole_mib(nbytes: float) -> int:
    return max(0, math.floor(nbytes / MIB)) * MIB


def query_tokens(config: RankerConfig) -> int:
    """Most tokens one attention block of a request puts against a prefix: a pre-inference chunk, or the
    short-term events with the candidates of one microbatch (all of them when not microbatched)."""
    candidates = min(config.candidate_microbatch or config.max_candidates, config.max_candidates)
    return max(config.pre_infer_chunk_tokens, config.max_short_term_events + candidates)


def working_set_bytes(preset: ModelPreset, query_tokens: int) -> int:
    """Device memory the largest request needs beyond the tiers: its largest attention-weight block, one
    prefix of the longest length held outside the tiers (an uncached Rank's), and a fixed margin."""
    attention = query_tokens * preset.max_positions * preset.num_heads * ATTENTION_WEIGHT_BYTES
    return attention + preset.max_positions * preset.kv_bytes_per_token + WORKING_SET_MARGIN_BYTES


def default_budgets(
    preset: ModelPreset,
    device_total_bytes: int,
    device_free_bytes: int,
    host_total_bytes: int,
    weights_bytes: int,
    query_tokens: int,
    sharers: int = 1,
) -> Budgets:
    """The auto budgets of an accelerator preset on a device with this much memory (free measured with the
    model loaded) and a host with this much, for one of `sharers` rankers on the device: the formula of
    the module docstring. Pure, so it is tested with the figures of real machines."""
    if preset.hbm_share == 0:
        return fixed_budgets(preset, sharers)
    reserve = working_set_bytes(preset, query_tokens)
    share = (device_total_bytes - sharers * (weights_bytes + reserve)) / sharers
    room = min(share, device_free_bytes - reserve)
    hbm = _whole_mib(preset.hbm_share * room)
    dram = _whole_mib(min(preset.dram_host_share * host_total_bytes / sharers, preset.dram_hbm_ratio * hbm))
    return Budgets(hbm, dram)


def fixed_budgets(preset: ModelPreset, sharers: int = 1) -> Budgets:
    """The preset's fixed budgets, shared by `sharers` rankers: what auto means on a CPU device or for a
    CPU preset."""
    return Budgets(
        _whole_mib(preset.fixed_hbm_budget_mb * MIB / sharers),
        _whole_mib(preset.fixed_dram_budget_mb * MIB / sharers),
    )


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers: its weights on the device."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of an accelerator's memory, from its backend (`torch.cuda` or `torch.npu`)."""
    module = backend(device)
    if module is None or not hasattr(module, "mem_get_info"):
        raise ValueError(
            f"cannot read the memory of device {device}: set --hbm-budget-mb and --dram-budget-mb explicitly"
        )
    free, total = module.mem_get_info(device)
    return int(free), int(total)


def host_memory_bytes(meminfo: Path = MEMINFO, cgroup_limits: Sequence[Path] = CGROUP_LIMITS) -> int:
    """The host memory this process may use: MemTotal, or the container's cgroup limit where lower."""
    total = None
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024  # reported in kB
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in cgroup_limits:
        if path.exists():
            text = path.read_text().strip()
            if text.isdigit():
                total = min(total, int(text))
            break
    return total


def resolve_budgets(
    config: RankerConfig,
    device: torch.device,
    weights_bytes: int,
    read_device: Callable[[torch.device], tuple[int, int]] = device_memory,
    read_host: Callable[[], int] = host_memory_bytes,
) -> Budgets:
    """The tiers' budgets: each flag's value, or where it is -1 the auto budget (device memory read with
    the model already on `device`). Logged, since auto budgets depend on the machine."""
    preset = config.model_config()
    explicit = [config.hbm_budget_mb, config.dram_budget_mb]
    if AUTO not in explicit:
        auto = None
    elif device.type == "cpu" or preset.hbm_share == 0:
        auto = fixed_budgets(preset, config.device_sharers)
    else:
        free, total = read_device(device)
        auto = default_budgets(
            preset, total, free, read_host(), weights_bytes, query_tokens(config), config.device_sharers
        )
        if auto.hbm_bytes == 0:
            log.warning(
                "device %s has %.0f of %.0f MiB free: too little for an auto HBM tier beside the model and "
                "the largest request; prefixes are not cached in HBM (set --hbm-budget-mb to override)",
                device, free / MIB, total / MIB,
            )  # fmt: skip
    hbm = auto.hbm_bytes if config.hbm_budget_mb == AUTO else int(config.hbm_budget_mb * MIB)
    dram = auto.dram_bytes if config.dram_budget_mb == AUTO else int(config.dram_budget_mb * MIB)
    log.info(
        "tier budgets: HBM %.0f MiB (%s), DRAM %.0f MiB (%s); model weights %.0f MiB on %s, shared by %d "
        "ranker(s)",
        hbm / MIB, "auto" if config.hbm_budget_mb == AUTO else "--hbm-budget-mb",
        dram / MIB, "auto" if config.dram_budget_mb == AUTO else "--dram-budget-mb",
        weights_bytes / MIB, device, config.device_sharers,
    )  # fmt: skip
    return Budgets(hbm, dram)
