"""Measuring a provisional latency curve again, in the background, while the device is idle.

A curve whose warm-up ran disturbed in every round it was given (`latency_curve.rounds`: other work held
the ranker's cores, so wall time ran far above the device thread's CPU time) is served provisional: its
figures may be far too slow, so the ranker's own rules that predict from it (the pre-inference backlog
limit, deadline shedding) do not refuse on it, and GetProfile says it is provisional, so the trigger reads
it as unknown. `Recheck` then measures its lengths again, one length a job at the lowest priority, each
only once the device thread has run nothing for `idle_s`: a Rank that arrives meanwhile waits for at most
one length's three passes. A length measured undisturbed is done; when every length is, the curve (each
path's least time, old and new, made monotone) replaces the provisional one, no longer provisional, and the
calibration starts again from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from services.ranker.engine.latency_curve import LatencyCurve, LatencyPoint, Timer, monotone
from services.ranker.engine.scheduler import Op, Priority, Scheduler

log = logging.getLogger(__name__)


class Recheck:
    """Measures `curve` again until every length has run undisturbed, then hands the new curve to
    `replace`. Runs on the event loop; its timing jobs run on the device thread."""

    def __init__(
        self,
        scheduler: Scheduler,
        timer: Timer,
        curve: LatencyCurve,
        replace: Callable[[LatencyCurve], None],
        idle_s: float,
    ) -> None:
        self.scheduler, self.timer, self.replace, self.idle_s = scheduler, timer, replace, idle_s
        self.curve = curve
        self.least = {p.prefix_length: [p.full_ms, p.pre_infer_ms, p.rank_ms] for p in curve.points}
        self.quiet: set[int] = set()

    async def run(self) -> LatencyCurve:
        """Measures until done; returns the curve it replaced the provisional one with."""
        lengths = sorted(self.least)
        while len(self.quiet) < len(lengths):
            await self._idle()
            for length in lengths:
                if length in self.quiet:
                    continue
                if self._queued():
                    break
                timing = await self.scheduler.submit(
                    lambda length=length: self.timer(length), Priority.PRE_INFER, Op.PROFILE
                )
                times, disturbed = timing
                self.least[length] = [min(pair) for pair in zip(self.least[length], times, strict=True)]
                if not disturbed:
                    self.quiet.add(length)
        points = monotone([LatencyPoint(length, *self.least[length]) for length in lengths])
        curve = LatencyCurve(points, self.curve.short_term_length, self.curve.num_candidates)
        self.replace(curve)
        log.info(
            "latency curve measured again undisturbed: %s",
            ", ".join(f"L={p.prefix_length} full {p.full_ms:.2f} ms" for p in curve.points),
        )
        return curve

    def _queued(self) -> int:
        """Jobs waiting for the device thread."""
        return self.scheduler.queued(*Priority)

    async def _idle(self) -> None:
        """Returns once the device thread has finished no job for `idle_s` and none waits (checked every
        `idle_s`); a job still running then is waited for behind it, at the lowest priority."""
        while True:
            busy_before = self.scheduler.busy_s
            await asyncio.sleep(self.idle_s)
            if not self._queued() and self.scheduler.busy_s == busy_before:
                return
