"""Auto tier budgets (`--hbm-budget-mb -1`, `--dram-budget-mb -1`): the formula against real machines' memory,
the fixed budgets on CPU through a built ranker, explicit overrides and refused values."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys

import pytest
import torch
from prometheus_client import REGISTRY

from services.common.config import load
from services.launcher.fleet import Fleet, FleetConfig
from services.ranker.app import RankerApp
from services.ranker.budgets import (
    WORKING_SET_MARGIN_BYTES,
    Budgets,
    default_budgets,
    host_memory_bytes,
    parameter_bytes,
    query_tokens,
    resolve_budgets,
    working_set_bytes,
)
from services.ranker.config import RankerConfig
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import PRESETS, get_preset
from tests.ranker.harness import BASE

MIB = 1024 * 1024
GPU = get_preset("gpu-dlrmv3")
# gpu-dlrmv3's parameters in bf16 (item embedding 100003 x 512 and the rest), measured by parameter_bytes.
GPU_WEIGHTS = 132_881_414
DEFAULT_QUERY_TOKENS = 1536  # the default 512 short-term events and 1024 candidates, in one block
RESERVE = working_set_bytes(GPU, DEFAULT_QUERY_TOKENS)


def test_the_working_set_is_the_largest_attention_block_one_prefix_and_the_margin():
    # 1536 queries x 16384 keys x 4 heads x 4 B = 384 MiB; a 16384-token prefix at 10 KiB a token = 160 MiB.
    assert GPU.kv_bytes_per_token == 10 * 1024
    assert RESERVE == 384 * MIB + 160 * MIB + WORKING_SET_MARGIN_BYTES == 1568 * MIB
    assert query_tokens(RankerConfig()) == DEFAULT_QUERY_TOKENS
    assert query_tokens(RankerConfig(candidate_microbatch=64)) == 512 + 64


def test_gpu_preset_weights_are_what_the_built_model_holds():
    model = HSTURanker(GPU).to(dtype=GPU.dtype)
    assert parameter_bytes(model) == GPU_WEIGHTS


def test_an_80_gb_h100_in_a_40_gib_pod():
    """nvidia-smi's 81559 MiB; 660 MiB taken by the CUDA context and the weights when free is read."""
    total, free, host = 81559 * MIB, 80899 * MIB, 40 * 1024 * MIB
    budgets = default_budgets(GPU, total, free, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS)
    # 0.6 x (80899 - 1568) MiB = 47598.6 -> 47598; DRAM 0.25 x 40 GiB = 10240 MiB (under 4 x HBM).
    assert budgets == Budgets(47598 * MIB, 10240 * MIB)
    assert budgets.hbm_bytes + GPU_WEIGHTS + RESERVE <= total
    # An 8192-event prefix is 80 MiB: the tier holds hundreds of them.
    assert budgets.hbm_bytes // (8192 * GPU.kv_bytes_per_token) == 594


def test_a_64_gb_ascend_910b_on_a_large_host_caps_dram_at_four_times_hbm():
    total, free, host = 65536 * MIB, 61440 * MIB, 1536 * 1024 * MIB
    budgets = default_budgets(GPU, total, free, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS)
    # 0.6 x (61440 - 1568) = 35923.2 -> 35923 MiB; DRAM min(0.25 x 1.5 TiB, 4 x 35923 MiB) = 143692 MiB.
    assert budgets == Budgets(35923 * MIB, 143692 * MIB)
    assert budgets.hbm_bytes + GPU_WEIGHTS + RESERVE <= total


def test_weights_are_subtracted_once_whether_free_was_read_before_or_after_loading():
    total = 65536 * MIB
    before = default_budgets(GPU, total, total, 64 * 1024 * MIB, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS)
    after = default_budgets(
        GPU, total, total - GPU_WEIGHTS, 64 * 1024 * MIB, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS
    )
    assert before == after
    assert before.hbm_bytes == int(0.6 * (total - GPU_WEIGHTS - RESERVE)) // MIB * MIB


