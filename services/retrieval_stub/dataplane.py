"""The retrieval stub's data plane: a Recommend as a plain call, with no transport in it.

The servicer translates a RecommendRequest into `RecommendPlane.recommend(user_id, top_k)` and the
`Recommendation` back; everything a Recommend does happens here, each step once:

    Recommend: validate (`user_id`; `top_k` in 1..num_candidates: the one place)
               -> retrieve (the user's history and candidates from the universe at one request time, which
                  the answer returns as `request_time_ms`, so the exact ranking request can be rebuilt)
               -> Admit (relay on) while pre-processing runs for the relay window (`relay_window_ms`)
               -> abandoned? (`abandon_fraction`) -> Rank with the Admit's relay hint
               -> the top-k candidates by score, best first, metrics

The calls upstream are the `Upstream` the plane is given (`services.retrieval_stub.servicer.GrpcUpstream`
over gRPC; a test's fake without a server). An Admit that fails or misses its deadline comes back as
`NOT_ADMITTED` (no hint: ranking without relay), never a failed Recommend; with the relay off (the
baseline) no Admit is sent. A failed Rank fails the Recommend with the Rank's own status code.

An abandoned request (a share `abandon_fraction` of them, filtered upstream during pre-processing) still
did its retrieval and its Admit, so the trigger may have pre-inferred a prefix that no Rank will consume;
it answers with `abandoned` set and nothing ranked. Which requests are abandoned is a hash of (universe
seed, user, request time) (`abandoned`), not a process's random state, so the relay and the baseline
abandon the same requests.

The history is encoded for the wire once (`Upstream.encode`: 1.7 ms for 8192 events) and the same encoding
goes to the Admit and the Rank; the plane passes it along without reading it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from typing import Any, Protocol

import numpy as np

from services.common import tracing, validation
from services.common.contract import cache_source_label
from services.common.metrics import Children
from services.retrieval_stub import metrics
from services.retrieval_stub.config import RetrievalStubConfig
from services.workload.universe import UserHistory, UserUniverse

_LATENCY = Children(metrics.RECOMMEND_LATENCY)
_RECOMMENDS = Children(metrics.RECOMMENDS)


@dataclasses.dataclass(frozen=True, eq=False)
class Retrieved:
    """What retrieval found for one request: the history and candidates at `now_ms`."""

    user_id: str
    now_ms: int
    history: UserHistory
    candidates: np.ndarray  # int64 item ids


@dataclasses.dataclass(frozen=True)
class Admitted:
    """The trigger's answer to an Admit; `reason` is an AdmitReason value."""

    admitted: bool
    reason: int
    relay_instance: str


NOT_ADMITTED = Admitted(admitted=False, reason=0, relay_instance="")


@dataclasses.dataclass(frozen=True, eq=False)
class Ranked:
    """A Rank's answer: a score per candidate, in candidate order, and where its prefix came from
    (`cache_source` a CacheSource value, `miss_reason` a MissReason value)."""

    scores: np.ndarray  # float32
    cache_source: int
    instance: str
    miss_reason: int
    lossy: bool
    computed_prefix_events: int
    prefix_wait_ms: float


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """A Recommend's answer: the top-k items, best first (none when abandoned), and how they were ranked."""

    item_ids: list[int]
    scores: list[float]
    admit: Admitted
    long_term_length: int
    request_time_ms: int
    abandoned: bool = False
    cache_source: int = 0
    instance: str = ""
    miss_reason: int = 0
    lossy: bool = False
    rank_latency_ms: float = 0.0
    computed_prefix_events: int = 0
    prefix_wait_ms: float = 0.0


class Upstream(Protocol):
    """The stub's calls to the trigger and the rankers."""

    def encode(self, retrieved: Retrieved) -> Any:
        """The history in the form both calls send (encoded once, opaque to the plane)."""

    async def admit(self, retrieved: Retrieved, encoded: Any) -> Admitted:
        """TriggerService.Admit; NOT_ADMITTED when it fails or misses its deadline (`--admit-timeout-ms`)."""

    async def rank(self, retrieved: Retrieved, encoded: Any, relay_instance: str) -> Ranked:
        """RankerService.Rank with the relay hint, within `--rank-timeout-ms`; raises what the Rank failed
        with (its status code is the Recommend's)."""


