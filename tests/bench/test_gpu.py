"""The gpu profile: its defaults apply where no flag or variable is given, the time budget cuts a sweep
and marks it, the GPU monitor parses nvidia-smi and knows nothing on a machine without a GPU, and the
report shows a cut sweep as one."""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import sys
import time
from pathlib import Path

import grpc
import pytest

from bench import report
from bench.lib import codec, gpu_monitor
from bench.lib.config import PROFILE_DEFAULTS, PROFILE_SETTINGS, BenchConfig, load_config
from bench.lib.driving import Plan
from bench.lib.fleets import RELAY
from bench.lib.gpu_monitor import GpuMonitor, parse_smi_info, parse_smi_sample
from bench.lib.points import PointSpec, run_point
from bench.lib.schema_gpu import GpuPoint, GpuRun
from bench.lib.stats import largest_passing
from bench.lib.sweep import interleave_until_stopped
from bench.lib.workload import RevisitSampler
from bench.report import gpu as gpu_report
from bench.run.gpu import Budget, BudgetExhausted, GpuBench, headline
from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc
from services.common.config import load
from services.ranker.config import RankerConfig
from services.ranker.model.presets import get_preset
from services.trigger.config import TriggerConfig
from tests.bench.synthetic import point, point_of, sweep

HBM = common_pb2.CACHE_SOURCE_HBM


# ---- the profile's defaults ----


def test_the_gpu_profile_brings_its_defaults_where_no_flag_or_variable_is_given():
    config = load_config(["--profile", "gpu"], {})
    assert (config.name, config.results_name, config.slo_ms, config.model_preset) == (
        "gpu-fleet", "gpu-fleet", 80.0, "gpu-dlrmv3",
    )  # fmt: skip
    assert (config.rankers, config.hbm_budget_mb, config.time_budget_s, config.floor_device) == (
        1, -1.0, 330.0, "auto",
    )  # fmt: skip
    assert config.length_grid()[-1] == 16000 and config.load_grid()[-1] == 1024
    # The flag beats the variable, which beats the profile, which beats the documented default.
    env = {"RELAYGR_SLO_MS": "150", "RELAYGR_RANKERS": "2"}
    config = load_config(["--profile", "gpu", "--slo-ms", "200"], env)
    assert (config.slo_ms, config.rankers, config.warmup_s) == (200.0, 2, 2.0)
    assert load_config([], {"RELAYGR_PROFILE": "gpu"}).model_preset == "gpu-dlrmv3"


def test_the_other_profiles_keep_the_documented_defaults():
    assert load_config(["--profile", "quick"], {}) == BenchConfig()
    full = load_config(["--profile", "full"], {})
    # The CPU profiles' SLO and relay window are multiples of the host's unit u, not absolute bounds.
    assert (full.slo_ms, full.slo_u, full.relay_window_ms, full.relay_window_u) == (0.0, 2.87, 0.0, 2.87)
    assert (full.model_preset, full.time_budget_s, full.hbm_budget_mb) == ("cpu-small", 0.0, 256.0)
    assert full.in_host_unit(34.9) == dataclasses.replace(full, slo_ms=100.2, relay_window_ms=100.2)


def test_every_gpu_default_is_a_setting_and_the_longest_history_fits_the_preset():
    fields = {field.name for field in dataclasses.fields(BenchConfig)}
    assert set(PROFILE_DEFAULTS["gpu"]) <= fields
    config = load_config(["--profile", "gpu"], {})
    # The rankers get --max-short-term-events of the short-term length: prefix and short-term must fit.
    assert config.longest_long_term + config.short_term <= get_preset(config.model_preset).max_events


def test_a_gpu_point_measures_about_four_seconds_of_requests_within_its_bounds():
    gpu, quick = PROFILE_SETTINGS["gpu"], PROFILE_SETTINGS["quick"]
    assert [gpu.measured_at(rate) for rate in (4, 50, 64, 1024)] == [150, 200, 256, 300]
    assert quick.measured_at(4) == quick.measured_at(1024) == 200


def test_the_budget_counts_down_to_its_deadline_less_the_reserve():
    budget = Budget(started=100.0, seconds=330.0, reserve_s=25.0)
    assert budget.deadline == 405.0 and budget.left(now=400.0) == 5.0
    assert budget.fits(5.0, now=400.0) and not budget.fits(5.5, now=400.0)
    assert Budget(started=100.0, seconds=0.0).deadline is None
    assert Budget(started=100.0, seconds=0.0).fits(1e9, now=1e9)


# ---- the budget cuts sweeps ----


def gpu_bench(tmp_path: Path, spent_s: float = 0.0) -> GpuBench:
    config = load_config(["--profile", "gpu", "--model-preset", "cpu-tiny"], {})
    started = time.monotonic() - spent_s
    return GpuBench(config, tmp_path, lambda line: None, started, GpuMonitor(None))


