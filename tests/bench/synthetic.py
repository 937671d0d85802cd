"""Measured points without a fleet: call records summarized by the benchmark's own `summarize`, so that
a point has exactly the keys and values a run gives it (as results.json holds it: `point`; as a run
records it: `point_of`)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import grpc

from bench.lib import codec
from bench.lib.points import PointSpec, summarize
from bench.lib.schema import Cost, Point, recorded
from relaygr.v1 import recommend_pb2
from services.loadgen.openloop import CallRecord

P = TypeVar("P", bound=Point)
SLO_MS = 100.0
CALLS = 100


def cost(rankers: dict[str, Any] | None = None) -> dict[str, Any]:
    """A made-up cost of a point: 0.5 ranker cores, 0.1 other cores of ours, 0.25 foreign cores."""
    return {
        "cpu_s": {"ranker-0": 3.0, "ranker-1": 2.0, "router": 1.0},
        "rankers": {"productions": {"compute": 50}, "joins": 4} if rankers is None else rankers,
        "wall_s": 10.0,
        "foreign_cores": 0.25,
    }


def point(
    rate: float,
    rank_ms: float,
    source: int,
    abandoned: int = 0,
    seed: int = 0,
    rankers: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A summarized point of CALLS ranked calls that all took `rank_ms` (plus `abandoned` abandoned
    ones), with a made-up cost."""
    spec = PointSpec(
        rate,
        warmup=0,
        measured=CALLS + abandoned,
        timeout_s=1,
        slo_ms=SLO_MS,
        max_error_fraction=0.001,
        seed=0,
    )
    answer = recommend_pb2.RecommendResponse(rank_latency_ms=rank_ms, cache_source=source, long_term_length=8)
    gone = recommend_pb2.RecommendResponse(abandoned=True, admitted=True)
    calls = [
        CallRecord(
            i, i / rate, i / rate, rank_ms / 1000, grpc.StatusCode.OK, "", gone if i < abandoned else answer
        )
        for i in range(CALLS + abandoned)
    ]
    result = summarize(calls, spec, aborted=False, wall_s=10.0)
    recorded_point = recorded(Point, result, seed=seed, cost=Cost(**cost(rankers)))
    return {**codec.to_json(recorded_point), **extra}


def point_of(kind: type[P], rate: float, rank_ms: float, *args: Any, **extra: Any) -> P:
    """`point` as a run records it: a `kind` (`Point`, `GpuPoint`) with `extra` fields, and the latency
    samples a run keeps in memory (CALLS of `rank_ms`; results.json does not hold them)."""
    recorded_point = codec.from_json(kind, point(rate, rank_ms, *args, **extra))
    return dataclasses.replace(recorded_point, rank_samples_ms=(rank_ms,) * CALLS)


def sweep(points: list[dict[str, Any]], best: float | None, **extra: Any) -> dict[str, Any]:
    """A sweep as `bench.run.experiments.Sweep` serializes it."""
    fields = {"refined": [], "repeats": [], "seeds_agree": None, **extra}
    return {"points": points, "best": best, "at_grid_top": False, **fields}
