"""The figures across runs on synthetic runs whose answers are known: the drained users' next-call hit
share off against on, the rolling restart's Recommend P99 paired by seed with its interval, the spare's
returning users against the steady phase's, failed calls; and what the command writes from them."""

from __future__ import annotations

import json

import pytest

from bench.lib.intervals import p99_difference, proportion_difference
from bench.rollout.__main__ import jsonable, markdown, plot, write_timeline
from bench.rollout.config import RolloutConfig, plan
from bench.rollout.run import Call, Change, RunRecord, Sample
from bench.rollout.summary import figures, summarize_run
from services.common.config import load

PHASES = ["--warmup-s", "0", "--steady-s", "10", "--restart-slot-s", "10", "--scale-out-s", "10"]
CONFIG = load(
    RolloutConfig, [*PHASES, "--scale-in-s", "10", "--tail-s", "0", "--rate", "10", "--seeds", "2"], {}
)
PLAN = plan(CONFIG)  # steady 0-10 s, rollout 10-40 s, scale-out 40-50 s, scale-in 50-60 s


def answered(index: int, user: str, at_s: float, instance: str, hit: bool, ms: float = 100.0) -> Call:
    source = "dram" if hit else "miss"
    return Call(index, user, at_s, ms, "OK", source, "" if hit else "never_pre_inferred", instance, 10.0)


def record(mode: str, seed: int) -> RunRecord:
    """ten users on ranker-2 when it drains at 10 s; off, 2 of them hit on their next call (ranker-0),
    on, 8; the rolling restart's slowest two calls take 300 ms off and 200 ms on; five of those users
    then go to the spare (Ready at 41 s), where off they miss and on they hit; on's seed 1 loses one call
    in the scale-in."""
    on = mode == "on"
    calls = [answered(i, f"u{i}", 1.0 + 0.5 * i, "ranker-2", True) for i in range(10)]
    calls.append(answered(10, "u0", 9.0, "ranker-2", True))  # the steady phase's one returning call
    calls += [answered(11 + i, f"u{i}", 13.0 + 0.1 * i, "ranker-0", i < (8 if on else 2)) for i in range(10)]
    slow = [200.0, 200.0] if on else [300.0, 300.0]
    calls += [answered(21 + j, f"load{j}", 20.0 + 0.1 * j, "ranker-1", True, ms) for j, ms in
              enumerate([100.0] * 98 + slow)]  # fmt: skip
    calls += [answered(121 + i, f"u{i}", 42.0 + 0.1 * i, "ranker-3", on) for i in range(5)]
    if on and seed == 1:
        calls.append(Call(126, "u9", 55.0, float("inf"), "UNAVAILABLE"))
    changes = [
        Change("restart", "ranker-2", 10.0, 10.0, 10.0, 12.0, 0, 15.0, {"dram": 5 * 2**20}),
        Change("start", "ranker-3", 40.0, 40.0, ready_s=41.0),
    ]
    recompute, received = "device_s/uncached", "handoff_received_bytes"
    samples = [
        Sample(0.0, "ranker-0", 1, {recompute: 0.0, received: 0.0}, baseline=True),
        Sample(9.9, "ranker-0", 1, {recompute: 0.0, received: 0.0}),
        Sample(12.5, "ranker-0", 1, {recompute: 0.0, received: (4.0 if on else 0.0) * 2**20}),
        Sample(39.0, "ranker-0", 1, {recompute: 0.5 if on else 2.0, received: 4.0 * 2**20}),
    ]
    return RunRecord(mode, seed, 0, calls, changes, samples, 100.0, 1.0)


@pytest.fixture(scope="module")
def runs():
    return [summarize_run(record(mode, seed), PLAN, CONFIG) for seed in (0, 1) for mode in ("off", "on")]


