"""A clearly passing point stops early (`bench.lib.points.clearly_passing`), and the rule is safe: replayed on
every run of the committed fixed-load A/Bs (their Rank latencies in send order), it stops some runs and
changes no verdict; a slowly growing queue is never stopped as passing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bench.lib.points import PASS_CHECK_EVERY, clearly_passing, p99_upper_bound
from bench.lib.stats import percentile

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
COMMITTED_AB = ("ab-mix1-admit-all", "ab-mix1-admit-all-warm")


def stopped_at(samples: list[float], slo_ms: float) -> int | None:
    """Where the rule, looked at every `PASS_CHECK_EVERY` ranked calls, stops a point that measured
    `samples` (None: it runs to its end)."""
    for n in range(PASS_CHECK_EVERY, len(samples) + 1, PASS_CHECK_EVERY):
        if clearly_passing(samples[:n], len(samples), slo_ms):
            return n
    return None


def passes(samples: list[float], slo_ms: float) -> bool:
    return percentile(samples, 99) <= slo_ms and not any(math.isinf(ms) for ms in samples)


def test_replayed_on_the_committed_ab_runs_it_stops_some_and_changes_no_verdict():
    stops = changed = runs = failing = 0
    for name in COMMITTED_AB:
        results = json.loads((RESULTS / name / "results.json").read_text())
        slo_ms = results["settings"]["slo_ms"]
        for run in results["runs"]:
            samples = [math.inf if ms is None else ms for ms in run["rank_ms"]]
            runs += 1
            failing += not passes(samples, slo_ms)
            at = stopped_at(samples, slo_ms)
            if at is not None:
                stops += 1
                changed += not passes(samples, slo_ms)
    # 40 runs of 600 Ranks, 6 of them failing the SLO: 16 stop early as passing, none of them a failing run.
    assert (runs, failing, stops, changed) == (40, 6, 16, 0)


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(min_value=1.0, max_value=100.0),
    end=st.floats(min_value=100.5, max_value=400.0),
    planned=st.integers(min_value=300, max_value=1000),
)
def test_a_queue_growing_past_the_slo_is_never_stopped_as_passing(start, end, planned):
    samples = list(np.linspace(start, end, planned))
    assume(not passes(samples, 100.0))
    assert stopped_at(samples, 100.0) is None


def test_a_steady_fast_point_stops_at_half_its_plan_and_a_failure_keeps_it_running():
    rng = np.random.default_rng(0)
    steady = list(rng.exponential(5.0, 1000) + 20.0)  # P99 about 43 ms against a 100 ms SLO
    assert stopped_at(steady, 100.0) == 500
    # A P99 of about 66 ms: its upper bound stays over 80 % of the SLO until 950 Ranks are in.
    slower = list(np.random.default_rng(0).exponential(10.0, 1000) + 20.0)
    assert stopped_at(slower, 100.0) == 950
    with_failure = [*steady[:100], math.inf, *steady[101:]]
    assert stopped_at(with_failure, 100.0) is None


def test_the_p99_upper_bound_is_an_order_statistic_that_covers_the_p99():
    samples = [float(k) for k in range(1000)]
    # Binomial(1000, 0.99) < 996 with probability >= 0.95: the 996th smallest (995.0) bounds the P99.
    assert p99_upper_bound(samples) == 995.0
    assert math.isinf(p99_upper_bound(samples[:200]))  # too few: no sample bounds the P99
    rng = np.random.default_rng(1)
    truth = 20.0 + 10.0 * math.log(100)  # the P99 of 20 + Exp(10)
    covered = sum(p99_upper_bound(list(rng.exponential(10.0, 500) + 20.0)) >= truth for _ in range(400))
    assert covered / 400 >= 0.93