def top_k_order(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores, best first; equal scores keep candidate order."""
    return np.argsort(-scores, kind="stable")[:k]


def abandoned(universe_seed: int, user_id: str, request_time_ms: int, fraction: float) -> bool:
    """Whether the request of `user_id` at `request_time_ms` is filtered before ranking: a uniform draw
    from a blake2b digest of (seed, user, time), below `fraction`. The same in every process and mode."""
    if fraction <= 0:
        return False
    key = f"{universe_seed}\x00{user_id}\x00{request_time_ms}".encode()
    word = int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"abandon").digest(), "little")
    return word / 2**64 < fraction


class RecommendPlane:
    """Stateless apart from its upstream; safe for concurrent Recommends."""

    def __init__(self, config: RetrievalStubConfig, universe: UserUniverse, upstream: Upstream) -> None:
        self.config = config
        self.universe = universe
        self.upstream = upstream

    async def recommend(self, user_id: str, top_k: int) -> Recommendation:
        started = time.perf_counter()
        self._validate(user_id, top_k)
        retrieved = self._retrieve(user_id)
        long_term_length = len(retrieved.history.long_term)
        span = tracing.current()
        if span.is_recording():
            span.set_attributes(
                {
                    "relaygr.user_hash": tracing.user_hash(user_id),
                    "relaygr.long_term_length": long_term_length,
                }
            )
        encoded = self.upstream.encode(retrieved)
        admit, _ = await asyncio.gather(self._admit(retrieved, encoded), self._preprocess())
        if span.is_recording():
            span.set_attributes(
                {"relaygr.admitted": admit.admitted, "relaygr.relay_instance": admit.relay_instance}
            )
        seed = self.universe.config.universe_seed
        if abandoned(seed, user_id, retrieved.now_ms, self.config.abandon_fraction):
            metrics.RECOMMEND_ABANDONED.inc()
            span.set_attribute("relaygr.abandoned", True)
            return Recommendation([], [], admit, long_term_length, retrieved.now_ms, abandoned=True)

        rank_started = time.perf_counter()
        ranked = await self.upstream.rank(retrieved, encoded, admit.relay_instance)
        rank_seconds = time.perf_counter() - rank_started
        best = top_k_order(ranked.scores, top_k)
        exemplar = tracing.exemplar()
        _LATENCY("rank").observe(rank_seconds, exemplar)
        _LATENCY("total").observe(time.perf_counter() - started, exemplar)
        source = cache_source_label(ranked.cache_source)
        if span.is_recording():
            span.set_attributes({"relaygr.cache_source": source, "relaygr.instance": ranked.instance})
        _RECOMMENDS(source).inc()
        return Recommendation(
            item_ids=retrieved.candidates[best].tolist(),
            scores=ranked.scores[best].tolist(),
            admit=admit,
            long_term_length=long_term_length,
            request_time_ms=retrieved.now_ms,
            cache_source=ranked.cache_source,
            instance=ranked.instance,
            miss_reason=ranked.miss_reason,
            lossy=ranked.lossy,
            rank_latency_ms=rank_seconds * 1000,
            computed_prefix_events=ranked.computed_prefix_events,
            prefix_wait_ms=ranked.prefix_wait_ms,
        )

    def _validate(self, user_id: str, top_k: int) -> None:
        """Every check of a Recommend."""
        validation.user_id(user_id)
        validation.positive(top_k, "top_k", self.universe.config.num_candidates)

    def _retrieve(self, user_id: str) -> Retrieved:
        now_ms = self.universe.now_ms()
        history = self.universe.history(user_id, now_ms)
        return Retrieved(user_id, now_ms, history, self.universe.candidates(user_id, now_ms))

    async def _admit(self, retrieved: Retrieved, encoded: Any) -> Admitted:
        if not self.config.relay:
            return NOT_ADMITTED
        return await self.upstream.admit(retrieved, encoded)

    async def _preprocess(self) -> None:
        """Pre-processing (feature assembly upstream of ranking), simulated: it takes the relay window, in
        which the relay pre-infers the prefix. A span of its own in a sampled trace."""
        with tracing.span("preprocess", window_ms=self.config.relay_window_ms):
            await asyncio.sleep(self.config.relay_window_ms / 1000)
