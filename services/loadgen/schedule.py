"""Offered load over time, and the Poisson arrival times that realise it.

`RateSchedule` follows ghz's load schedules: `const` keeps one rate; `step` starts at `start` and changes
by `step` every `step_duration_s`; `line` is a step schedule whose steps last one second (ghz's slope).
A changing rate stops changing once it reaches `end` (when set) or once `max_duration_s` has passed (when
set), and never goes below zero.

`poisson_arrivals` draws the arrival times of a non-homogeneous Poisson process with that rate, exactly:
the rate is piecewise constant, so each unit-exponential draw is spent across the pieces it spans.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True)
class RateSchedule:
    """Requests per second as a function of the time since the run started."""

    start: float
    step: float = 0.0
    step_duration_s: float = 1.0
    end: float = 0.0
    max_duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < 0 or self.max_duration_s < 0:
            raise ValueError("rates and durations of a load schedule must not be negative")
        if self.step and not self.step_duration_s > 0:
            raise ValueError("a stepped load schedule needs a positive step duration")
        if not (self.start > 0 or self.step > 0):
            raise ValueError("a load schedule must offer some load: a positive start rate or a positive step")

    @classmethod
    def constant(cls, rate: float) -> RateSchedule:
        return cls(start=rate)

    @classmethod
    def line(cls, start: float, slope: float, end: float = 0.0, max_duration_s: float = 0.0) -> RateSchedule:
        return cls(start=start, step=slope, step_duration_s=1.0, end=end, max_duration_s=max_duration_s)

    def _steps_taken(self, t: float) -> int:
        if self.max_duration_s:
            t = min(t, self.max_duration_s)
        return math.floor(t / self.step_duration_s)

    def rate_at(self, t: float) -> float:
        rate = self.start + self.step * self._steps_taken(t) if self.step else self.start
        if self.end:
            rate = min(rate, self.end) if self.step > 0 else max(rate, self.end)
        return max(rate, 0.0)

    def next_change(self, t: float) -> float:
        """When the rate may next change after time t (infinity once it has settled)."""
        if not self.step or (self.max_duration_s and t >= self.max_duration_s):
            return math.inf
        rate = self.rate_at(t)
        if (self.end and rate == self.end) or (self.step < 0 and rate == 0):
            return math.inf
        boundary = (self._steps_taken(t) + 1) * self.step_duration_s
        return min(boundary, self.max_duration_s) if self.max_duration_s else boundary


def poisson_arrivals(schedule: RateSchedule, rng: np.random.Generator) -> Iterator[float]:
    """Arrival offsets in seconds, increasing; ends only when the rate has settled at zero."""
    t = 0.0
    while True:
        budget = rng.exponential()  # unit-rate time to spend against the cumulative intensity
        while True:
            rate, change = schedule.rate_at(t), schedule.next_change(t)
            if rate > 0 and t + budget / rate < change:
                t += budget / rate
                break
            if math.isinf(change):
                return
            budget -= rate * (change - t)
            t = change
        yield t
