"""Demo traffic for the local fleet: open-loop Recommend calls and a live one-line progress display.

Users are drawn uniformly from `user-0 … user-<demo_users - 1>`, so with a few thousand users some come
back within the DRAM tier's TTL and the display shows every cache source. Rates and percentiles cover
the last `window_s` seconds; cache-source, miss-reason and error counts cover the whole run.

Every miss says why (`miss_label`): a request the trigger did not admit by the trigger's reason (`no-gain`,
`shed`, ... or `no-admit` when no Admit answered: relay off, or the call failed), an admitted one by the
ranker's miss reason (`cold`, `hbm-evicted`, `elsewhere`, ...). The closing `summary()` says what the
relay saved: the Ranks that reused a cached prefix and the long-term events they did not compute on the
critical path (from the responses), and, with the rankers' measured latency curve (`RankCosts`, from
GetProfile), the time that took off each cached Rank: what its own history would have cost the model
without the cache. A cached Rank is never compared with the misses, which rank other histories: mostly
short ones the trigger refused because relay would not have paid for them (`no-gain`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable

import grpc
import numpy as np

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc, recommend_pb2, recommend_pb2_grpc, trigger_pb2
from services.common.config import ServiceConfig, setting
from services.common.contract import CACHE_SOURCES, cache_source_label
from services.common.server import dial
from services.launcher.fleet import FleetConfig
from services.loadgen.openloop import CallRecord, run_open_loop


@dataclasses.dataclass(frozen=True)
class LauncherConfig(FleetConfig):
    demo_rps: float = setting(
        10.0, "Recommend calls per second of demo traffic, Poisson arrivals (0: none)", minimum=0
    )
    duration_s: float = setting(0.0, "seconds to run before stopping everything (0: until Ctrl-C)", minimum=0)
    demo_users: int = setting(2000, "demo users are drawn uniformly from user-0 … user-<N-1>", above=0)
    top_k: int = setting(10, "top_k of each demo Recommend", above=0)
    demo_seed: int = setting(0, "seed of the demo's arrivals and user draws")
    demo_timeout_ms: float = setting(2000.0, "deadline of each demo Recommend", above=0)
    progress_window_s: float = setting(
        10.0, "seconds the progress line's rate and percentiles cover", above=0
    )

    def validate(self) -> None:
        super().validate()


Miss = common_pb2.MissReason
Admit = trigger_pb2.AdmitReason
# Why a request was not admitted (the trigger's AdmitReason), as the progress line says it.
NOT_ADMITTED_LABELS = {
    Admit.ADMIT_REASON_UNSPECIFIED: "no-admit",  # no Admit answered: relay off, or the call failed
    Admit.ADMIT_REASON_NO_GAIN: "no-gain",
    Admit.ADMIT_REASON_HBM_LIMIT: "hbm-limit",
    Admit.ADMIT_REASON_BACKLOG_LIMIT: "backlog",
    Admit.ADMIT_REASON_DUPLICATE: "duplicate",
    Admit.ADMIT_REASON_RANKER_REFUSED: "refused",
    Admit.ADMIT_REASON_WASTE_LIMIT: "waste-limit",
    Admit.ADMIT_REASON_SHED_SHORT: "shed",
}
# Why an admitted request's Rank still missed (the ranker's MissReason).
MISS_LABELS = {
    Miss.MISS_REASON_UNSPECIFIED: "unknown",
    Miss.MISS_REASON_NEVER_PRE_INFERRED: "never",
    Miss.MISS_REASON_COLD: "cold",
    Miss.MISS_REASON_EVICTED_HBM: "hbm-evicted",
    Miss.MISS_REASON_EVICTED_DRAM: "dram-evicted",
    Miss.MISS_REASON_LEASE_EXPIRED: "expired",
    Miss.MISS_REASON_STALE_PREFIX: "stale",
    Miss.MISS_REASON_REJECTED_CAPACITY: "rejected",
    Miss.MISS_REASON_ROUTED_ELSEWHERE: "elsewhere",
}
MISS = cache_source_label(common_pb2.CACHE_SOURCE_MISS)


def miss_label(response: recommend_pb2.RecommendResponse) -> tuple[bool, str]:
    """(admitted, why) of a Recommend whose Rank missed: a request the trigger did not admit missed because
    of that, whatever the ranker found; an admitted one by the ranker's miss reason."""
    if not response.admitted:
        return False, NOT_ADMITTED_LABELS.get(response.admit_reason, "no-admit")
    return True, MISS_LABELS.get(response.miss_reason, "unknown")