def test_a_sweep_cut_by_the_budget_is_marked_with_what_it_measured_and_the_finished_one_keeps_its_answer(
    tmp_path: Path,
):
    bench = gpu_bench(tmp_path)
    grid = [1.0, 2.0, 4.0, 8.0, 16.0]
    limits = {"baseline": 2.0, "relay": 16.0}

    def measure(plan: Plan, value: float, seed_index: int, before: object) -> GpuPoint:  # one seed a load
        mode = "relay" if plan.delay_ms else "baseline"
        if mode == "relay" and value == 16.0:  # the budget's end stops this point
            return point_of(GpuPoint, value, 50.0, HBM, cut=True, gpu=None)
        return point_of(GpuPoint, value, 50.0 if value <= limits[mode] else 500.0, HBM, gpu=None)

    plans = [Plan(None, 1, 0.0), Plan(None, 1, 100.0)]  # type: ignore[arg-type]
    base, relay = bench._sweeps(grid, plans, measure, refine_steps=0)
    assert (base.best, base.cut_short, base.passed_up_to, base.failed_from) == (2.0, False, 2.0, 4.0)
    # RelayGR galloped 2, 4, then 16, where the budget's end stopped it: 8 was never measured.
    assert (relay.best, relay.cut_short, relay.passed_up_to, relay.failed_from) == (None, True, 4.0, None)
    assert relay.cut_reason == "the budget's end stopped the point at 16"
    assert [p.rate for p in relay.points] == [2.0, 4.0, 16.0]  # the cut point is kept, marked
    assert headline(base, relay) == {"ratio": None, "complete": False, "ratio_at_least": 2.0}


def test_interleaving_stops_at_the_first_exhausted_budget_and_says_which_searches_finished():
    def measure_first(index: int) -> bool:
        return index < 1

    def out_of_time(index: int) -> bool:
        raise BudgetExhausted("no time")

    searches = [(largest_passing(3, 0), measure_first), (largest_passing(3, 2), out_of_time)]
    _, finished, reason = interleave_until_stopped(searches)
    assert (finished, reason) == ([False, False], "no time")
    searches = [(largest_passing(3, 0), measure_first)]
    assert interleave_until_stopped(searches) == ([0], [True], None)


def test_a_point_that_would_end_past_the_budget_is_not_measured(tmp_path: Path):
    bench = gpu_bench(tmp_path, spent_s=1000.0)
    spec = PointSpec(
        rate=50, warmup=100, measured=200, timeout_s=2, slo_ms=80, max_error_fraction=0.001, seed=0
    )
    with pytest.raises(BudgetExhausted, match="a point at 50/s needs about 9 s, 0 s of the budget left"):
        bench.drive(None, "unused", None, spec)  # type: ignore[arg-type]


class FastStub(recommend_pb2_grpc.RecommendServiceServicer):
    async def Recommend(self, request, context):
        return recommend_pb2.RecommendResponse(cache_source=HBM, rank_latency_ms=1.0)


