"""The ranker's predictions corrected by what its jobs actually took.

The latency curve is measured once, at warm-up. A curve measured while other rankers warm up on the same
cores reads every path 100x slow, and one measured on a quiet host under-reads a loaded one; uncorrected,
either stays wrong for the ranker's whole life, and everything that predicts from it with it: the backlogs in
its load reports, its own pre-inference backlog limit and deadline shedding, and through GetProfile the
trigger's break-even, placement and brakes.

So every model job reports, when it ends on the device thread, its own device time (its wall time on that
thread, less the jobs run nested at its `Yield`; a batch's pass time for the ranks in it) and the work it
did (`Scheduler(observer=...)`). `Calibration` keeps, per path of the curve (`full_ms`: an uncached rank,
`pre_infer_ms`: a pre-inference, `rank_ms`: a cached rank), the ratio of the measured time to what the
measured curve predicted for the same work, each sum exponentially weighted over about
`MEMORY_JOBS` jobs, so the ratio follows a host whose speed drifts; a path's ratio stays 1 until `MIN_JOBS`
of its jobs have ended. It keeps the same ratio per point of each path too: a job between two points of the
curve teaches both, each by its interpolation weight (the job's measured time shared among a batch's jobs
by their predictions). A warm-up under contention does not only slow a curve, it bends it (two rankers
warming up together measured 512 events 4-16x their quiet cost while 16 and 128 events read 1-2x), and a
ratio per path can scale a curve but not straighten it. So each point is scaled by its own ratio once its
jobs weigh `MIN_JOBS`, by its path's before, and the scaled curve is made monotone again (`monotone`).
`predict_ms` interpolates that curve. An extension is no point of the curve (its appended events attend
over the whole base, which the curve at their count does not price), so it teaches nothing; its cost is the
pre-inference path's, corrected. GetProfile answers `corrected()`, the same curve, so the trigger reads the
corrected figures at its next profile refresh, and in every load report.

Where the device runs asynchronously (CUDA), a job's time is what the device thread waited for it: a rank
ends with its scores copied back, so its time is the device's; a background pre-inference may end before
its last chunks ran, and reads short.

Thread-safety: `observe` runs on the device thread and replaces the corrected curve and each path's ratio
whole; `predict_ms` and `corrected` on the event loop read them (a reference or a float: atomic under the
GIL). `set_curve` runs before serving.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from services.ranker.engine.latency_curve import LatencyCurve, LatencyPoint, lowered
from services.ranker.engine.scheduler import Op

# The sums forget at this rate: each job weighs 1 - 1/MEMORY_JOBS of the job after it.
MEMORY_JOBS = 100
# A path's ratio is applied once this many of its jobs have ended.
MIN_JOBS = 10
PATHS = ("full_ms", "pre_infer_ms", "rank_ms")
_PATH_OF = {
    Op.UNCACHED: "full_ms",
    Op.PRE_INFER: "pre_infer_ms",
    Op.RANK: "rank_ms",
}


class Calibration:
    """Per path, the running ratio of measured device time to the latency curve's prediction (module
    docstring)."""

    def __init__(self, memory_jobs: int = MEMORY_JOBS, min_jobs: int = MIN_JOBS) -> None:
        if memory_jobs < 1 or min_jobs < 1:
            raise ValueError("memory_jobs and min_jobs must be at least 1")
        self.curve: LatencyCurve | None = None
        self._corrected: LatencyCurve | None = None
        self._keep = 1.0 - 1.0 / memory_jobs
        self._min_jobs = min_jobs
        self._measured_ms = dict.fromkeys(PATHS, 0.0)
        self._predicted_ms = dict.fromkeys(PATHS, 0.0)
        self.jobs = dict.fromkeys(PATHS, 0)
        # Per path; its values are replaced, the dict never (gauges read it).
        self.ratio = dict.fromkeys(PATHS, 1.0)
        # Per path and point of the curve: the weighted sums and the jobs' weight (their share at the point).
        self._point_measured_ms: dict[str, list[float]] = {}
        self._point_predicted_ms: dict[str, list[float]] = {}
        self.point_jobs: dict[str, list[float]] = {}
        # The corrected curve's columns by path, and the curve's lengths (`set_curve`).
        self._columns: dict[str, list[float]] = {}
        self._lengths: list[int] = []

    def set_curve(self, curve: LatencyCurve) -> None:
        """The measured curve; what was learnt against another one is forgotten."""
        self.curve = curve
        for path in PATHS:
            self._measured_ms[path] = self._predicted_ms[path] = 0.0
            self.jobs[path] = 0
            self.ratio[path] = 1.0
            self._point_measured_ms[path] = [0.0] * len(curve.points)
            self._point_predicted_ms[path] = [0.0] * len(curve.points)
            self.point_jobs[path] = [0.0] * len(curve.points)
            self._columns[path] = [getattr(point, path) for point in curve.points]
        self._lengths = [point.prefix_length for point in curve.points]
        self._corrected = curve

    @property
    def provisional(self) -> bool:
        """Whether the curve was measured disturbed and not yet again (`recheck.py`): its predictions may be
        far too slow, so no rule refuses work on them."""
        curve = self.curve
        return curve is not None and curve.provisional

    def predict_ms(self, path: str, length: int) -> float:
        """The corrected cost of `path` at `length` events (0 before warm-up, or for no events)."""
        corrected = self._corrected
        if corrected is None or length <= 0:
            return 0.0
        return corrected.predict_ms(path, length)

    def point_ratio(self, path: str, index: int) -> float:
        """The ratio point `index` of `path` is scaled by: its own once its jobs weigh `MIN_JOBS`, else its
        path's."""
        predicted = self._point_predicted_ms[path][index]
        if self.point_jobs[path][index] >= self._min_jobs and predicted > 0:
            return self._point_measured_ms[path][index] / predicted
        return self.ratio[path]

    def observe(self, op: Op, works: Sequence[int], seconds: float) -> None:
        """A job (or a batch of jobs) of `op` ended after `seconds` of device time; `works` is the length each
        job's prediction is read at: the events a pre-inference or extension computed, the prefix length a
        rank ranked against. Other ops (extensions, the profile itself, tier moves) are not the curve's."""
        path = _PATH_OF.get(op)
        curve = self.curve
        if path is None or curve is None:
            return
        predictions = [(work, ms) for work in works if work > 0 and (ms := curve.predict_ms(path, work)) > 0]
        predicted = sum(ms for _, ms in predictions)
        if predicted <= 0:
            return
        keep = self._keep
        measured_ms = seconds * 1000
        measured = self._measured_ms[path] = self._measured_ms[path] * keep + measured_ms
        expected = self._predicted_ms[path] = self._predicted_ms[path] * keep + predicted
        self.jobs[path] += len(works)
        if self.jobs[path] >= self._min_jobs:
            self.ratio[path] = measured / expected
        lengths = self._lengths
        point_measured, point_predicted = self._point_measured_ms[path], self._point_predicted_ms[path]
        for work, ms in predictions:
            for index, weight in interpolation_weights(lengths, work):
                forget = keep**weight
                point_measured[index] = point_measured[index] * forget + measured_ms * ms / predicted * weight
                point_predicted[index] = point_predicted[index] * forget + ms * weight
                self.point_jobs[path][index] += weight
        self._corrected = self._correct(curve, path)

    def _correct(self, curve: LatencyCurve, path: str) -> LatencyCurve:
        """`curve` with each point of each path scaled by its ratio and the columns made monotone again:
        `path`'s column computed anew, the others' kept (a job changes its own path's ratios only)."""
        column = [getattr(point, path) * self.point_ratio(path, i) for i, point in enumerate(curve.points)]
        self._columns[path] = lowered(column)
        columns = [self._columns[name] for name in PATHS]
        points = tuple(
            LatencyPoint(point.prefix_length, *times)
            for point, times in zip(curve.points, zip(*columns, strict=True), strict=True)
        )
        return dataclasses.replace(curve, points=points)

    def corrected(self) -> LatencyCurve:
        """The measured curve, corrected point by point: what GetProfile answers and `predict_ms` reads."""
        if self._corrected is None:
            raise ValueError("no latency curve yet")
        return self._corrected


def interpolation_weights(lengths: Sequence[int], length: int) -> list[tuple[int, float]]:
    """The points (index, weight) that `LatencyCurve.predict_ms` reads at `length` and how much each
    weighs there: the two ends of its segment by linear interpolation, or the nearest end alone beyond
    them."""
    if len(lengths) == 1:
        return [(0, 1.0)]
    i = min(max(bisect.bisect_left(lengths, length), 1), len(lengths) - 1)
    share = (length - lengths[i - 1]) / (lengths[i] - lengths[i - 1])
    if share <= 0:
        return [(i - 1, 1.0)]
    if share >= 1:
        return [(i, 1.0)]
    return [(i - 1, 1.0 - share), (i, share)]