@dataclasses.dataclass(frozen=True)
class RankCosts:
    """What a Rank costs the model at a long-term length, from the rankers' measured latency curve (the
    GetProfile answer: in-process medians of the full pass, the cached rank and the pre-inference at each
    profiled length). Between profiled lengths a cost is linear; below the shortest, linear down to nothing
    at no history; beyond the longest, the longest's (which understates what a longer history saves)."""

    lengths: tuple[int, ...]
    full_ms: tuple[float, ...]  # the Rank without a cache: the whole sequence on the critical path
    rank_ms: tuple[float, ...]  # the Rank from a cached prefix
    pre_infer_ms: tuple[float, ...]  # computing the prefix alone

    @classmethod
    def of(cls, profile: ranker_pb2.GetProfileResponse) -> RankCosts | None:
        """The costs in `profile`, or None when it holds no curve."""
        points = sorted(profile.latency_curve, key=lambda point: point.prefix_length)
        if not points:
            return None
        return cls(
            tuple(point.prefix_length for point in points),
            tuple(point.full_ms for point in points),
            tuple(point.rank_ms for point in points),
            tuple(point.pre_infer_ms for point in points),
        )

    def _at(self, costs: Iterable[float], length: int) -> float:
        return float(np.interp(length, (0, *self.lengths), (0.0, *costs)))

    def saved_ms(self, length: int, computed: int) -> float:
        """Model time the cache took off a Rank of `length` long-term events that computed `computed` of them
        itself (an extension's appended events): the full pass less the cached rank, less the pre-inference
        of the appended events."""
        gap = self._at((full - rank for full, rank in zip(self.full_ms, self.rank_ms, strict=True)), length)
        appended = self._at(self.pre_infer_ms, length) - self._at(self.pre_infer_ms, length - computed)
        return max(0.0, gap - appended)


