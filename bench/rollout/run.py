"""One rollout run (`run_once`): a fresh fleet in one handoff mode, the plan's load on it from a thread of
its own (`Load`), the plan's fleet changes made on time (`Rollout`), and the rankers' metrics scraped
throughout (`bench.rollout.scrape`). What it records (`RunRecord`): every Recommend (`Call`), every
change as it happened (`Change`: when planned, SIGTERMed, gone, Ready; what the ranker held just before
its SIGTERM) and every metrics sample.

The fleet (`fleet_config`): the plan's rankers started, one spare declared to every process (its users go
to their next member until it starts), routing direct, the relay as `--relay` says; the off mode's rankers
get `--handoff-off-flags`, the on mode's nothing beyond the rest (their defaults hand off).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shlex
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from bench.lib.points import miss_label
from bench.lib.probes import machine_busy_s
from bench.lib.workload import Population, RevisitSampler, fixed_length_universe
from bench.rollout.config import GROWTH_HEADROOM, NUM_CANDIDATES, SHORT_TERM, RolloutConfig
from bench.rollout.plan import RESTART, START, Plan
from bench.rollout.plan import Change as Planned
from bench.rollout.scrape import Sample, Scraper
from relaygr.v1 import common_pb2, recommend_pb2, recommend_pb2_grpc
from services.common.contract import cache_source_label
from services.launcher.fleet import STUB, Fleet, FleetConfig
from services.loadgen.openloop import CallRecord, run_open_loop

TOP_K = 10
LOAD_START_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class Call:
    """One Recommend of a run; times in seconds since the load started, latencies in ms (inf: failed)."""

    index: int
    user: str
    intended_s: float
    recommend_ms: float  # from the intended send time to the answer (failed: inf)
    code: str  # the gRPC status: OK, or why it failed
    source: str = ""  # hbm, dram, extended or miss ("" when it failed)
    miss_reason: str = ""
    instance: str = ""
    rank_ms: float = math.inf  # the Rank as the stub timed it
    computed_events: int = 0  # long-term events the Rank computed on its critical path
    send_lag_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    @property
    def answered_s(self) -> float:
        return self.intended_s + self.recommend_ms / 1000


@dataclasses.dataclass(frozen=True)
class Change:
    """A planned fleet change as it happened (seconds since the load started; None: not this change's)."""

    action: str
    ranker: str
    planned_s: float
    began_s: float  # when it was made: its planned time, or later when the previous one ran over
    signalled_s: float | None = None  # SIGTERM sent
    exited_s: float | None = None
    exit_code: int | None = None
    ready_s: float | None = None  # started and healthy
    resident_bytes: dict[str, float] = dataclasses.field(default_factory=dict)  # by tier, before SIGTERM


@dataclasses.dataclass(frozen=True)
class RunRecord:
    mode: str
    seed: int
    order: int  # the run's place among its seed's runs (0: first)
    calls: list[Call]
    changes: list[Change]
    samples: list[Sample]
    wall_s: float
    machine_busy_cores: float  # every process's, ours included


def call_of(record: CallRecord, user: str) -> Call:
    lag = round(record.send_lag_s * 1000, 3)
    if not record.ok:
        return Call(
            record.index, user, round(record.intended_s, 4), math.inf, record.code.name, send_lag_ms=lag
        )
    r = record.response
    miss = miss_label(r.miss_reason) if r.cache_source == common_pb2.CACHE_SOURCE_MISS else ""
    return Call(
        record.index, user, round(record.intended_s, 4), round(record.latency_s * 1000, 3), "OK",
        cache_source_label(r.cache_source), miss, r.instance, round(r.rank_latency_ms, 3),
        r.computed_prefix_events, lag,
    )  # fmt: skip


def fleet_config(config: RolloutConfig, mode: str, log_dir: Path) -> FleetConfig:
    c = config
    universe = fixed_length_universe(c.long_term, SHORT_TERM, GROWTH_HEADROOM, seed=0)
    ranker_args = [
        "--torch-threads", str(c.torch_threads), "--dram-ttl-s", f"{c.dram_ttl_s:g}",
        "--profile-lengths", c.ranker_profile_lengths, "--profile-repeats", "1",
        "--profile-candidates", str(NUM_CANDIDATES), "--profile-short-term", str(SHORT_TERM),
        *(shlex.split(c.handoff_off_flags) if mode == "off" else []),
    ]  # fmt: skip
    stub_args = [
        "--rank-timeout-ms", f"{c.rank_timeout_ms:g}", "--num-candidates", str(NUM_CANDIDATES),
        *universe.stub_args,
    ]  # fmt: skip
    return FleetConfig(
        rankers=c.rankers,
        spare_rankers=1,
        model_preset=c.model_preset,
        hbm_budget_mb=c.hbm_budget_mb,
        dram_budget_mb=c.dram_budget_mb,
        relay_window_ms=c.relay_window_ms,
        relay=c.relay,
        routing="direct",
        base_port=0,
        metrics_base_port=0,
        log_dir=str(log_dir),
        startup_timeout_s=c.startup_timeout_s,
        ranker_args=shlex.join(ranker_args),
        stub_args=shlex.join(stub_args),
    )


class Load(threading.Thread):
    """The plan's open-loop Recommend load against one stub, on a thread with its own event loop."""

    def __init__(
        self,
        address: str,
        sampler: RevisitSampler | Population,
        config: RolloutConfig,
        duration_s: float,
        seed: int,
    ):
        super().__init__(name="rollout-load", daemon=True)
        self.address, self.sampler, self.config = address, sampler, config
        self.duration_s, self.seed = duration_s, seed
        self.origin = math.nan  # time.monotonic() when the first arrival's clock started
        self.started = threading.Event()
        self.records: list[CallRecord] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.records = asyncio.run(self._drive())
        except BaseException as exc:  # re-raised by `calls`, on the run's thread
            self.error = exc
            self.started.set()

    async def _drive(self) -> list[CallRecord]:
        c = self.config
        async with grpc.aio.insecure_channel(self.address) as channel:
            recommend = recommend_pb2_grpc.RecommendServiceStub(channel).Recommend
            self.origin = asyncio.get_running_loop().time()  # the loop's clock is time.monotonic()
            self.started.set()
            return await run_open_loop(
                recommend,
                lambda index: recommend_pb2.RecommendRequest(user_id=self.sampler.user(index), top_k=TOP_K),
                c.rate,
                duration_s=self.duration_s,
                timeout_s=(c.relay_window_ms + c.rank_timeout_ms) / 1000 + 1.0,
                seed=self.seed,
            )

    def calls(self) -> list[Call]:
        """Waits for the load's end; every call, in send order."""
        self.join()
        if self.error is not None:
            raise self.error
        return [call_of(record, self.sampler.user(record.index)) for record in self.records]


class Rollout:
    """Makes a plan's fleet changes on one running fleet, each at its time or as soon as the previous is
    done, and keeps the scraper watching the rankers that run."""

    def __init__(self, fleet: Fleet, scraper: Scraper, origin: float, log: Callable[[str], None]) -> None:
        self.fleet, self.scraper, self.origin, self.log = fleet, scraper, origin, log

    def now_s(self) -> float:
        return round(time.monotonic() - self.origin, 3)

    def watch(self, name: str) -> None:
        endpoint = self.fleet.endpoints()[name]
        self.scraper.watch(name, endpoint.metrics_url, endpoint.pid)

    def make(self, planned: Planned) -> Change:
        time.sleep(max(planned.at_s - self.now_s(), 0.0))
        began = self.now_s()
        if planned.action == START:
            self.fleet.start_ranker(planned.ranker)
            self.watch(planned.ranker)
            change = Change(planned.action, planned.ranker, planned.at_s, began, ready_s=self.now_s())
        else:
            change = self._drain(planned, began)
        late = f" ({began - planned.at_s:.1f} s late)" if began - planned.at_s > 0.5 else ""
        times = {"SIGTERM": change.signalled_s, "gone": change.exited_s, "Ready": change.ready_s}
        steps = ", ".join(f"{what} at {at:.1f} s" for what, at in times.items() if at is not None)
        self.log(f"{planned.action} {planned.ranker}, planned at {planned.at_s:g} s{late}: {steps}")
        return change

    def _drain(self, planned: Planned, began: float) -> Change:
        """SIGTERM (the ranker drains and hands off), wait until it is gone, and for a restart start it
        again on its name and ports and wait until it is Ready."""
        name = planned.ranker
        peers = [
            other for other in self.fleet.endpoints() if other in self.fleet.member_names and other != name
        ]
        before = self.scraper.scrape([name, *peers]).get(name)
        held = before.values if before is not None else {}
        resident = {key.split("/")[1]: value for key, value in held.items() if key.startswith("kv_bytes/")}
        self.scraper.hurry(name)
        signalled = self.now_s()
        self.fleet.kill(name, signal.SIGTERM)
        exited = self.now_s()
        self.scraper.forget(name)
        self.scraper.scrape(peers)  # what they received, to the end of the handoff
        code = self.fleet.children[name].popen.returncode
        ready = None
        if planned.action == RESTART:
            self.fleet.restart(name)
            self.watch(name)
            ready = self.now_s()
        return Change(planned.action, name, planned.at_s, began, signalled, exited, code, ready, resident)


def run_once(
    config: RolloutConfig,
    plan: Plan,
    mode: str,
    seed: int,
    order: int,
    log_dir: Path,
    log: Callable[[str], None],
) -> RunRecord:
    """One run of `plan` in handoff `mode` with load seed `seed` on a fresh fleet."""
    c = config
    started = time.monotonic()
    sampler: RevisitSampler | Population = (
        Population(f"rollout-s{seed}", c.population, seed)
        if c.population
        else RevisitSampler(f"rollout-s{seed}", c.rate, c.revisit_probability, c.revisit_window_s, seed)
    )
    with Fleet(fleet_config(c, mode, log_dir)) as fleet:
        up_s = time.monotonic() - started
        log(f"{mode} seed {seed}: fleet up in {up_s:.0f} s; {plan.duration_s:g} s of load")
        busy_before = machine_busy_s()
        load = Load(fleet.address(STUB), sampler, c, plan.duration_s, seed)
        load.start()
        if not load.started.wait(LOAD_START_TIMEOUT_S) or load.error is not None:
            raise RuntimeError(f"the load did not start: {load.error}")
        with Scraper(c.scrape_interval_s, load.origin) as scraper:
            rollout = Rollout(fleet, scraper, load.origin, log)
            for name in plan.rankers:
                rollout.watch(name)
            scraper.scrape(plan.rankers, baseline=True)
            changes = [rollout.make(planned) for planned in plan.changes]
            calls = load.calls()
            scraper.scrape(list(fleet.endpoints()))
        fleet.check()  # no child died on its own
        busy = (machine_busy_s() - busy_before) / max(time.monotonic() - load.origin, 1e-9)
    return RunRecord(
        mode, seed, order, calls, changes, sorted(scraper.samples, key=lambda s: s.at_s),
        round(time.monotonic() - started, 1), round(busy, 3),
    )  # fmt: skip
