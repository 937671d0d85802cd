"""The ranker's latency curve, measured at warm-up on its own device.

For each profile length L the ranker times, on its device thread, ranking without relay (`full_ms`: how the
ranker serves a miss — the prefix computed, then ranked against), a pre-inference of L tokens and a cached
rank of S + C tokens against L. Timing noise on a shared host only ever adds, so each path keeps the least
of its repeats: the closest to the path's own cost, and a restart under load measures nearly the same curve
as one on an idle host.

The repeats are rounds over every length (`rounds`), after one untimed round that warms kernels and
allocators, not one length's repeats in a row: a spell of contention (another ranker warming up beside this
one on the same cores) then slows one round of every length instead of every repeat of the lengths it
happens to fall on, which could make the longest point the cheapest and the lowered curve (`monotone`: a
path's cost cannot fall as the prefix grows) flat.

Contention is also seen as it happens. On a CPU device, a length whose passes took more wall time than
`disturbed_ratio` times the device thread's own CPU time ran while other work held its core (`Timer`). After
the repeats, up to `retries` more rounds (`--profile-retry-rounds`, none by default: rankers warming up
together disturb each other round after round, so retrying mostly delays SERVING) measure the lengths that
have not yet run undisturbed once (or every length, while a shorter point measures dearer than a longer one
by more than `INVERSION`). A curve with a length still never measured undisturbed is provisional: the
ranker serves it (each path's least time is still an upper bound on its cost), says so in GetProfile,
refuses no work on its predictions, and measures it again once its device is idle (`recheck.py`). On an
accelerator the thread waits for the device without spending CPU, so disturbance is not judged there.

Every curve starts at `ANCHOR_LENGTH` events, whatever the profile lengths: a pass over so few events is
almost all a model call's fixed cost, which the trigger's break-even (at the short end) reads, so the fits
measure it there instead of extrapolating it from 128 events and more (where a fit could put it at zero).

GetProfile returns the curve; the trigger predicts ranking cost from it, and the ranker itself uses it to
shed requests that cannot meet their deadline. What the curve predicts is corrected while the ranker
serves: `Calibration` (engine/calibration.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from services.ranker.device.accelerator import synchronize
from services.ranker.engine.runner import ModelRunner
from services.ranker.model.events import Events

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class LatencyPoint:
    prefix_length: int
    full_ms: float
    pre_infer_ms: float
    rank_ms: float


@dataclasses.dataclass(frozen=True)
class LatencyCurve:
    points: tuple[LatencyPoint, ...]
    short_term_length: int
    num_candidates: int
    # Measured disturbed (module docstring): its figures may be far too slow, and are not to be trusted.
    provisional: bool = False

    def predict_ms(self, op: str, length: int) -> float:
        """Piecewise-linear interpolation of `op` (full_ms, pre_infer_ms, rank_ms) at `length`,
        extrapolated beyond the ends along the nearest segment, never below zero."""
        xs = [p.prefix_length for p in self.points]
        ys = [getattr(p, op) for p in self.points]
        if len(xs) == 1:
            return ys[0] * length / xs[0]
        i = min(max(bisect.bisect_left(xs, length), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (length - x0) / (x1 - x0))


# The shortest point of every latency curve (see the module docstring).
ANCHOR_LENGTH = 16


def curve_lengths(lengths: list[int]) -> list[int]:
    """The profile lengths with `ANCHOR_LENGTH` among them (or the longest, when that is shorter)."""
    anchor = min(ANCHOR_LENGTH, max(lengths))
    return sorted({anchor, *lengths})


def _synthetic(length: int, rng: np.random.Generator, model) -> Events:
    """Events the model has rows for (an imported item table refuses other ids)."""
    actions = min(8, model.preset.num_action_types)
    return Events.of(model.item_index.sample(rng, length), rng.integers(0, actions, length))


PATHS = ("full_ms", "pre_infer_ms", "rank_ms")
# A shorter point measured dearer than a longer one by more than this factor was measured in a stall: the
# curve is measured for more rounds (a path's cost cannot fall as the prefix grows).
INVERSION = 1.25

# What one length's passes took: each path's ms, and whether they ran disturbed (`measure`).
Timing = tuple[tuple[float, float, float], bool]


@dataclasses.dataclass(frozen=True)
class Measured:
    """A curve's points (each path's least time at each length), and whether some length was measured
    disturbed in every round it was measured in (the curve is provisional)."""

    points: list[LatencyPoint]
    provisional: bool


def rounds(
    lengths: list[int], time_length: Callable[[int], Timing], repeats: int, retries: int | None = None
) -> Measured:
    """Each path's least time at each of `lengths` over `repeats` rounds of `time_length(length)` across
    every length in turn, after one untimed round; then up to `retries` (default: `repeats`) more rounds,
    of the lengths not yet measured undisturbed once, or of every length while a shorter point measures
    dearer than a longer one (`inverted`)."""
    for length in lengths:
        time_length(length)  # warm kernels and the allocator
    least = {length: [math.inf] * len(PATHS) for length in lengths}
    quiet: set[int] = set()

    def one_round(which: list[int]) -> None:
        for length in which:
            times, disturbed = time_length(length)
            least[length] = [min(pair) for pair in zip(least[length], times, strict=True)]
            if not disturbed:
                quiet.add(length)

    for _ in range(repeats):
        one_round(lengths)
    for _ in range(repeats if retries is None else retries):
        disturbed = [length for length in lengths if length not in quiet]
        if disturbed:
            one_round(disturbed)
        elif inverted(least):
            one_round(lengths)
        else:
            break
    points = [LatencyPoint(length, *least[length]) for length in lengths]
    return Measured(points, provisional=len(quiet) < len(lengths))


def inverted(least: dict[int, list[float]]) -> bool:
    """Whether a path measured a shorter length dearer than a longer one by more than `INVERSION`."""
    ordered = [least[length] for length in sorted(least)]
    for path in range(len(PATHS)):
        cheapest_longer = math.inf
        for times in reversed(ordered):
            if times[path] > INVERSION * cheapest_longer:
                return True
            cheapest_longer = min(cheapest_longer, times[path])
    return False


@dataclasses.dataclass(frozen=True)
class Profiling:
    """How a ranker measures its curve: the lengths, the Rank's shape, the rounds, and the ratio of wall
    time to the device thread's own CPU time beyond which a length's passes ran disturbed (None: not
    judged, as on an accelerator, where the thread waits for the device without spending CPU)."""

    lengths: list[int]
    short: int
    candidates: int
    repeats: int
    retries: int
    disturbed_ratio: float | None


class Timer:
    """Times one length's three paths on the calling thread (the device thread), with the synthetic
    history, short-term events and candidates the whole curve shares."""

    def __init__(self, runner: ModelRunner, profiling: Profiling) -> None:
        self.runner, self.profiling = runner, profiling
        rng = np.random.default_rng(0)
        self.short_events = _synthetic(profiling.short, rng, runner.model)
        self.candidate_ids = runner.model.item_index.sample(rng, profiling.candidates).tolist()
        self.histories = {length: _synthetic(length, rng, runner.model) for length in self.lengths}

    @property
    def lengths(self) -> list[int]:
        return curve_lengths(self.profiling.lengths)

    def _timed(self, fn: Callable[[], T]) -> tuple[float, float, T]:
        """(wall ms, this thread's CPU ms, the result) of `fn`."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        result = fn()
        synchronize(self.runner.device)
        return (time.perf_counter() - started) * 1000, (time.thread_time() - cpu_started) * 1000, result

    def __call__(self, length: int) -> Timing:
        """Each path's ms at `length`, and whether the passes ran disturbed: their wall time above
        `disturbed_ratio` times the thread's own CPU time, so other work held its core meanwhile."""
        runner, long_events = self.runner, self.histories[length]
        short_events, candidate_ids = self.short_events, self.candidate_ids
        full_ms, full_cpu, _ = self._timed(
            lambda: runner.uncached_sync(long_events, short_events, candidate_ids)
        )
        pre_ms, pre_cpu, kv = self._timed(lambda: runner.build_sync(long_events, background=False))
        rank_ms, rank_cpu, _ = self._timed(lambda: runner.rank_sync(kv, short_events, candidate_ids))
        ratio = self.profiling.disturbed_ratio
        wall, cpu = full_ms + pre_ms + rank_ms, full_cpu + pre_cpu + rank_cpu
        return (full_ms, pre_ms, rank_ms), ratio is not None and wall > ratio * cpu


def measure(timer: Timer) -> LatencyCurve:
    """Times the three paths at `curve_lengths` of the timer's profile lengths on the calling thread (the
    device thread: call it before serving, nothing else runs)."""
    profiling = timer.profiling
    measured = rounds(timer.lengths, timer, profiling.repeats, profiling.retries)
    return LatencyCurve(
        monotone(measured.points), profiling.short, profiling.candidates, measured.provisional
    )


def monotone(points: list[LatencyPoint]) -> tuple[LatencyPoint, ...]:
    """`points` (by length) with each path's time lowered to the least measured at it or any longer
    prefix: a path's cost cannot fall as the prefix grows, and timing noise only ever adds, so one stalled
    measurement (the first points of rankers warming up together read 5-10x slower than longer ones) does
    not make a short prefix look dearer than a long one."""
    columns = [lowered([getattr(point, path) for point in points]) for path in PATHS]
    return tuple(
        LatencyPoint(point.prefix_length, *times)
        for point, times in zip(points, zip(*columns, strict=True), strict=True)
    )


def lowered(times: list[float]) -> list[float]:
    """One path's `times` (by length), each lowered to the least at it or any longer prefix."""
    least, out = math.inf, [0.0] * len(times)
    for index in range(len(times) - 1, -1, -1):
        least = out[index] = min(least, times[index])
    return out
