"""The block experiment (`python -m bench headline`) over fake fleets whose latencies are known
(tests/bench/headline/fakes.py): the calibration, the orders, no early stop, the slowdown rule and its
top-ups, the budget, the analysis and the files it writes."""

from __future__ import annotations

import collections
import dataclasses
import math

import pytest

from bench.headline.compare import compare
from bench.headline.config import LOAD_PER_U, HeadlineConfig, load_rate
from bench.headline.schema import HeadlineResults, analyse
from bench.lib import envelope, orders
from services.common.config import load
from tests.bench.headline.fakes import ARGS, CANARY_MS, U_MS, fake_results, run_bench

ARMS = ["baseline@1L", "relay@1L", "relay@2L", "relay@3L", "relay@3.5L", "relay@4L", "admit-all@3L"]


def test_the_calibration_fixes_u_as_a_median_and_l_the_slo_and_the_window_in_it(fast):
    bench = run_bench(["--blocks", "14"])
    cal = bench.calibration
    assert cal.unit_timings_ms == [U_MS - 1.0, U_MS, U_MS + 5.0] and cal.u_ms == U_MS  # the median, not 69
    assert cal.rate == load_rate(U_MS) == round(LOAD_PER_U * 1000 / U_MS, 3) == 10.0
    assert (cal.slo_ms, cal.relay_window_ms) == (round(2.87 * U_MS, 1), round(2.87 * U_MS, 1))
    assert cal.canary_reference_ms == CANARY_MS
    # Every fleet, once all are up, gets 30 s at L (300 Recommends) before the first block, in no trial.
    assert bench.driven[:3] == [(mode, 10.0, 300, 0) for mode in ("baseline", "relay", "admit-all")]
    assert len(bench.driven) == 3 + len(bench.trials)
    # The fleets start with the bounds in ms, and every trial runs at its multiple of L.
    assert bench.driver.config.slo_ms == cal.slo_ms
    assert {(trial.arm, trial.rate) for trial in bench.trials} == {
        (arm, round(float(arm.split("@")[1][:-1]) * cal.rate, 3)) for arm in ARMS
    }


def test_every_block_runs_every_arm_once_in_its_williams_order_and_no_trial_stops_early(fast):
    bench = run_bench(["--blocks", "14", "--order-seed", "5"])
    design = orders.block_orders(ARMS, 14, 5)
    assert bench.design == design and [block.order for block in bench.blocks] == design
    assert orders.is_balanced(design)
    by_block = collections.defaultdict(list)
    for trial in bench.trials:
        by_block[trial.block].append(trial.arm)
    assert [by_block[b] for b in range(14)] == design
    # Every trial sent its warm-up and its whole count, each arm the same seed in a block; the baseline's
    # every 50th Rank over the SLO stopped nothing.
    for (mode, rate, total, seed), trial in zip(bench.driven[3:], bench.trials, strict=True):
        count = 60 if mode == "baseline" else 40
        assert total == round(rate * 1.0) + count and len(trial.rank_ms) == count
        assert seed == trial.block and trial.warmup == round(rate * 1.0)
    baseline = [trial for trial in bench.trials if trial.mode == "baseline"]
    assert all(len(trial.over) == 1 and trial.over[0].rank_ms == 240.0 for trial in baseline)


def test_a_block_on_a_slow_host_is_left_out_and_topped_up_with_its_order(fast):
    """The canary reads the host 30 % slow in block 3: its slowdown is 1.3, over 1.15; the run tops up
    with a block of block 3's order on the next seed, which the analysis keeps instead."""
    bench = run_bench(["--blocks", "14"], slow=lambda block: 1.3 if block == 3 else 1.0)
    assert [block.kept for block in bench.blocks] == [True] * 3 + [False] + [True] * 11
    assert [round(block.slowdown, 2) for block in bench.blocks][3] == 1.3
    top_up = bench.blocks[-1]
    assert (top_up.index, top_up.seed, top_up.topped_up_for, top_up.order) == (
        14,
        14,
        3,
        bench.blocks[3].order,
    )


