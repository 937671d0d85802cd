"""The ranker's load, kept as work starts and ends: what its load report tells the trigger.

Costs are device milliseconds estimated from the ranker's own latency curve (measured at warm-up on this
device, corrected since by what its jobs took: `Calibration`), so they are comparable with each other and
with a relay window:

- rank backlog: every Rank in flight (queued or running) at the cost of a cached rank of its length, plus
  the prefix computations that misses started (a miss waits for its prefix): the wait a new Rank sees;
- pre-inference backlog: the productions a PreInfer started (compute or extend) and not yet finished;
- leased bytes: the HBM of pre-inferred prefixes no Rank has consumed (leased entries and the
  reservations of pre-inference in flight);
- consumed and wasted pre-inference: tokens a PreInfer computed whose prefix a Rank then used, or did not
  (its lease expired, or the entry was dropped), and the wasted ones' device ms: the relay's only true
  waste, which the trigger budgets;
- busy fraction: the device thread's share of about the last second spent on jobs (of the time since the
  previous report, when reports are rarer).

Before warm-up has measured the curve every cost is 0 (nothing is served then). Not thread-safe: the
event loop updates it; the device thread's busy time is read from the scheduler.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from services.common.metrics import Children
from services.ranker import metrics
from services.ranker.engine.calibration import PATHS, Calibration
from services.ranker.engine.scheduler import Scheduler

BUSY_WINDOW_S = 1.0  # the busy fraction is measured over about this much of the recent past


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """The ranker's load as it stands; mirrors ranker_pb2.LoadReport."""

    instance: str
    busy_fraction: float
    rank_backlog_ms: float
    pre_infer_backlog_ms: float
    leased_bytes: int
    hbm_capacity_bytes: int
    lease_ttl_ms: int
    pre_infer_consumed_tokens: int
    pre_infer_wasted_tokens: int
    pre_infer_wasted_ms: float
    device_busy_ms: float


class BusyMeter:
    """The share of the recent past a scheduler's thread spent on jobs, from its cumulative busy time."""

    def __init__(self, scheduler: Scheduler, clock: Callable[[], float] = time.monotonic) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def fraction(self) -> float:
        now, busy = self._clock(), self._scheduler.busy_s
        samples = self._samples
        if not samples or now - samples[-1][0] >= BUSY_WINDOW_S / 10:
            samples.append((now, busy))
        while len(samples) > 2 and now - samples[1][0] >= BUSY_WINDOW_S:
            samples.popleft()
        then, busy_then = samples[0]
        if now - then <= 0:
            return 0.0
        return min(1.0, max(0.0, (busy - busy_then) / (now - then)))


class LoadBook:
    """Backlogs and the fate of pre-inferred tokens, updated by the data plane, the cache and the leases."""

    def __init__(
        self,
        scheduler: Scheduler,
        clock: Callable[[], float] = time.monotonic,
        calibration: Calibration | None = None,
    ) -> None:
        # The corrected curve (its measured curve set by warm-up).
        self.calibration = calibration if calibration is not None else Calibration()
        self._scheduler = scheduler
        self._busy = BusyMeter(scheduler, clock)
        self.rank_backlog_ms = 0.0
        self.pre_infer_backlog_ms = 0.0
        self.pre_infer_reserved_bytes = 0
        self.consumed_tokens = 0
        self.wasted_tokens = 0
        self.wasted_ms = 0.0
        # The backlogs, read when the metrics are scraped.
        metrics.RANK_BACKLOG_SECONDS.set_function(lambda: max(0.0, self.rank_backlog_ms) / 1000)
        metrics.PRE_INFER_BACKLOG_SECONDS.set_function(lambda: max(0.0, self.pre_infer_backlog_ms) / 1000)
        ratio = self.calibration.ratio  # replaced per path, never as a whole
        for path in PATHS:
            metrics.COST_CORRECTION.labels(path).set_function(lambda path=path: ratio[path])
        self._tokens = Children(metrics.PRE_INFER_TOKENS)

    def cost_ms(self, op: str, length: int) -> float:
        """The corrected curve's `op` (pre_infer_ms, rank_ms, full_ms) at `length`; 0 before warm-up."""
        return self.calibration.predict_ms(op, length)

    def add_rank(self, ms: float) -> None:
        self.rank_backlog_ms += ms

    def add_pre_infer(self, ms: float, reserved_bytes: int) -> None:
        self.pre_infer_backlog_ms += ms
        self.pre_infer_reserved_bytes += reserved_bytes

    def relay_ended(self, tokens: int, ms: float, consumed: bool) -> None:
        """A pre-inferred prefix's lease ended: a Rank consumed it, or none did (its device time wasted)."""
        if tokens <= 0:
            return
        if consumed:
            self.consumed_tokens += tokens
            self._tokens("consumed").inc(tokens)
        else:
            self.wasted_tokens += tokens
            self.wasted_ms += ms
            self._tokens("wasted").inc(tokens)
            metrics.PRE_INFER_WASTED_SECONDS.inc(ms / 1000)

    def report(
        self, instance: str, leased_bytes: int, hbm_capacity_bytes: int, lease_ttl_ms: int
    ) -> LoadReport:
        return LoadReport(
            instance=instance,
            busy_fraction=round(self._busy.fraction(), 4),
            rank_backlog_ms=max(0.0, self.rank_backlog_ms),
            pre_infer_backlog_ms=max(0.0, self.pre_infer_backlog_ms),
            leased_bytes=leased_bytes + self.pre_infer_reserved_bytes,
            hbm_capacity_bytes=hbm_capacity_bytes,
            lease_ttl_ms=lease_ttl_ms,
            pre_infer_consumed_tokens=self.consumed_tokens,
            pre_infer_wasted_tokens=self.wasted_tokens,
            pre_infer_wasted_ms=self.wasted_ms,
            device_busy_ms=self._scheduler.busy_s * 1000,
        )
