"""The ranker's data plane: PreInfer and Rank as plain calls, with no transport in them.

The servicer translates protobuf into these calls and their results back; everything a request does
happens here, each step once:

    Rank:     shed (queue full, or a deadline shorter than the cheapest rank)
              -> cache.acquire (the prefix: HBM, DRAM, extended, or none)
              -> runner.rank / runner.uncached (the scores)
              -> cache.release, metrics
    PreInfer: cache.pre_infer (start, join, renew or refuse a production), metrics, load report
    PreInferBatch: cache.pre_infer_many (each entry as a PreInfer, in order; their device jobs handed over
              together), metrics per entry and the batch's size, one load report
    GetProfile: the model, the latency curve, the tiers' budgets

The latency curve that shedding, the load book and GetProfile read is the data plane's own: `warm_up`
measures it on the device, and the load book's `Calibration` corrects it from then on by what the jobs
took (GetProfile answers the corrected curve). `load_report` is what the ranker tells the trigger with every
PreInfer answer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
from opentelemetry.trace import Span

from relaygr.v1 import common_pb2, ranker_pb2
from services.common import tracing
from services.common.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from services.common.metrics import Children, enum_label
from services.ranker import metrics
from services.ranker.cache import PrefixLifecycle
from services.ranker.cache.acquired import Acquired, Source
from services.ranker.config import RankerConfig
from services.ranker.engine.calibration import Calibration
from services.ranker.engine.device_time import device_time, trace_device
from services.ranker.engine.latency_curve import LatencyCurve, Profiling, Timer, measure
from services.ranker.engine.load import LoadReport
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import FOR_RANKS, Op, Priority, Scheduler
from services.ranker.model.events import Events


@dataclasses.dataclass(frozen=True)
class Profile:
    """The model, its latency curve (measured at warm-up, corrected since), and the tiers' byte budgets."""

    preset: str
    kv_bytes_per_token: int
    model_version: str
    curve: LatencyCurve
    hbm_capacity_bytes: int
    dram_capacity_bytes: int


@dataclasses.dataclass(frozen=True)
class PreInferResult:
    outcome: int  # a ranker_pb2.PreInferOutcome
    cache_bytes: int


@dataclasses.dataclass(frozen=True)
class RankResult:
    scores: list[float]
    source: Source
    miss_reason: int  # a common_pb2.MissReason
    lossy: bool
    computed_prefix_events: int  # long-term events computed on this Rank's critical path
    prefix_wait_ms: float  # the wait for the prefix (its production, when there was one)


# Metric labels of the protobuf enums, named once.
_OUTCOMES = {v: enum_label(ranker_pb2.PreInferOutcome, v) for v in ranker_pb2.PreInferOutcome.values()}
_MISSES = {v: enum_label(common_pb2.MissReason, v) for v in common_pb2.MissReason.values()}