def test_each_block_loads_and_judges_the_host_at_the_u_it_times_first(fast):
    """The host runs 25 % slower through blocks 0-4, their u timings included: each of those blocks times
    u = 87.5 ms, runs its arms at multiples of L = 0.7 / 87.5 ms = 8 req/s and judges its Ranks against
    2.87 u = 251.1 ms, and is kept (s = 1: the host kept the speed its loads were set for). Pooled in each
    block's u, the baseline's P99 is its 240 ms at 70 ms, not the slow blocks' 300 ms; in ms at the
    calibration's SLO, 248 ms Ranks of a slow block would count as over it."""
    slow_blocks = range(5)
    bench = run_bench(["--blocks", "14"], speed=lambda block: 1.25 if block in slow_blocks else 1.0)
    assert bench.calibration.u_ms == U_MS and all(block.kept for block in bench.blocks)
    for block in bench.blocks:
        u = 1.25 * U_MS if block.index in slow_blocks else U_MS
        assert block.unit_timings_ms == [u * 69 / 70, u, u * 75 / 70]
        assert (block.u_ms, block.rate, block.slo_ms) == (u, load_rate(u), round(2.87 * u, 1))
        assert block.slowdown == 1.0
    assert {(t.block, t.arm, t.rate) for t in bench.trials} == {
        (t.block, t.arm, round(t.multiple * bench.blocks[t.block].rate, 3)) for t in bench.trials
    } and {t.rate for t in bench.trials if t.arm == "relay@4L"} == {32.0, 40.0}
    # The baseline's every 50th Rank, 240 ms at speed 1 and 300 at 1.25, is over its block's SLO; nothing
    # else is, though the slow blocks' baseline reaches 248.75 ms (over the calibration's 200.9 ms).
    baseline = [t for t in bench.trials if t.mode == "baseline"]
    assert max(ms for t in baseline if t.block in slow_blocks for ms in t.rank_ms) == 300.0
    assert all([o.rank_ms for o in t.over] == [300.0 if t.block in slow_blocks else 240.0] for t in baseline)
    config = load(HeadlineConfig, [*ARGS, "--blocks", "14"])
    kept = analyse(bench.blocks, bench.trials, bench.calibration, config, kept_only=True)
    base = next(arm for arm in kept.arms if arm.mode == "baseline")
    assert (base.p99_ms, base.p99_u, base.over, base.rate) == (240.0, round(240 / U_MS, 3), 14, 10.0)
    steps = {step.multiple: step for step in kept.steps}
    assert steps[4.0].ratio.value == pytest.approx((25 * 4 + 9) / 240, abs=1e-4)
    assert steps[4.0].ratio.low == steps[4.0].ratio.high == steps[4.0].ratio.value


def test_a_block_beside_a_busy_process_is_left_out_whatever_the_canary_says(fast):
    """A niced process took 0.6 cores during block 5's trials: the canary, reading the drained host,
    yields s = 1, but the block is left out for its neighbour and topped up with its order."""
    bench = run_bench(["--blocks", "14"], busy=lambda block: 0.6 if block == 5 else 0.1)
    assert [block.kept for block in bench.blocks] == [True] * 5 + [False] + [True] * 9
    assert (bench.blocks[5].slowdown, bench.blocks[5].foreign_cores) == (1.0, 0.6)
    assert {trial.foreign_cores for trial in bench.trials if trial.block == 5} == {0.6}
    assert (bench.blocks[-1].topped_up_for, bench.blocks[-1].order) == (5, bench.blocks[5].order)
    loose = run_bench(["--blocks", "14", "--foreign-limit", "0.7"], busy=lambda block: 0.6)
    assert all(block.kept for block in loose.blocks) and len(loose.blocks) == 14


def test_no_block_starts_past_the_budget(fast):
    bench = run_bench(["--blocks", "14", "--budget-min", "1e-12"])
    assert len(bench.blocks) == 1 and len(bench.trials) == len(ARMS)


