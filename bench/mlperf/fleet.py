"""The local fleets LoadGen drives: `bench.lib.fleets.BenchFleet` (the benchmark's own launcher) in its
`relay` or `baseline` mode, one shape for both.

Both modes run the same rankers, model preset, budgets and ranker flags; only the mode differs (the
baseline: no Admit, no hint, no DRAM tier). The trigger's ranking SLO is the part of the P99 target left
after the relay window (`p99_ms - relay_window_ms`): the Rank's share of a sample's latency. Each LoadGen
run gets a fresh retrieval stub (`run_stub`) whose universe starts at the run's own start
(`bench.mlperf.workload`); the fleet's first stub stays idle. The router answers once one ranker is
healthy, so before the first run `wait_routable` waits until it routes to every ranker: a user's visits
then reach one ranker from the start. Leaving the `with` block of a `BenchFleet` stops every process it
started.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from bench.lib.fleets import BASELINE, RELAY, BenchFleet, FleetShape, Mode
from bench.lib.workload import Universe
from bench.mlperf.config import MlperfConfig
from bench.mlperf.workload import streaming_universe
from relaygr.v1 import ranker_pb2, ranker_pb2_grpc

MODES: dict[str, Mode] = {"relay": RELAY, "baseline": BASELINE}
NUM_CANDIDATES = 128  # the stub's retrieval size, also the rankers' profiled candidate count
LEASE_TTL_MS = 3000  # as `python -m bench run`: a pre-inferred prefix waits this long for its Rank
PRE_INFER_CHUNK_TOKENS = 512  # the fastest on CPU (bench.lib.config)


def profile_lengths(history_max: int) -> str:
    """The rankers' warm-up curve: a few prefix lengths up to the longest the universe serves."""
    return ",".join(str(n) for n in sorted({min(128, history_max), min(512, history_max), history_max}))


def shape(config: MlperfConfig) -> FleetShape:
    """What both modes' fleets share."""
    c = config
    ranker_args = (
        f"--torch-threads {c.torch_threads} --pre-infer-chunk-tokens {PRE_INFER_CHUNK_TOKENS} "
        f"--profile-lengths {profile_lengths(c.history_max)} --profile-repeats 2 "
        f"--profile-candidates {NUM_CANDIDATES} --profile-short-term {c.short_term} "
        f"--lease-ttl-ms {LEASE_TTL_MS}"
    )
    return FleetShape(
        rankers=c.rankers,
        model_preset=c.model_preset,
        hbm_budget_mb=c.hbm_budget_mb,
        dram_budget_mb=c.dram_budget_mb,
        slo_ms=max(c.p99_ms - c.relay_window_ms, 1.0),
        ranker_args=ranker_args,
        max_long_term=c.history_max,
        stub_args=f"--num-candidates {NUM_CANDIDATES} --rank-timeout-ms {c.timeout_s * 1000:g}",
        startup_timeout_s=c.startup_timeout_s,
    )


def universe(config: MlperfConfig, epoch_ms: int) -> Universe:
    """The streaming universe of the config, its histories at their drawn lengths at `epoch_ms`."""
    c = config
    return streaming_universe(
        c.history_median, c.history_sigma, c.history_max, c.short_term, c.growth_events_per_min,
        c.universe_seed, epoch_ms,
    )  # fmt: skip


def local_fleet(config: MlperfConfig, mode: str, log_dir: Path) -> BenchFleet:
    """A not yet started fleet of `mode` (relay or baseline); its first stub's universe starts at epoch 0
    (its own start) and is not driven."""
    return BenchFleet(MODES[mode], shape(config), universe(config, 0), config.relay_window_ms, log_dir)


def run_stub(fleet: BenchFleet, config: MlperfConfig) -> str:
    """The address of a retrieval stub started now for one run: its users' histories have their drawn
    lengths now and grow from here."""
    return fleet.stub(universe(config, time.time_ns() // 1_000_000), config.relay_window_ms)


def wait_routable(fleet: BenchFleet, rankers: int, timeout_s: float) -> None:
    """Waits until the fleet's router routes to all `rankers` (its GetProfile's `fleet_members`); raises
    TimeoutError naming how many it routes to when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    members = 0
    with grpc.insecure_channel(fleet.router()) as channel:
        stub = ranker_pb2_grpc.RankerServiceStub(channel)
        while True:
            try:
                members = stub.GetProfile(ranker_pb2.GetProfileRequest(), timeout=2.0).fleet_members
            except grpc.RpcError:
                members = 0
            if members >= rankers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the router routes to {members} of {rankers} rankers after {timeout_s:g} s"
                )
            time.sleep(0.2)