class DataPlane:
    def __init__(
        self, config: RankerConfig, runner: ModelRunner, cache: PrefixLifecycle, scheduler: Scheduler
    ) -> None:
        self.config = config
        self.runner = runner
        self.cache = cache
        self.scheduler = scheduler
        # Each labelled series looked up once, not on every request.
        self._outcomes = Children(metrics.PRE_INFER_OUTCOMES)
        self._ranks = Children(metrics.RANK_REQUESTS)
        self._lossy = Children(metrics.RANK_LOSSY)
        self._misses = Children(metrics.RANK_MISSES)
        self._latency = Children(metrics.RANK_LATENCY)

    async def warm_up(self) -> LatencyCurve:
        """Measures the latency curve on the device thread; shedding and GetProfile use it from then on."""
        timer = self.timer()
        curve = await self.scheduler.submit(lambda: measure(timer), Priority.RANK, Op.PROFILE)
        self.calibration.set_curve(curve)
        return curve

    def profiling(self) -> Profiling:
        """How the warm-up measures: disturbance is judged on a CPU device only (on an accelerator the
        device thread waits for the device without spending CPU)."""
        config = self.config
        cpu = self.runner.device.type == "cpu"
        return Profiling(
            config.profile_length_list(),
            config.profile_short_term,
            config.profile_candidates,
            config.profile_repeats,
            config.profile_retry_rounds,
            config.profile_disturbed_ratio if cpu else None,
        )

    def timer(self) -> Timer:
        """What times the curve's lengths on the device thread (the warm-up's, and a recheck's)."""
        return Timer(self.runner, self.profiling())

    @property
    def calibration(self) -> Calibration:
        """The latency curve as measured by `warm_up` (None before), and corrected since."""
        return self.cache.load.calibration

    def profile(self) -> Profile:
        """What GetProfile answers; Unavailable until the warm-up has measured the latency curve."""
        if self.calibration.curve is None:
            raise Unavailable("warming up: the latency curve is not measured yet")
        preset, version = self.runner.model.preset, self.runner.model_version
        hbm, dram = self.cache.budgets()
        curve = self.calibration.corrected()
        return Profile(preset.name, preset.kv_bytes_per_token, version, curve, hbm, dram)

    def load_report(self) -> LoadReport:
        cache, config = self.cache, self.config
        return cache.load.report(
            config.instance_name, cache.leased_bytes(), cache.budgets()[0], config.lease_ttl_ms
        )

    def decoded(self, user_id: str, wire_digest: bytes) -> Events | None:
        """Events already decoded from the same wire bytes of this user's history (see the cache)."""
        return self.cache.decoded(user_id, wire_digest)

    async def pre_infer(self, user_id: str, events: Events) -> PreInferResult:
        outcome, nbytes = await self.cache.pre_infer(user_id, events)
        label = _OUTCOMES[outcome]
        self._outcomes(label).inc()
        span = tracing.current()
        if span.is_recording():
            span.set_attributes(
                {
                    "relaygr.user_hash": tracing.user_hash(user_id),
                    "relaygr.instance": self.config.instance_name,
                    "relaygr.long_term_length": len(events),
                    "relaygr.pre_infer_outcome": label,
                }
            )
        return PreInferResult(outcome, nbytes)

    async def pre_infer_batch(self, entries: Sequence[tuple[str, Events]]) -> list[PreInferResult]:
        """The entries of a PreInferBatch (user id, long-term events), each answered as `pre_infer` alone
        in the same order would be; their productions are scheduled as one."""
        answers = await self.cache.pre_infer_many(entries)
        for outcome, _ in answers:
            self._outcomes(_OUTCOMES[outcome]).inc()
        if entries:
            metrics.PRE_INFER_BATCH_SIZE.observe(len(entries))
        span = tracing.current()
        if span.is_recording():
            span.set_attributes(
                {"relaygr.instance": self.config.instance_name, "relaygr.pre_infer_batch_size": len(entries)}
            )
        return [PreInferResult(outcome, nbytes) for outcome, nbytes in answers]

    async def rank(
        self,
        user_id: str,
        long_term: Events,
        short_term: Events,
        candidates: np.ndarray,
        relay_instance: str,
        time_remaining_s: float | None,
        received_at: float | None = None,
    ) -> RankResult:
        """Scores `candidates` for the user; `time_remaining_s` is the caller's deadline (None: none).
        The latency metric counts from `received_at` (`time.perf_counter()`; default: now)."""
        started = time.perf_counter() if received_at is None else received_at
        deadline = self._admit(len(long_term), time_remaining_s)
        load, cost_ms = self.cache.load, self.cache.load.cost_ms("rank_ms", len(long_term))
        load.add_rank(cost_ms)
        try:
            waited = time.perf_counter()
            with tracing.span("prefix") as prefix_span:
                acquired = await self.cache.acquire(user_id, long_term, relay_instance, deadline)
                _describe(prefix_span, acquired)
            prefix_wait_ms = (time.perf_counter() - waited) * 1000
            try:
                if acquired.entry is None:
                    job = self.runner.uncached(long_term, short_term, candidates, deadline)
                else:
                    job = self.runner.rank(acquired.entry.hbm, short_term, candidates, deadline)
                scores = await job
                trace_device(job, "model", uncached=acquired.entry is None)
            finally:
                self.cache.release(acquired)
        finally:
            load.add_rank(-cost_ms)
        source = acquired.source
        lossy = acquired.entry is not None and acquired.entry.lossy
        self._ranks(source.label).inc()
        if lossy:
            self._lossy(source.label).inc()
        miss_label = _MISSES[acquired.miss_reason]
        if source is Source.MISS:
            self._misses(miss_label).inc()
        self._latency(source.label).observe(time.perf_counter() - started, tracing.exemplar())
        span = tracing.current()
        if span.is_recording():
            timing = device_time(job)
            span.set_attributes(
                {
                    "relaygr.user_hash": tracing.user_hash(user_id),
                    "relaygr.instance": self.config.instance_name,
                    "relaygr.long_term_length": len(long_term),
                    "relaygr.cache_source": source.label,
                    "relaygr.miss_reason": miss_label if source is Source.MISS else "",
                    "relaygr.batch_size": timing.batch_size if timing is not None else 1,
                    "relaygr.lossy": lossy,
                }
            )
        # Without an entry the runner computed the whole prefix on the Rank's path (`uncached`).
        computed = len(long_term) if acquired.entry is None else acquired.computed_events
        return RankResult(scores, source, acquired.miss_reason, lossy, computed, prefix_wait_ms)

    def _admit(self, length: int, time_remaining_s: float | None) -> float | None:
        """Sheds a Rank before any work when the device queue is full or its deadline cannot be met;
        otherwise its deadline as a `time.monotonic()` instant (None: no deadline)."""
        if self.scheduler.queued(*FOR_RANKS) >= self.config.max_queued_ranks:
            metrics.SHED_REQUESTS.labels("Rank", "queue_full").inc()
            raise ResourceExhausted(f"rank queue is full ({self.config.max_queued_ranks} waiting)")
        if time_remaining_s is None:
            return None
        if self.calibration.provisional:  # its figures may be far too slow: no Rank is shed on them
            return time.monotonic() + time_remaining_s
        cheapest_ms = self.calibration.predict_ms("rank_ms", max(length, 1))  # 0 before warm-up
        if time_remaining_s * 1000 < cheapest_ms:
            metrics.SHED_REQUESTS.labels("Rank", "deadline").inc()
            raise DeadlineExceeded(
                f"deadline in {time_remaining_s * 1000:.1f} ms is shorter than the "
                f"{cheapest_ms:.1f} ms a rank takes"
            )
        return time.monotonic() + time_remaining_s


def _describe(span: Span, acquired: Acquired) -> None:
    """What the Rank's wait for its prefix was, on its `prefix` span: served from HBM at once (`hit`), a
    production joined (`joined`), or one it started (`reloaded`, `extended`, `computed`), or none
    (`uncached`: no room to cache it); linked to the PreInfer whose prefix it consumes, when sampled."""
    if not span.is_recording():
        return
    if acquired.joined:
        how = "joined"
    elif acquired.entry is None:
        how = "uncached"
    else:
        how = {
            Source.HBM: "hit",
            Source.DRAM: "reloaded",
            Source.EXTENDED: "extended",
            Source.PEER: "peer",
        }.get(acquired.source, "computed")
    span.set_attributes({"relaygr.production": how, "relaygr.cache_source": acquired.source.label})
    if acquired.pre_infer is not None:
        span.add_link(acquired.pre_infer, {"relaygr.relation": "pre_infer"})
