"""Load schedules (ghz's const, step, line) and their Poisson arrivals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from services.loadgen.schedule import RateSchedule, poisson_arrivals


def arrivals_until(schedule: RateSchedule, horizon_s: float, seed: int = 7) -> np.ndarray:
    arrivals = poisson_arrivals(schedule, np.random.default_rng(seed))
    return np.fromiter(itertools.takewhile(lambda t: t < horizon_s, arrivals), dtype=np.float64)


def test_constant_rate_arrivals_have_exponential_gaps_with_the_right_mean():
    rate = 200.0
    times = arrivals_until(RateSchedule.constant(rate), 100.0)
    gaps = np.diff(times)
    assert np.all(gaps > 0)
    assert np.mean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # Exponential gaps: the standard deviation equals the mean (a fixed-interval pacer would give 0).
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)
    assert len(times) == pytest.approx(rate * 100.0, rel=0.03)


def test_arrivals_are_reproducible_from_a_seed():
    schedule = RateSchedule.constant(50.0)
    assert np.array_equal(arrivals_until(schedule, 5.0, seed=1), arrivals_until(schedule, 5.0, seed=1))
    assert not np.array_equal(arrivals_until(schedule, 5.0, seed=1), arrivals_until(schedule, 5.0, seed=2))


def test_step_schedule_changes_rate_every_step_until_its_end():
    schedule = RateSchedule(start=100, step=100, step_duration_s=5.0, end=300)
    assert [schedule.rate_at(t) for t in (0, 4.9, 5.0, 10.0, 15.0, 1000.0)] == [100, 100, 200, 300, 300, 300]
    assert schedule.next_change(1.0) == 5.0 and schedule.next_change(10.0) == math.inf
    times = arrivals_until(schedule, 20.0)
    per_step = np.histogram(times, bins=[0, 5, 10, 15, 20])[0]
    for observed, rate in zip(per_step, (100, 200, 300, 300), strict=True):
        assert observed == pytest.approx(rate * 5, rel=0.1)


def test_line_schedule_steps_every_second_and_freezes_after_max_duration():
    schedule = RateSchedule.line(start=10, slope=10, max_duration_s=3.0)
    assert [schedule.rate_at(t) for t in (0.5, 1.5, 2.5, 3.5, 60.0)] == [10, 20, 30, 40, 40]
    assert schedule.next_change(3.0) == math.inf


def test_a_falling_schedule_stops_at_zero_and_the_arrivals_end():
    schedule = RateSchedule(start=100, step=-50, step_duration_s=1.0)
    times = np.fromiter(poisson_arrivals(schedule, np.random.default_rng(3)), dtype=np.float64)
    assert times.max() < 2.0
    assert len(times) == pytest.approx(150, rel=0.25)


@pytest.mark.parametrize(
    "arguments", [{"start": 0}, {"start": -1}, {"start": 10, "step": 1, "step_duration_s": 0}]
)
def test_schedules_without_load_or_with_bad_steps_are_refused(arguments):
    with pytest.raises(ValueError):
        RateSchedule(**arguments)