@pytest.mark.parametrize("sharers", [2, 4])
def test_k_rankers_sharing_an_h200_hold_together_what_one_would_and_each_its_own_weights(sharers):
    """nvidia-smi's 143771 MiB; the budgets alike whether the others had loaded their weights, or filled
    their tiers, when this one read the free memory or not (a ranker restarted among K running ones gets its
    share again), and K budgets, weights and working sets fit the device."""
    total, host = 143771 * MIB, 2048 * 1024 * MIB
    alone = default_budgets(GPU, total, total - GPU_WEIGHTS, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS)
    first = default_budgets(GPU, total, total - GPU_WEIGHTS, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS, sharers)
    last = default_budgets(
        GPU, total, total - sharers * GPU_WEIGHTS, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS, sharers
    )
    others_full = total - sharers * GPU_WEIGHTS - (sharers - 1) * (first.hbm_bytes + RESERVE)
    restarted = default_budgets(GPU, total, others_full, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS, sharers)
    assert first == last == restarted
    assert sharers * (first.hbm_bytes + GPU_WEIGHTS + RESERVE) <= total
    # What K hold is what one holds less the other K - 1 weights and working sets, to a MiB each.
    others = (sharers - 1) * (GPU_WEIGHTS + RESERVE)
    assert alone.hbm_bytes - 0.6 * others - sharers * MIB <= sharers * first.hbm_bytes <= alone.hbm_bytes
    # DRAM: 4 x each one's HBM here (the host's quarter is larger), so 1/K of one ranker's too, to a MiB.
    assert first.dram_bytes == 4 * first.hbm_bytes
    assert sharers * first.dram_bytes <= alone.dram_bytes


def test_k_rankers_sharing_a_host_take_its_dram_share_together():
    total, host = 81559 * MIB, 40 * 1024 * MIB
    budgets = default_budgets(GPU, total, total - GPU_WEIGHTS, host, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS, 4)
    assert budgets.dram_bytes == 2560 * MIB  # 0.25 x 40 GiB / 4, under 4 x the HBM share


def test_a_device_too_small_for_the_working_set_gets_no_hbm_tier():
    small = default_budgets(GPU, 2048 * MIB, 1800 * MIB, 8192 * MIB, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS)
    assert small == Budgets(139 * MIB, 556 * MIB)  # 0.6 x (1800 - 1568); DRAM 4 x HBM < 2048
    tiny = default_budgets(GPU, 1024 * MIB, 900 * MIB, 8192 * MIB, GPU_WEIGHTS, DEFAULT_QUERY_TOKENS)
    assert tiny == Budgets(0, 0)


@pytest.mark.parametrize("name", ["cpu-tiny", "cpu-small"])
def test_cpu_presets_keep_their_fixed_budgets_on_any_machine(name):
    budgets = default_budgets(PRESETS[name], 81559 * MIB, 80000 * MIB, 2**40, 10**6, DEFAULT_QUERY_TOKENS)
    assert budgets == Budgets(256 * MIB, 1024 * MIB)


def test_budget_fields_do_not_change_the_model_version():
    assert dataclasses.replace(GPU, hbm_share=0.3, fixed_dram_budget_mb=7).version == GPU.version
    assert dataclasses.replace(GPU, seed=1).version != GPU.version


