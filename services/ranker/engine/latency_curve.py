"""The ranker's latency curve, measured at warm-up on its own device.

For each profile length L the ranker times, on its device thread, ranking without relay (`full_ms`: how the
ranker serves a miss — the prefix computed, then ranked against), a pre-inference of L tokens and a cached
rank of S + C tokens against L (the least of a few repeats, after one untimed run that warms kernels and
allocators: timing noise on a shared host only ever adds, so the least is the closest to the path's own cost,
and a restart under load measures nearly the same curve as one on an idle host; then each point is lowered to
the least of any longer one, `monotone`). GetProfile returns the curve;
the trigger predicts ranking cost from it, and the ranker itself uses it to shed requests that cannot meet
their deadline.

Every curve starts at `ANCHOR_LENGTH` events, whatever the profile lengths: a pass over so few events is
almost all a model call's fixed cost, which the trigger's break-even (at the short end) reads, so the fits
measure it there instead of extrapolating it from 128 events and more (where a fit could put it at zero).

What the curve predicts is corrected while the ranker serves: `Calibration` (engine/calibration.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import time

import numpy as np

from services.ranker.device.accelerator import synchronize
from services.ranker.engine.runner import ModelRunner
from services.ranker.model.events import Events


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


def measure(
    runner: ModelRunner, lengths: list[int], short: int, candidates: int, repeats: int
) -> LatencyCurve:
    """Times the three paths at `curve_lengths(lengths)` on the calling thread (call it before serving,
    nothing else runs)."""
    lengths = curve_lengths(lengths)
    rng = np.random.default_rng(0)
    short_events = _synthetic(short, rng, runner.model)
    candidate_ids = runner.model.item_index.sample(rng, candidates).tolist()
    # One untimed pass of every path at the longest length first: thread pools and the allocator are then
    # warm for every timed point (otherwise the first point measured can be 100x slow).
    longest = _synthetic(max(lengths), rng, runner.model)
    runner.uncached_sync(longest, short_events, candidate_ids)
    points = []
    for length in lengths:
        long_events = _synthetic(length, rng, runner.model)

        def timed(fn):
            fn()  # warm kernels and the allocator
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                result = fn()
                synchronize(runner.device)
                samples.append((time.perf_counter() - started) * 1000)
            return min(samples), result

        full_ms, _ = timed(lambda le=long_events: runner.uncached_sync(le, short_events, candidate_ids))
        pre_ms, kv = timed(lambda le=long_events: runner.build_sync(le, background=False))
        rank_ms, _ = timed(lambda kv=kv: runner.rank_sync(kv, short_events, candidate_ids))
        points.append(LatencyPoint(length, full_ms, pre_ms, rank_ms))
    return LatencyCurve(monotone(points), short, candidates)


def monotone(points: list[LatencyPoint]) -> tuple[LatencyPoint, ...]:
    """`points` (by length) with each path's time lowered to the least measured at it or any longer
    prefix: a path's cost cannot fall as the prefix grows, and timing noise only ever adds, so one stalled
    measurement (the first points of rankers warming up together read 5-10x slower than longer ones) does
    not make a short prefix look dearer than a long one."""
    lowered: list[LatencyPoint] = []
    least = {"full_ms": float("inf"), "pre_infer_ms": float("inf"), "rank_ms": float("inf")}
    for point in reversed(points):
        for path in least:
            least[path] = min(least[path], getattr(point, path))
        lowered.append(dataclasses.replace(point, **least))
    return tuple(reversed(lowered))
