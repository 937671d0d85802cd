"""The latency the router hop adds to a Rank with a long history, on loopback.

Starts one ranker (cpu-tiny, so model time is small) and a router in front of it as separate processes,
then, from this one process, sends the same Rank (an 8192-event long-term history by default, few
candidates) alternately straight to the ranker and through the router, and prints p50 and p99 of both
and their difference, plus the median of paired differences (each routed Rank against the direct one
next to it). Alternating keeps both paths under the same machine noise and the same cache state: after
the first Rank the prefix is reused from the ranker's cache tiers on every call.

    python -m bench router-hop [--iterations 500] [--long-term-events 8192] [--candidates 8]
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from collections.abc import Sequence

import grpc
import numpy as np

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.common.config import load, setting
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes


@dataclasses.dataclass(frozen=True)
class RouterHopBench:
    iterations: int = setting(500, "timed Ranks per path (direct, through the router), interleaved")
    warmup: int = setting(30, "untimed Ranks per path first")
    long_term_events: int = setting(8192, "long-term history length of the Rank")
    short_term_events: int = setting(16, "short-term history length of the Rank")
    candidates: int = setting(8, "candidates scored per Rank")
    model_preset: str = setting("cpu-tiny", "ranker model preset (small, so the hop is visible)")
    device: str = setting("cpu", "ranker device")


def behavior(length: int, first_item: int) -> common_pb2.BehaviorSequence:
    return common_pb2.BehaviorSequence(
        item_ids=range(first_item, first_item + length),
        action_types=[i % 4 for i in range(length)],
        timestamps_ms=range(1_700_000_000_000, 1_700_000_000_000 + length * 1000, 1000),
    )


def percentile(samples_ms: list[float], q: float) -> float:
    return float(np.percentile(samples_ms, q))


def measure(bench: RouterHopBench) -> None:
    ranker_args = [
        "--instance-name", "ranker-0", "--model-preset", bench.model_preset, "--device", bench.device,
        "--max-long-term-events", str(bench.long_term_events), "--profile-lengths", "64",
        "--profile-repeats", "1", "--profile-candidates", str(bench.candidates), "--log-level", "WARNING",
    ]  # fmt: skip
    with Processes() as procs:
        ranker = procs.start("ranker-0", "services.ranker", RANKER_SERVICE, ranker_args)
        ranker.wait_healthy(300)
        router_args = ["--rankers", f"ranker-0={ranker.address}", "--log-level", "WARNING"]
        router = procs.start("router", "services.router", RANKER_SERVICE, router_args)
        router.wait_healthy(60)

        request = ranker_pb2.RankRequest(
            user_id="bench-user",
            long_term=behavior(bench.long_term_events, 1_000),
            short_term=behavior(bench.short_term_events, 900_000),
            candidate_item_ids=range(500, 500 + bench.candidates),
        )
        payload = request.SerializeToString()
        with grpc.insecure_channel(ranker.address) as direct, grpc.insecure_channel(router.address) as routed:
            paths = {
                "direct": ranker_pb2_grpc.RankerServiceStub(direct).Rank,
                "router": ranker_pb2_grpc.RankerServiceStub(routed).Rank,
            }
            ranker_pb2_grpc.RankerServiceStub(direct).PreInfer(
                ranker_pb2.PreInferRequest(user_id=request.user_id, long_term=request.long_term), timeout=60
            )
            samples: dict[str, list[float]] = {name: [] for name in paths}
            sources: collections.Counter[str] = collections.Counter()
            for i in range(bench.warmup + bench.iterations):
                for name, rank in paths.items() if i % 2 == 0 else reversed(paths.items()):
                    started = time.perf_counter()
                    answer = rank(request, timeout=30)
                    elapsed_ms = (time.perf_counter() - started) * 1000
                    if i >= bench.warmup:
                        samples[name].append(elapsed_ms)
                        sources[common_pb2.CacheSource.Name(answer.cache_source)] += 1

    print(f"Rank request: {bench.long_term_events} long-term events, {bench.short_term_events} short-term, "
          f"{bench.candidates} candidates, {len(payload) / 1024:.1f} KiB on the wire; "
          f"{bench.iterations} timed Ranks per path; prefix sources {dict(sources)}")  # fmt: skip
    print(f"{'path':<8}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name, values in samples.items():
        print(f"{name:<8}{percentile(values, 50):>10.3f}{percentile(values, 99):>10.3f}"
              f"{statistics.fmean(values):>10.3f}")  # fmt: skip
    hop_p50 = percentile(samples["router"], 50) - percentile(samples["direct"], 50)
    hop_p99 = percentile(samples["router"], 99) - percentile(samples["direct"], 99)
    print(f"{'hop':<8}{hop_p50:>10.3f}{hop_p99:>10.3f}{'':>10}  (router minus direct)")
    # Each router sample ran next to one direct sample: their difference cancels slower machine noise.
    paired = [routed - direct for routed, direct in zip(samples["router"], samples["direct"], strict=True)]
    print(f"paired hop: median {statistics.median(paired):.3f} ms over {len(paired)} adjacent pairs")


def main(argv: Sequence[str] | None = None) -> None:
    measure(load(RouterHopBench, argv, prog="python -m bench router-hop", description=__doc__))


if __name__ == "__main__":
    main()