def test_host_memory_is_the_containers_limit_where_lower(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263842672 kB\nMemFree:        1000 kB\n")
    limit, unlimited = tmp_path / "memory.max", tmp_path / "unlimited"
    limit.write_text(f"{40 * 1024**3}\n")
    unlimited.write_text("max\n")
    assert host_memory_bytes(meminfo, [limit]) == 40 * 1024**3
    assert host_memory_bytes(meminfo, [unlimited]) == 263842672 * 1024
    assert host_memory_bytes(meminfo, [tmp_path / "absent"]) == 263842672 * 1024


def h100(device: torch.device) -> tuple[int, int]:
    assert device.type == "cuda"
    return 80899 * MIB, 81559 * MIB


def test_auto_on_an_accelerator_reads_its_memory_and_an_explicit_flag_overrides_one_tier(caplog):
    config = RankerConfig(model_preset="gpu-dlrmv3")
    with caplog.at_level(logging.INFO, logger="services.ranker"):
        auto = resolve_budgets(config, torch.device("cuda"), GPU_WEIGHTS, h100, lambda: 40 * 1024 * MIB)
    assert auto == Budgets(47598 * MIB, 10240 * MIB)
    assert "HBM 47598 MiB (auto), DRAM 10240 MiB (auto)" in caplog.text
    pinned = dataclasses.replace(config, hbm_budget_mb=1000)
    assert resolve_budgets(
        pinned, torch.device("cuda"), GPU_WEIGHTS, h100, lambda: 40 * 1024 * MIB
    ) == Budgets(1000 * MIB, 10240 * MIB)


def test_gpu_preset_on_a_cpu_device_gets_the_fixed_budgets_without_reading_memory():
    def unread(device: torch.device) -> tuple[int, int]:
        raise AssertionError("a CPU device's budgets are fixed")

    config = RankerConfig(model_preset="gpu-dlrmv3")
    assert resolve_budgets(config, torch.device("cpu"), GPU_WEIGHTS, unread) == Budgets(256 * MIB, 1024 * MIB)
    shared = dataclasses.replace(config, device_sharers=4)
    assert resolve_budgets(shared, torch.device("cpu"), GPU_WEIGHTS, unread) == Budgets(64 * MIB, 256 * MIB)


def test_a_shared_accelerators_auto_budgets_are_the_rankers_share_and_explicit_ones_its_own(caplog):
    config = RankerConfig(model_preset="gpu-dlrmv3", device_sharers=2)
    with caplog.at_level(logging.INFO, logger="services.ranker"):
        auto = resolve_budgets(config, torch.device("cuda"), GPU_WEIGHTS, h100, lambda: 40 * 1024 * MIB)
    # 0.6 x (81559 - 2 x (126.7 + 1568)) / 2 MiB = 23450.9 -> 23450; DRAM 0.25 x 40 GiB / 2 = 5120 MiB.
    assert auto == Budgets(23450 * MIB, 5120 * MIB)
    assert "on cuda, shared by 2 ranker(s)" in caplog.text
    pinned = dataclasses.replace(config, hbm_budget_mb=1000, dram_budget_mb=3000)
    assert resolve_budgets(
        pinned, torch.device("cuda"), GPU_WEIGHTS, h100, lambda: 40 * 1024 * MIB
    ) == Budgets(1000 * MIB, 3000 * MIB)


def built_tiers(**overrides) -> tuple[int, int, float, float]:
    """The budgets of a ranker built in-process, and its capacity gauges."""

    async def build() -> tuple[int, int, float, float]:
        app = RankerApp(dataclasses.replace(BASE, device="cpu", **overrides))
        try:
            gauge = [
                REGISTRY.get_sample_value("relaygr_kv_cache_capacity_bytes", {"tier": t})
                for t in ("hbm", "dram")
            ]
            return app.cache.hbm.budget_bytes, app.cache.dram.budget_bytes, *gauge
        finally:
            await app.close()

    return asyncio.run(build())


@pytest.mark.parametrize("name", ["cpu-tiny", "cpu-small"])
def test_a_cpu_ranker_left_on_auto_gets_256_and_1024_mib(name):
    assert (BASE.hbm_budget_mb, BASE.dram_budget_mb) == (-1, -1)
    assert built_tiers(model_preset=name) == (256 * MIB, 1024 * MIB, 256 * MIB, 1024 * MIB)


def test_explicit_budgets_override_auto_and_zero_disables_dram():
    assert built_tiers(hbm_budget_mb=3, dram_budget_mb=0) == (3 * MIB, 0, 3 * MIB, 0)
    assert built_tiers(hbm_budget_mb=0.5)[:2] == (MIB // 2, 1024 * MIB)


@pytest.mark.parametrize("flag", ["--hbm-budget-mb", "--dram-budget-mb"])
@pytest.mark.parametrize("value", ["-2", "-0.5", "nan"])
def test_negative_budgets_other_than_auto_are_refused_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit):
        load(RankerConfig, [flag, value], {})
    assert f"{flag} must be -1 (auto) or not negative" in capsys.readouterr().err
    field = flag.removeprefix("--").replace("-", "_")
    with pytest.raises(ValueError, match=f"{flag} must be -1"):
        dataclasses.replace(RankerConfig(), **{field: float(value)}).validate()
    assert getattr(load(RankerConfig, [flag, "-1"], {}), field) == -1


def test_help_documents_the_auto_default():
    result = subprocess.run(
        [sys.executable, "-m", "services.ranker", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    text = " ".join(result.stdout.split())
    assert "-1: auto, from the preset and the device's memory" in text
    assert "-1: auto, from the preset and the host's memory" in text
    assert text.count("(default: -1.0)") == 2


def test_the_local_fleets_rankers_get_the_cpu_budgets_from_its_defaults(tmp_path):
    """The launcher leaves the budgets unset; each CPU ranker resolves its own default (-1: auto) itself."""
    fleet = Fleet(FleetConfig(log_dir=str(tmp_path)))
    args = fleet._ranker_args("ranker-0")
    assert "--hbm-budget-mb" not in args and "--dram-budget-mb" not in args
    config = load(RankerConfig, [*args, "--device", "cpu"], {})
    assert (config.hbm_budget_mb, config.dram_budget_mb) == (-1, -1)
    assert resolve_budgets(config, torch.device("cpu"), 0) == Budgets(256 * MIB, 1024 * MIB)