async def drive_until(stop_in_s: float, spec: PointSpec):
    server = grpc.aio.server()
    recommend_pb2_grpc.add_RecommendServiceServicer_to_server(FastStub(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        sampler = RevisitSampler("cut", spec.rate, 0.0, 1.0, spec.seed)
        return await run_point(f"127.0.0.1:{port}", sampler, spec, stop_at=time.monotonic() + stop_in_s)
    finally:
        await server.stop(0)


def test_a_point_stopped_at_its_stop_time_is_cut_neither_passing_nor_aborted():
    spec = PointSpec(
        rate=100, warmup=0, measured=3000, timeout_s=2, slo_ms=50, max_error_fraction=0.01, seed=0
    )
    result = asyncio.run(drive_until(0.3, spec))  # 3000 calls at 100/s would take 30 s
    assert result.cut and not result.aborted and not result.meets_slo
    assert 0 < result.measured < 3000 and result.errors == 0


# ---- the GPU monitor ----


def test_nvidia_smi_lines_parse_and_broken_ones_are_dropped():
    assert parse_smi_sample("0, 87, 1234\n", at=5.0) == (5.0, 0, 87.0, 1234.0)
    assert parse_smi_sample("0, [N/A], 1234", at=5.0) is None
    assert parse_smi_sample("", at=5.0) is None
    info = parse_smi_info("0, NVIDIA H200, 570.86.15, 143771\n1, NVIDIA H100, 570.86.15, [N/A]\n\n")
    assert info == [
        {"index": 0, "name": "NVIDIA H200", "driver": "570.86.15", "memory_total_mib": 143771.0},
        {"index": 1, "name": "NVIDIA H100", "driver": "570.86.15", "memory_total_mib": None},
    ]


def test_busy_is_the_mean_utilization_in_the_window_of_the_busiest_gpu():
    monitor = GpuMonitor("nvidia-smi")
    for at, index, utilization, used in [(0.5, 0, 100, 10), (1.0, 0, 40, 20), (1.5, 0, 80, 30),
                                         (1.0, 1, 10, 5), (2.5, 0, 100, 40)]:  # fmt: skip
        monitor.add((at, index, utilization, used))
    assert monitor.busy(1.0, 2.0) == {
        "source": "nvidia-smi", "busy": 0.6, "per_gpu": {"0": 0.6, "1": 0.1}, "samples": 3,
        "memory_used_mib_max": 30,
    }  # fmt: skip
    assert monitor.busy(3.0, 4.0)["busy"] is None


def test_without_nvml_and_nvidia_smi_the_monitor_and_the_gpu_info_know_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    monkeypatch.setattr(gpu_monitor.shutil, "which", lambda name: None)
    monitor = GpuMonitor.start()
    assert monitor.source is None and monitor.busy(0.0, 1e12) is None
    monitor.close()
    assert gpu_monitor.gpu_info() is None


# ---- the report ----


def results(relay_sweep: dict) -> GpuRun:
    config = load_config(["--profile", "gpu"], {})
    base = sweep([point(50, 50.0, HBM, gpu=None), point(64, 500.0, HBM, gpu=None)], 50, cut_short=False)
    waste = {"wasted_pre_infer_s": 0.0, "device_s": 0.0, "wasted_share": None, "pre_infer_tokens": {}}
    bench = GpuBench(config, Path("unused"), lambda line: None, 0.0, GpuMonitor(None))
    return GpuRun.from_json({
        "name": "gpu-fleet", "length_ratio": None, "throughput_ratio": None, "throughput_ratios": {},
        "started_at": "2025-01-01T00:00:00+00:00", "duration_s": 300.0,
        "machine": {"cores": 16, "cpu_model": "x", "memory_gib": 8.0, "platform": "x", "python": "3"},
        "versions": {"torch": "2", "git_commit": "abc"},
        "configuration": codec.to_json(config), "profile": codec.to_json(config.settings),
        "floor": [], "cached_rank": [], "length_sweep": None,
        "throughput_sweeps": {"m1": {"universe": "m1", "max_long_term": 8192, "baseline": base,
                                     "relay": relay_sweep, "ratio": None, **waste, "complete": False,
                                     "ratio_at_least": 1.28}},
        "modes": codec.to_json(bench.results.modes), "fleet": codec.to_json(bench.results.fleet),
        "mix_universes": codec.to_json(bench.results.mix_universes),
        "time_budget": {"seconds": 330, "reserve_s": 25.0, "used_s": 300.0,
                        "skipped": {"throughput m2": "late"}},
        "errors": [],
    })  # fmt: skip


def test_the_report_shows_a_cut_sweep_as_cut_with_its_bounds_and_no_gpu_as_unknown(tmp_path: Path):
    relay = sweep([point(64, 50.0, HBM, gpu=None), point(90, 50.0, HBM, cut=True, gpu=None)], None,
                  cut_short=True, cut_reason="out of time", passed_up_to=64, failed_from=None)  # fmt: skip
    text = gpu_report.render_markdown(results(relay))
    row = "| 50 | cut short: passes at 64 | ≥ x1.28 (RelayGR cut short) |"
    assert f"| highest SLO-compliant load, m1, req/s {row}" in text
    assert "- skipped throughput m2: late" in text
    assert "- cut short by the time budget: highest SLO-compliant load, m1, req/s, relay: out of time" in text
    assert "unknown (no GPU monitor)" in text and "cut by the budget" in text
    report.write(results(relay), tmp_path)
    assert (tmp_path / "results.json").exists() and (tmp_path / "p99_vs_load.png").exists()


def test_the_gpu_profiles_rankers_and_trigger_accept_their_flags(tmp_path: Path):
    bench = GpuBench(
        load_config(["--profile", "gpu"], {}), tmp_path, lambda line: None, 0.0, GpuMonitor(None)
    )
    fleet = bench.fleet(RELAY)
    ranker = load(RankerConfig, fleet.fleet._ranker_args("ranker-0"), environ={})
    assert (ranker.model_preset, ranker.max_long_term_events, ranker.max_short_term_events) == (
        "gpu-dlrmv3", 16000 + 256, 16,
    )  # fmt: skip
    assert (ranker.hbm_budget_mb, ranker.dram_budget_mb, ranker.pre_infer_chunk_tokens) == (-1.0, -1.0, 2048)
    assert ranker.profile_length_list() == [128, 512, 2048, 8192, 16000] and ranker.profile_repeats == 1
    trigger = load(
        TriggerConfig, ["--router", "127.0.0.1:1", *shlex.split(fleet.config.trigger_args)], environ={}
    )
    assert trigger.max_long_term_events == 16256