def test_the_figures_pair_handoff_on_with_off_by_seed(runs):
    found = figures(runs, CONFIG)
    off, on = found.modes
    assert (off.mode, on.mode, off.seeds) == ("off", "on", [0, 1])
    # (1) Of 10 resident users a run, 2 (off) and 8 (on) hit on their next call, on another ranker.
    assert (off.drained["hits"], off.drained["of"], on.drained["hits"], on.drained["of"]) == (4, 20, 16, 20)
    assert off.drained["share"].value == 0.2 and on.drained["share"].value == 0.8
    assert (off.drained_moved, on.drained_moved) == ([4, 20], [16, 20])
    assert (on.drained_back, on.drained_draining) == ([0, 0], [0, 0])
    difference = found.comparison.drained_difference
    per_seed = [[1.0] * 2 + [0.0] * 8] * 2, [[1.0] * 8 + [0.0] * 2] * 2
    assert difference == proportion_difference(*per_seed, 0.5, CONFIG.confidence)
    # Two seeds: t's quantile with one degree of freedom makes the interval wide.
    assert difference.value == pytest.approx(0.6) and difference.low < 0.6 < difference.high
    # (2) Every failed call is counted, in its phase.
    assert (off.failed, on.failed, on.failed_by_phase["scale-in"]) == (0, 1, 1)
    # (3) The rolling restart's P99, pooled over the seeds and paired by seed.
    assert (off.rollout_p99_ms.value, on.rollout_p99_ms.value) == (300.0, 200.0)
    p99 = found.comparison.rollout_p99_difference_ms
    off_ms = [run.rollout_recommend_ms for run in runs if run.mode == "off"]
    on_ms = [run.rollout_recommend_ms for run in runs if run.mode == "on"]
    assert [len(ms) for ms in off_ms] == [110, 110]  # 100 load calls and the 10 users' next ones
    assert p99 == p99_difference(off_ms, on_ms, CONFIG.block(CONFIG.rate), CONFIG.confidence)
    assert p99.value == -100.0 and p99.low <= -100.0 <= p99.high
    assert found.comparison.rollout_p99_ratio == 0.667
    seeds = [
        (s["seed"], s["ratio"], s["off_drained_hit"], s["on_drained_hit"]) for s in found.comparison.per_seed
    ]
    assert seeds == [(0, 0.667, 0.2, 0.8), (1, 0.667, 0.2, 0.8)]
    # (4) The spare's five returning users a run: off they missed, on they hit; the steady phase's one
    # returning call a run hit.
    assert (off.scale_out_first["hits"], off.scale_out_first["of"]) == (0, 10)
    assert (on.scale_out_first["hits"], on.scale_out_first["of"]) == (10, 10)
    assert (on.steady_returning["hits"], on.steady_returning["of"]) == (2, 2)
    assert (off.recompute_s["rollout"], on.recompute_s["rollout"]) == (2.0, 0.5)
    assert (off.resident_bytes, off.received_bytes, on.received_bytes) == (5 * 2**20, 0.0, 4 * 2**20)


def test_one_mode_alone_has_its_figures_and_no_comparison(runs):
    only_off = [run for run in runs if run.mode == "off"]
    config = load(RolloutConfig, ["--modes", "off"], environ={})
    found = figures(only_off, config)
    assert found.comparison is None and [m.mode for m in found.modes] == ["off"]


def test_the_summary_the_timeline_and_results_json_are_written_from_the_figures(runs, tmp_path):
    found = figures(runs, CONFIG)
    text = markdown(["header line"], found, runs, CONFIG.mode_names())
    assert "| (1) drained rankers' resident users whose next call hit | 20.0 % [" in text
    assert "(4 of 20) | 80.0 % [" in text and "| +60.0 pp [" in text
    assert "| (2) failed calls, measured phases | 0 (none) | 1 (scale-in 1) |" in text
    assert "| (3) Recommend P99 during the rolling restart, ms | 300.0 [" in text and "-100.0 ms [" in text
    assert "| on | 1 | restart ranker-2 | 10.0 | 2.0 | 3.0 | 8 of 10 | 5.0 MiB | 4.0 MiB |" in text
    write_timeline(runs, tmp_path / "timeline.csv")
    rows = (tmp_path / "timeline.csv").read_text().splitlines()
    assert (
        rows[0] == "mode,seed,start_s,calls,hbm,dram,peer,extended,miss,failed,recommend_p99_ms,recompute_s"
    )
    assert len(rows) == 1 + 4 * 60  # a bucket a second of each run
    plot(runs, PLAN, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads(json.dumps(jsonable({"figures": found, "runs": runs}), allow_nan=False))
    assert written["figures"]["modes"][1]["rollout_p99_ms"]["value"] == 200.0
    assert written["runs"][3]["drains"][0]["next_hit"]["u7"] is True
