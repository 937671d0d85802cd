"""The rollout's plan: the phases back to back, the fleet changes at their slots, the restart order a
StatefulSet's `kubectl rollout restart` takes, and the duration printed before a run."""

from __future__ import annotations

import pytest

from bench.lib.workload import Population
from bench.rollout.config import RESTART, START, STOP, Change, RolloutConfig, describe, plan, restart_order
from services.common.config import load


def test_a_rollout_restarts_the_highest_ordinal_first_as_kubectl_does_a_statefulset():
    assert restart_order(["ranker-0", "ranker-1", "ranker-2"]) == ["ranker-2", "ranker-1", "ranker-0"]
    # By the number, not the text: ranker-10 is the highest of eleven.
    names = [f"ranker-{i}" for i in range(11)]
    assert restart_order(names)[:3] == ["ranker-10", "ranker-9", "ranker-8"]
    assert restart_order(names)[-1] == "ranker-0"
    with pytest.raises(ValueError, match="no ordinal"):
        restart_order(["ranker"])


def test_the_default_plan_restarts_each_ranker_in_its_slot_then_scales_out_and_in_within_25_minutes():
    config = load(RolloutConfig, [], environ={})
    made = plan(config)
    assert [(p.name, p.start_s, p.end_s) for p in made.phases] == [
        ("warm-up", 0.0, 20.0), ("steady", 20.0, 50.0), ("rollout", 50.0, 110.0),
        ("scale-out", 110.0, 140.0), ("scale-in", 140.0, 160.0), ("tail", 160.0, 170.0),
    ]  # fmt: skip
    assert made.changes == (
        Change(RESTART, "ranker-2", 50.0), Change(RESTART, "ranker-1", 70.0),
        Change(RESTART, "ranker-0", 90.0), Change(START, "ranker-3", 110.0), Change(STOP, "ranker-3", 140.0),
    )  # fmt: skip
    assert (made.rankers, made.spare, made.duration_s) == (
        ("ranker-0", "ranker-1", "ranker-2"),
        "ranker-3",
        170.0,
    )
    runs = config.seeds * len(config.mode_names())
    assert runs == 6
    text = describe(made, runs, overhead_s=15.0)
    assert "170 s of load a run" in text and "ranker-2 → ranker-1 → ranker-0" in text
    assert "about 18.5 min" in text  # 6 x (170 + 15) s: the bound is 25 minutes


def test_the_settings_refuse_returning_users_that_would_come_back_after_the_dram_ttl():
    with pytest.raises(SystemExit):
        load(RolloutConfig, ["--revisit-window-s", "60", "--dram-ttl-s", "60"], environ={})
    with pytest.raises(SystemExit):
        load(RolloutConfig, ["--modes", "off,sideways"], environ={})
    config = load(
        RolloutConfig, ["--modes", "on", "--seeds", "2", "--load-seed", "5", "--rate", "20"], environ={}
    )
    assert (config.mode_names(), config.seed_list(), config.block(config.rate)) == (["on"], [5, 6], 20)


def test_a_closed_population_visits_every_user_first_then_only_returns():
    population = Population("p", 50, seed=3)
    first = [population.user(i) for i in range(50)]
    assert first == [f"p-{i}" for i in range(50)]
    later = {population.user(i) for i in range(50, 2000)}
    assert later <= set(first) and len(later) == 50  # only returns, and every user returns
    assert Population("p", 50, seed=3).user(1234) == population.user(1234)  # deterministic


def test_a_population_must_be_seen_within_the_warm_up_and_return_within_the_ttl():
    with pytest.raises(ValueError, match="--population: every user's first visit"):
        RolloutConfig(population=400, rate=16, warmup_s=20).validate()
    with pytest.raises(ValueError, match="under --dram-ttl-s"):
        RolloutConfig(population=300, rate=16, warmup_s=20, dram_ttl_s=15, revisit_window_s=10).validate()
    RolloutConfig(population=300, rate=16, warmup_s=20).validate()
