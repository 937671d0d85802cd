"""What a point cost: the rankers' counters read from their real metrics, CPU time, and the difference."""

from __future__ import annotations

import os
import time

import prometheus_client

from bench.lib.probes import counters_from_text, difference, machine_busy_s, process_cpu_s
from services.ranker import metrics


def exposition() -> str:
    return prometheus_client.generate_latest().decode()


def test_the_rankers_counters_are_read_from_the_shared_metric_objects():
    before = counters_from_text(exposition())
    metrics.PRODUCTIONS.labels("compute").inc(3)
    metrics.PRODUCTIONS.labels("reload").inc()
    metrics.PRE_INFER_OUTCOMES.labels("accepted").inc(2)
    metrics.PRODUCTION_JOINS.inc(4)
    metrics.MODEL_SECONDS.labels("pre_infer").observe(0.25)
    after = counters_from_text(exposition())
    start = {"at": 0.0, "machine_busy_s": 0.0, "cpu_s": {}, "rankers": before}
    delta = difference(start, {**start, "at": 1.0, "rankers": after})["rankers"]
    assert delta["productions"]["compute"] == 3 and delta["productions"]["reload"] == 1
    assert delta["pre_infer"]["accepted"] == 2 and delta["joins"] == 4
    assert delta["device_s"]["pre_infer"] == 0.25


def test_the_difference_splits_the_machines_busy_time_into_ours_and_foreign():
    before = {"at": 10.0, "machine_busy_s": 100.0, "cpu_s": {"ranker-0": 5.0, "router": 1.0}, "rankers": {}}
    after = {"at": 20.0, "machine_busy_s": 112.0, "cpu_s": {"ranker-0": 11.0, "router": 2.0}, "rankers": {}}
    cost = difference(before, after)
    assert cost["wall_s"] == 10.0 and cost["cpu_s"] == {"ranker-0": 6.0, "router": 1.0}
    assert cost["foreign_cores"] == 0.5  # 12 busy seconds, 7 of them ours, over 10 s


def test_cpu_time_is_read_from_proc():
    start_busy, start_self = machine_busy_s(), process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) - start_self >= 0.2
    assert machine_busy_s() - start_busy >= 0.2
    assert process_cpu_s(2**22 + 1) == 0.0  # no such process


def test_pre_inference_by_fate_and_its_wasted_seconds_are_read_and_zero_where_not_exported():
    before = counters_from_text(exposition())
    metrics.PRE_INFER_TOKENS.labels("consumed").inc(6144)
    metrics.PRE_INFER_TOKENS.labels("wasted").inc(2048)
    metrics.PRE_INFER_WASTED_SECONDS.inc(1.5)
    after = counters_from_text(exposition())
    start = {"at": 0.0, "machine_busy_s": 0.0, "cpu_s": {}, "rankers": before}
    delta = difference(start, {**start, "at": 1.0, "rankers": after})["rankers"]
    assert delta["pre_infer_tokens"] == {"consumed": 6144.0, "wasted": 2048.0}
    assert delta["pre_infer_wasted_s"] == 1.5
    absent = counters_from_text("")  # a ranker that predates these counters
    assert absent["pre_infer_tokens"] == {} and absent["pre_infer_wasted_s"] == 0.0