async def fetch_rank_costs(address: str, tls: ServiceConfig, timeout_s: float = 5.0) -> RankCosts | None:
    """The rankers' latency curve from GetProfile at `address` (a router answers as a ranker); None when it
    does not answer: the summary then says only what the responses say."""
    try:
        async with dial(address, tls) as channel:
            stub = ranker_pb2_grpc.RankerServiceStub(channel)
            profile = await stub.GetProfile(ranker_pb2.GetProfileRequest(), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return None
    return RankCosts.of(profile)


@dataclasses.dataclass(frozen=True)
class _Sample:
    done_s: float
    latency_ms: float
    rank_ms: float | None  # None when the Recommend failed


class DemoProgress:
    """Rolling statistics of the demo's Recommend calls. Used from one event loop."""

    def __init__(
        self, window_s: float, clock: Callable[[], float] = time.monotonic, costs: RankCosts | None = None
    ) -> None:
        self.window_s = window_s
        self.costs = costs
        self.clock = clock
        self.started_s = clock()
        self.samples: collections.deque[_Sample] = collections.deque()
        self.cache_sources: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        # Misses by (admitted, why): see `miss_label`.
        self.misses: collections.Counter[tuple[bool, str]] = collections.Counter()
        self.admitted = 0
        self.total = 0
        # Over the whole run, the Ranks answered with a cached prefix (hits) and without (misses): their
        # count, summed Rank latency and long-term events, and the long-term events computed on the critical
        # path; for the hits, the model time the cache took off them (`RankCosts.saved_ms`, with a curve).
        self.ranked = {True: 0, False: 0}
        self.rank_ms = {True: 0.0, False: 0.0}
        self.ranked_events = {True: 0, False: 0}
        self.computed_events = 0
        self.saved_ms = 0.0

    def add(self, record: CallRecord) -> None:
        self.total += 1
        rank_ms = None
        if record.ok:
            response: recommend_pb2.RecommendResponse = record.response
            rank_ms = response.rank_latency_ms
            source = cache_source_label(response.cache_source)
            self.cache_sources[source] += 1
            self.admitted += response.admitted
            if source == MISS:
                self.misses[miss_label(response)] += 1
            if source in CACHE_SOURCES:  # ranked (an abandoned request has no Rank and no source)
                hit = source != MISS
                self.ranked[hit] += 1
                self.rank_ms[hit] += response.rank_latency_ms
                self.ranked_events[hit] += response.long_term_length
                self.computed_events += response.computed_prefix_events
                if hit and self.costs is not None:
                    length, computed = response.long_term_length, response.computed_prefix_events
                    self.saved_ms += self.costs.saved_ms(length, computed)
        else:
            self.errors[record.code.name] += 1
        self.samples.append(_Sample(self.clock(), record.latency_s * 1000, rank_ms))

    def miss_text(self) -> str:
        """The misses split by why, most first: `not admitted: no-gain 120 shed 10; cold 30 elsewhere 20`."""

        def counts(admitted: bool) -> str:
            rows = sorted((-n, why) for (a, why), n in self.misses.items() if a == admitted)
            return " ".join(f"{why} {-n}" for n, why in rows)

        parts = [f"not admitted: {text}" if (text := counts(False)) else "", counts(True)]
        return "; ".join(part for part in parts if part)

    def summary(self) -> str:
        """What the relay saved over the run: the Ranks that reused a cached prefix and the long-term events
        not recomputed (from the responses), and, with the rankers' curve, the time that took off each
        cached Rank against its own history ranked without the cache."""
        hits, misses = self.ranked[True], self.ranked[False]
        ranks = hits + misses
        if not ranks:
            return "relay: no Rank was answered, nothing to compare."
        events = self.ranked_events[True] + self.ranked_events[False]
        saved = events - self.computed_events
        sentence = (
            f"relay: {hits} of {ranks} Ranks ({hits / ranks:.0%}) reused a cached prefix, "
            f"{saved:,} of {events:,} long-term events ({saved / max(events, 1):.0%}) not recomputed on the "
            "critical path"
        )
        if hits and self.costs is not None:
            took, off = self.rank_ms[True] / hits, self.saved_ms / hits
            sentence += (
                f"; a cached Rank took {took:.1f} ms on average, and computing its own history without the "
                f"cache would have added {off:.1f} ms (the rankers' measured curve at its length): relay "
                f"took {self.saved_ms / 1000:,.1f} s off the critical path in all"
            )
        if hits and misses:
            missed, cached = self.ranked_events[False] / misses, self.ranked_events[True] / hits
            sentence += (
                f". The {misses} {'miss' if misses == 1 else 'misses'} ranked histories of {missed:,.0f} "
                "long-term events on average, "
                f"against {cached:,.0f} for the cached Ranks (why each missed: the line above)"
            )
        return sentence + "."

    def _recent(self) -> list[_Sample]:
        horizon = self.clock() - self.window_s
        while self.samples and self.samples[0].done_s < horizon:
            self.samples.popleft()
        return list(self.samples)

    def line(self) -> str:
        recent = self._recent()
        elapsed = self.clock() - self.started_s
        rate = len(recent) / min(self.window_s, elapsed) if elapsed > 0 else 0.0
        ok = [sample for sample in recent if sample.rank_ms is not None]

        def p50_p99(values: list[float]) -> str:
            if not values:
                return "P50 -  P99 -"
            p50, p99 = np.percentile(values, [50, 99])
            return f"P50 {p50:5.1f}  P99 {p99:6.1f} ms"

        # A peer (a prefix handed off or fetched from another ranker) shows once one has answered; the
        # misses last, their reasons after them.
        shown = [s for s in CACHE_SOURCES if s != "miss" and (s != "peer" or self.cache_sources[s])]
        sources = " ".join(f"{source} {self.cache_sources[source]}" for source in [*shown, "miss"])
        if self.misses:
            sources += f" ({self.miss_text()})"
        errors = sum(self.errors.values())
        error_text = f"errors {errors}" + (f" ({self.errors.most_common(1)[0][0]})" if errors else "")
        return (
            f"[{elapsed:5.0f}s] {rate:5.1f} req/s | Recommend {p50_p99([s.latency_ms for s in ok])} | "
            f"Rank {p50_p99([s.rank_ms for s in ok])} | {sources} | admitted {self.admitted} | {error_text}"
        )


async def drive_demo(
    address: str, config: LauncherConfig, progress: DemoProgress, stop: asyncio.Event
) -> None:
    """Sends demo Recommends to the retrieval stub until `duration_s` passes or `stop` is set."""
    if config.demo_rps == 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), config.duration_s or None)
        return
    users = np.random.default_rng(config.demo_seed)

    def request(_: int) -> recommend_pb2.RecommendRequest:
        user_id = f"user-{users.integers(config.demo_users)}"
        return recommend_pb2.RecommendRequest(user_id=user_id, top_k=config.top_k)

    async with dial(address, config.client_tls()) as channel:
        await run_open_loop(
            recommend_pb2_grpc.RecommendServiceStub(channel).Recommend,
            request,
            rate=config.demo_rps,
            duration_s=config.duration_s or None,
            timeout_s=config.demo_timeout_ms / 1000,
            seed=config.demo_seed,
            stop=stop,
            on_record=progress.add,
            collect=False,
        )