def test_the_command_writes_its_results_analysis_and_report_and_reads_back_byte_for_byte(fast):
    results = fake_results("h", ["--blocks", "14"], slow=lambda block: 1.3 if block == 2 else 1.0)
    path = fast / "h" / "results.json"
    assert envelope.dumps(envelope.wrap("headline", HeadlineResults.read(path).to_json())) == path.read_text()
    kept, every = results.kept, results.every
    assert kept.blocks == [0, 1, *range(3, 15)] and every.blocks == list(range(15)) and kept.balanced
    # RelayGR at kL is 25 k ms + 0-9 ms: its pooled P99 is 25 k + 9; the baseline's is 240 ms (every 50th).
    base = next(arm for arm in kept.arms if arm.mode == "baseline")
    assert base.p99_ms == 240.0 and base.over == 14 and base.ranks == 14 * 60 and not base.meets_slo
    steps = {step.multiple: step for step in kept.steps}
    assert steps[4.0].ratio.value == pytest.approx((25 * 4 + 9) / 240, abs=1e-4)
    assert steps[4.0].ratio.low == steps[4.0].ratio.high == steps[4.0].ratio.value  # the same in every block
    # Every multiple's upper bound is below 1 and no RelayGR Rank is over the SLO: all claimed, up to 4.
    assert kept.claimed == 4.0 and all(step.passed for step in kept.steps)
    assert kept.against_admit_all["3"].value == pytest.approx((75 + 9) / (90 + 9), abs=1e-4)
    report = (fast / "h" / "report.md").read_text()
    assert "**RelayGR carries 4x the baseline's load at no worse P99**" in report
    assert (fast / "h" / "p99-by-load.png").stat().st_size > 1000
    assert "| 2 | 2 |" in report and "| 14 | 14 |" in report and "left out" in report


def test_two_runs_of_one_code_that_agree_reproduce_and_a_different_claim_does_not(fast):
    # Two runs of one clean commit, the second an hour after the first.
    first = dataclasses.replace(
        fake_results("a", ["--blocks", "14"]),
        commit="abc1234",
        started_at="2026-01-01T00:00:00+00:00",
        duration_s=3000.0,
    )
    second = dataclasses.replace(
        fake_results("b", ["--blocks", "14"]),
        commit="abc1234",
        started_at="2026-01-01T01:00:00+00:00",
        duration_s=3000.0,
    )
    reproduced, text = compare(["a", "b"], [first, second])
    assert reproduced, text
    assert "- [x] the same k claimed (4.0, 4.0)" in text and "**Reproduced.**" in text
    # The second claims less: RelayGR at 4L is made twice as slow in its kept analysis.
    steps = [
        step if step.multiple != 4.0 else type(step)(multiple=4.0, ratio=step.ratio, meets_slo=False,
                                                      tested=True, passed=False)
        for step in second.kept.steps
    ]  # fmt: skip
    worse = dataclasses.replace(second, kept=dataclasses.replace(second.kept, steps=steps, claimed=3.5))
    reproduced, text = compare(["a", "b"], [first, worse])
    assert not reproduced and "- [ ] the same k claimed (4.0, 3.5)" in text
    # A run compared with itself is not two runs, and a dirty tree is no one code.
    assert not compare(["a", "a"], [first, first])[0]
    dirty = dataclasses.replace(second, commit="abc1234-dirty")
    assert "- [ ] one code (abc1234, abc1234-dirty)" in compare(["a", "b"], [first, dirty])[1]


def test_the_settings_name_the_field_they_refuse():
    with pytest.raises(SystemExit):
        load(HeadlineConfig, ["--admit-all-multiples", "2.25"])
    with pytest.raises(ValueError, match="--blocks must be a positive multiple of 14"):
        orders.block_orders(ARMS, 10, 0)
    assert math.isclose(load_rate(35.0), 20.0)


def test_the_plot_draws_an_interval_that_does_not_hold_its_estimate_and_leaves_out_an_infinite_ratio(fast):
    """A block bootstrap's percentile interval can lie beside the pooled estimate, and a P99 with over 1 %
    unanswered is infinite: the plot still draws the interval as it is, and leaves the infinite ratio out."""
    from bench.headline.report import PLOT, draw

    results = fake_results("h", ["--blocks", "14"])
    steps = list(results.kept.steps)
    steps[1] = dataclasses.replace(steps[1], ratio=dataclasses.replace(steps[1].ratio, low=9.0, high=12.0))
    steps[2] = dataclasses.replace(steps[2], ratio=dataclasses.replace(steps[2].ratio, value=None, high=None))
    results = dataclasses.replace(results, kept=dataclasses.replace(results.kept, steps=steps))
    out = fast / "plot"
    out.mkdir()
    draw(results, out)
    assert (out / PLOT).stat().st_size > 1000
