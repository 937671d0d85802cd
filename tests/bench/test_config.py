"""The benchmark's settings and fleets: the grids and shares parse or are refused naming their flag, every
bench command's settings have `RELAYGR_…` twins and the services' flag names, the profiles differ only in
how much they measure, and every mode's stub and fleet get what it names."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from bench.lib.config import PROFILE_SETTINGS, BenchConfig, load_config
from bench.lib.driving import Plan, users
from bench.lib.fleets import ABLATIONS, BASELINE, RELAY, BenchFleet, FleetShape
from bench.lib.workload import mix_universe
from bench.micro.floors import FloorsConfig
from bench.micro.serving.config import ServingConfig
from bench.mlperf.config import MlperfConfig, parse
from bench.tracing.config import TracingBench
from services.common.config import listed, load
from services.retrieval_stub.config import RetrievalStubConfig


def test_the_defaults_parse_with_two_mixes_and_three_abandonment_shares_zero_included():
    config = load(BenchConfig, [], environ={})
    assert config.abandon_grid() == [0.0, 0.1, 0.3]
    assert (config.mix2_median, config.mix2_max, config.longest_long_term) == (1536, 4096, 8192 + 256)
    assert load(BenchConfig, ["--abandon-fractions", "0.2"], environ={}).abandon_grid() == [0.2]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--abandon-fractions", "0.1,0"], "--abandon-fractions: '0.1,0' must list distinct numbers in"),
        (
            ["--abandon-fractions", "0,1"],
            "'0,1' must list distinct numbers in increasing order, comma-separated, each below 1",
        ),
        (
            ["--abandon-fractions", "-0.1"],
            "'-0.1' must list distinct numbers in increasing order, comma-separated, each not negative",
        ),
        (["--abandon-fractions", ""], "--abandon-fractions: '' must list distinct numbers"),
        (
            ["--abandon-fractions", "x"],
            "--abandon-fractions: 'x' must list numbers, comma-separated: could not convert",
        ),
        (
            ["--loads", "0,2"],
            "--loads: '0,2' must list distinct numbers in increasing order, comma-separated, each positive",
        ),
        (["--revisit-probability", "1"], "--revisit-probability must be below 1"),
        (["--max-error-fraction", "0"], "--max-error-fraction must be positive"),
        (["--mix2-median", "4096"], "--mix2-median must be below --mix2-max"),
        (["--mix2-max", "0"], "--mix2-max must be positive"),
    ],
)
def test_bad_grids_shares_and_mixes_are_refused_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        load(BenchConfig, argv, environ={})
    assert message in capsys.readouterr().err


def test_list_settings_read_from_their_flag_or_their_environment_twin_and_refuse_naming_the_flag(capsys):
    assert load(BenchConfig, [], environ={"RELAYGR_LOADS": "2, 4,8"}).load_grid() == [2.0, 4.0, 8.0]
    assert load(BenchConfig, ["--loads", "3"], environ={"RELAYGR_LOADS": "2,4"}).load_grid() == [3.0]
    assert listed(load(ServingConfig, [], environ={"RELAYGR_LENGTHS": "256, 1024"}), "lengths") == [256, 1024]
    assert load(FloorsConfig, ["--rates", "0,50"], environ={}).rates == "0,50"  # 0: the closed loop
    assert load(TracingBench, ["--sample-ratios", "0.5,1"], environ={}).ratios() == [0.5, 1.0]
    with pytest.raises(SystemExit):
        load(TracingBench, ["--sample-ratios", "0.5,2"], environ={})
    assert (
        "--sample-ratios: '0.5,2' must list numbers, comma-separated, each at most 1"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        parse(["--search-modes", "relay,relay"], environ={})
    assert "--search-modes: 'relay,relay' must list distinct names" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--search-modes", "relay,other"], environ={})
    assert "each one of relay, baseline" in capsys.readouterr().err


def test_the_bench_commands_take_the_services_flag_names():
    mlperf = parse(["--model-preset", "cpu-tiny", "--relay-window-ms", "40"], environ={})
    assert (mlperf.model_preset, mlperf.relay_window_ms, mlperf.modes()) == (
        "cpu-tiny",
        40.0,
        ["baseline", "relay"],
    )
    assert parse([], environ={"RELAYGR_SEARCH": "true", "RELAYGR_RELAY_WINDOW_MS": "10"}).search is True
    bench = load(BenchConfig, [], environ={"RELAYGR_RELAY_WINDOW_MS": "50"})
    assert bench.relay_window_ms == 50.0
    assert load(TracingBench, ["--relay-window-ms", "20"], environ={}).relay_window_ms == 20.0
    names = {
        field.name for cls in (BenchConfig, MlperfConfig, TracingBench) for field in dataclasses.fields(cls)
    }
    assert "relay_window_ms" in names and not {"preprocess_delay_ms", "preset"} & names


def test_the_profiles_differ_in_how_much_they_measure():
    quick, full = PROFILE_SETTINGS["quick"], PROFILE_SETTINGS["full"]
    assert (quick.measured, quick.refine_steps, quick.seed_cap, quick.seeds) == (200, 0, 3, 1)
    assert (full.measured, full.refine_steps, full.seed_cap, full.seeds) == (1000, 2, 5, 1)


def test_the_modes_share_a_fleet_only_where_their_processes_are_the_same():
    modes = {mode.name: mode for mode in ABLATIONS}
    assert list(modes) == ["admit-all", "dram-only", "no-affinity", "no-dram", "no-revisit"]
    assert [name for name, mode in modes.items() if mode.fleet == RELAY.fleet] == ["no-revisit"]
    assert not modes["no-revisit"].revisits and all(m.revisits for n, m in modes.items() if n != "no-revisit")
    # dram-only: the baseline's stub (no Admit, no hint), but the rankers keep their DRAM tier.
    assert (modes["dram-only"].relay, modes["dram-only"].dram) == (False, True)
    assert (BASELINE.relay, BASELINE.dram) == (False, False)
    assert "--admit-all true" in modes["admit-all"].trigger_args


def shape() -> FleetShape:
    return FleetShape(
        rankers=2, model_preset="cpu-tiny", hbm_budget_mb=64, dram_budget_mb=128, slo_ms=100,
        ranker_args="--torch-threads 1", max_long_term=4096, stub_args="--rank-timeout-ms 1000",
        startup_timeout_s=60,
    )  # fmt: skip


def test_a_fleet_keys_its_stubs_by_universe_window_and_abandonment(tmp_path: Path):
    mix = mix_universe(1024, 0.75, 2048, 16, 0)
    dram_only = next(mode for mode in ABLATIONS if mode.name == "dram-only")
    fleet = BenchFleet(dram_only, shape(), mix, 100.0, tmp_path)
    assert (fleet.config.relay, fleet.config.dram_budget_mb) == (False, 128)
    own = load(RetrievalStubConfig, shlex.split(fleet.config.stub_args), environ={})
    assert (own.abandon_fraction, own.relay_window_ms, own.history_max) == (0.0, 100.0, 2048 + 16)
    extra = load(RetrievalStubConfig, fleet._stub_flags(mix, 30.0, 0.3), environ={})
    assert (extra.abandon_fraction, extra.relay_window_ms, extra.admit_timeout_ms) == (0.3, 30.0, 30.0)


def test_users_are_the_same_for_every_mode_measuring_the_same_thing_and_new_otherwise(tmp_path: Path):
    mix = mix_universe(1024, 0.75, 2048, 16, 0)
    relay = BenchFleet(RELAY, shape(), mix, 100.0, tmp_path)
    baseline = BenchFleet(BASELINE, shape(), mix, 100.0, tmp_path)
    plan = Plan(relay, 0, 100.0)
    assert users(mix, 16, plan, 0) == users(mix, 16, dataclasses.replace(plan, fleet=baseline), 0)
    names = {
        users(mix, 16, plan, 0),
        users(mix, 22.6, plan, 0),
        users(mix, 16, dataclasses.replace(plan, abandon_fraction=0.1), 0),
        users(mix, 16, dataclasses.replace(plan, revisits=False), 0),
        users(mix, 16, plan, 1),
        users(mix, 16, dataclasses.replace(plan, delay_ms=30.0), 0),
    }
    assert len(names) == 6
    assert users(mix, 16, plan, 0) == "mix-m1024-s0.75-max2048-r16-d100"


def test_a_gpu_point_measures_4_s_of_requests_within_its_bounds():
    gpu = load_config(["--profile", "gpu"], {}).settings
    # 4 s of requests at 50 calls/s; at least 150, at most 300.
    assert [gpu.measured_at(rate) for rate in (50, 10, 100)] == [200, 150, 300]
    assert load_config(["--profile", "full"], {}).settings.measured_at(1) == 1000
