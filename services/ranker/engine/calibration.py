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
`MEMORY_JOBS` jobs, so the ratio follows a host whose speed drifts. `predict_ms` is the curve's prediction
times its path's ratio; a path's ratio stays 1 until `MIN_JOBS` of its jobs have ended. An extension is no
point of the curve (its appended events attend over the whole base, which the curve at their count does not
price), so it teaches nothing; its cost is the pre-inference path's, corrected. GetProfile answers
`corrected()`: the curve with each path's column scaled by its ratio, so the trigger reads the corrected
figures at its next profile refresh, and in every load report.

Where the device runs asynchronously (CUDA), a job's time is what the device thread waited for it: a rank
ends with its scores copied back, so its time is the device's; a background pre-inference may end before
its last chunks ran, and reads short.

Thread-safety: `observe` runs on the device thread; `predict_ms` and `corrected` on the event loop read one
float per path, which the device thread replaces whole (atomic under the GIL). `set_curve` runs before
serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from services.ranker.engine.latency_curve import LatencyCurve
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
        self._keep = 1.0 - 1.0 / memory_jobs
        self._min_jobs = min_jobs
        self._measured_ms = dict.fromkeys(PATHS, 0.0)
        self._predicted_ms = dict.fromkeys(PATHS, 0.0)
        self.jobs = dict.fromkeys(PATHS, 0)
        # Per path; its values are replaced, the dict never (gauges read it).
        self.ratio = dict.fromkeys(PATHS, 1.0)

    def set_curve(self, curve: LatencyCurve) -> None:
        """The measured curve; what was learnt against another one is forgotten."""
        self.curve = curve
        for path in PATHS:
            self._measured_ms[path] = self._predicted_ms[path] = 0.0
            self.jobs[path] = 0
            self.ratio[path] = 1.0

    def predict_ms(self, path: str, length: int) -> float:
        """The corrected cost of `path` at `length` events (0 before warm-up, or for no events)."""
        curve = self.curve
        if curve is None or length <= 0:
            return 0.0
        return curve.predict_ms(path, length) * self.ratio[path]

    def observe(self, op: Op, works: Sequence[int], seconds: float) -> None:
        """A job (or a batch of jobs) of `op` ended after `seconds` of device time; `works` is the length each
        job's prediction is read at: the events a pre-inference or extension computed, the prefix length a
        rank ranked against. Other ops (extensions, the profile itself, tier moves) are not the curve's."""
        path = _PATH_OF.get(op)
        curve = self.curve
        if path is None or curve is None:
            return
        predicted = sum(curve.predict_ms(path, work) for work in works if work > 0)
        if predicted <= 0:
            return
        keep = self._keep
        measured = self._measured_ms[path] = self._measured_ms[path] * keep + seconds * 1000
        expected = self._predicted_ms[path] = self._predicted_ms[path] * keep + predicted
        self.jobs[path] += len(works)
        if self.jobs[path] >= self._min_jobs:
            self.ratio[path] = measured / expected

    def corrected(self) -> LatencyCurve:
        """The measured curve with each path's column scaled by its ratio: what GetProfile answers."""
        if self.curve is None:
            raise ValueError("no latency curve yet")
        ratio = self.ratio
        points = tuple(
            dataclasses.replace(
                point,
                full_ms=point.full_ms * ratio["full_ms"],
                pre_infer_ms=point.pre_infer_ms * ratio["pre_infer_ms"],
                rank_ms=point.rank_ms * ratio["rank_ms"],
            )
            for point in self.curve.points
        )
        return dataclasses.replace(self.curve, points=points)
