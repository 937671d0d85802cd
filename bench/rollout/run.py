"""One rollout run (`run_once`): a fresh fleet (the launcher's `Fleet`: the plan's rankers, one spare declared
to every process, routing direct, the relay as `--relay` says; the off mode's rankers get
`--handoff-off-flags`), the plan's open-loop load on it (`drive`), and the plan's fleet changes made on
time on a thread of their own while the rankers' metrics (`KEYS`) are scraped throughout (`Rollout`). What it
records (`RunRecord`): every Recommend (`Call`), every change as it happened (`Change`: when planned,
SIGTERMed, gone, Ready; what the ranker held just before its SIGTERM) and every metrics sample (`Sample`).
A draining ranker is scraped every `DRAINING_INTERVAL_S`, so what it did in its last tenth of a second may
be missing from its last sample; its peers' counters (bytes received) miss nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.lib.config import BenchConfig
from bench.lib.driving import NUM_CANDIDATES
from bench.lib.points import miss_label
from bench.lib.probes import machine_busy_s, metric_values, scrape
from bench.lib.recommends import recommend
from bench.lib.workload import Population, RevisitSampler, fixed_length_universe
from bench.rollout.config import RESTART, START, Plan, RolloutConfig
from bench.rollout.config import Change as Planned
from relaygr.v1 import common_pb2
from services.common.contract import cache_source_label
from services.launcher.fleet import STUB, Fleet, FleetConfig
from services.loadgen.openloop import CallRecord

DRAINING_INTERVAL_S = 0.1
SCRAPE_TIMEOUT_S = 2.0
# The metrics read (`bench.lib.probes.FAMILIES`): device seconds by op, PreInfer outcomes, the handoff's
# entries and bytes sent and received, read-throughs and their bytes, the last handoff's duration, the tiers.
KEYS = (
    "device_s", "pre_infer", "handoff_sent", "handoff_sent_bytes", "handoff_received",
    "handoff_received_bytes", "read_through", "read_through_bytes", "handoff_duration_s", "kv_bytes",
)  # fmt: skip


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
class Sample:
    """One scrape of one ranker process, `at_s` seconds after the load started: `KEYS`, flat."""

    at_s: float
    ranker: str
    pid: int
    values: dict[str, float]
    baseline: bool = False  # taken at the load's start


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
    c, short_term = config, BenchConfig.short_term
    universe = fixed_length_universe(c.long_term, short_term, BenchConfig.growth_headroom, seed=0)
    ranker_args = [
        "--torch-threads", str(c.torch_threads), "--dram-ttl-s", f"{c.dram_ttl_s:g}",
        "--profile-lengths", c.ranker_profile_lengths, "--profile-repeats", "1",
        "--profile-candidates", str(NUM_CANDIDATES), "--profile-short-term", str(short_term),
        *(shlex.split(c.handoff_off_flags) if mode == "off" else []),
    ]  # fmt: skip
    stub_args = [
        "--rank-timeout-ms", f"{c.rank_timeout_ms:g}", "--num-candidates", str(NUM_CANDIDATES),
        *universe.stub_args,
    ]  # fmt: skip
    return FleetConfig(
        rankers=c.rankers, spare_rankers=1, model_preset=c.model_preset, hbm_budget_mb=c.hbm_budget_mb,
        dram_budget_mb=c.dram_budget_mb, relay_window_ms=c.relay_window_ms, relay=c.relay, routing="direct",
        base_port=0, metrics_base_port=0, log_dir=str(log_dir), startup_timeout_s=c.startup_timeout_s,
        ranker_args=shlex.join(ranker_args), stub_args=shlex.join(stub_args),
    )  # fmt: skip


class Rollout:
    """Makes a plan's fleet changes on one running fleet (`make_all`, from one thread: the fleet is not
    thread-safe), each at its time or as soon as the previous is done, and scrapes the rankers it watches
    every `interval_s` (a draining one every `DRAINING_INTERVAL_S`) on a thread of its own, from `with` until
    its end; that thread reads only what is watched (`_targets`, under the lock), never the fleet."""

    def __init__(self, fleet: Fleet, interval_s: float, log: Callable[[str], None]) -> None:
        self.fleet, self.interval_s, self.log = fleet, interval_s, log
        self.origin = math.nan  # time.monotonic() at the load's start
        self.samples: list[Sample] = []
        self._targets: dict[str, list] = {}  # ranker -> [metrics URL, pid, interval, next due]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rollout-scraper", daemon=True)

    def now_s(self) -> float:
        return round(time.monotonic() - self.origin, 3)

    def watch(self, name: str, interval_s: float | None = None) -> None:
        endpoint = self.fleet.endpoints()[name]
        with self._lock:
            self._targets[name] = [endpoint.metrics_url, endpoint.pid, interval_s or self.interval_s, 0.0]

    def scrape(self, rankers: Iterable[str], baseline: bool = False) -> dict[str, Sample]:
        """Scrapes `rankers` now; the samples taken (a ranker that did not answer has none)."""
        with self._lock:
            targets = {name: self._targets[name][:2] for name in rankers if name in self._targets}
        taken = {}
        for name, (url, pid) in targets.items():
            try:
                values = metric_values(scrape(url, SCRAPE_TIMEOUT_S), KEYS)
            except OSError:  # gone, or not serving metrics yet: no sample
                continue
            taken[name] = Sample(self.now_s(), name, pid, values, baseline)
        with self._lock:
            self.samples.extend(taken.values())
        return taken

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [name for name, target in self._targets.items() if target[3] <= now]
                for name in due:
                    self._targets[name][3] = now + self._targets[name][2]
            self.scrape(due)
            self._stop.wait(DRAINING_INTERVAL_S / 2)

    def __enter__(self) -> Rollout:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def make_all(self, plan: Plan) -> list[Change]:
        """Watches the plan's rankers, takes the baseline samples and makes the plan's changes, each at its
        time or as soon as the previous is done; stops early once the `with` block ends."""
        for name in plan.rankers:
            self.watch(name)
        self.scrape(plan.rankers, baseline=True)
        made = []
        for planned in plan.changes:
            if self._stop.wait(max(planned.at_s - self.now_s(), 0.0)):
                break
            made.append(self.make(planned))
        return made

    def make(self, planned: Planned) -> Change:
        """The change, made: a start waits until the spare is Ready; a restart or stop SIGTERMs the ranker
        (it drains and hands off) and waits until it is gone, and a restart starts it again on its name and
        ports and waits until it is Ready."""
        name, began = planned.ranker, self.now_s()
        if planned.action == START:
            self.fleet.start_ranker(name)
            self.watch(name)
            change = Change(planned.action, name, planned.at_s, began, ready_s=self.now_s())
        else:
            peers = [
                other
                for other in self.fleet.endpoints()
                if other in self.fleet.member_names and other != name
            ]
            before = self.scrape([name, *peers]).get(name)
            held = before.values if before is not None else {}
            resident = {
                key.split("/")[1]: value for key, value in held.items() if key.startswith("kv_bytes/")
            }
            self.watch(name, DRAINING_INTERVAL_S)
            signalled = self.now_s()
            self.fleet.kill(name, signal.SIGTERM)
            exited = self.now_s()
            with self._lock:
                del self._targets[name]
            self.scrape(peers)  # what they received, to the end of the handoff
            code, ready = self.fleet.children[name].popen.returncode, None
            if planned.action == RESTART:
                self.fleet.restart(name)
                self.watch(name)
                ready = self.now_s()
            change = Change(
                planned.action, name, planned.at_s, began, signalled, exited, code, ready, resident
            )
        late = f" ({began - planned.at_s:.1f} s late)" if began - planned.at_s > 0.5 else ""
        times = {"SIGTERM": change.signalled_s, "gone": change.exited_s, "Ready": change.ready_s}
        steps = ", ".join(f"{what} at {at:.1f} s" for what, at in times.items() if at is not None)
        self.log(f"{planned.action} {name}, planned at {planned.at_s:g} s{late}: {steps}")
        return change


async def drive(
    rollout: Rollout, plan: Plan, sampler: RevisitSampler | Population, c: RolloutConfig, seed: int
) -> tuple[list[CallRecord], list[Change]]:
    """The plan's open-loop load on this thread's event loop, its fleet changes (`Rollout.make_all`) on a
    thread of their own meanwhile; the load's records and the changes."""
    load = asyncio.ensure_future(recommend(
        rollout.fleet.address(STUB), sampler, rate=c.rate, duration_s=plan.duration_s, seed=seed,
        timeout_s=(c.relay_window_ms + c.rank_timeout_ms) / 1000 + 1.0,
    ))  # fmt: skip
    await asyncio.sleep(0)  # the load's clock starts
    rollout.origin = time.monotonic()
    with rollout:
        changes = await asyncio.to_thread(rollout.make_all, plan)
        records = await load
        rollout.scrape(list(rollout.fleet.endpoints()))
    return records, changes


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
    started = time.monotonic()
    c = config
    sampler: RevisitSampler | Population = (
        Population(f"rollout-s{seed}", c.population, seed)
        if c.population
        else RevisitSampler(f"rollout-s{seed}", c.rate, c.revisit_probability, c.revisit_window_s, seed)
    )

    with Fleet(fleet_config(c, mode, log_dir)) as fleet:
        log(f"{mode} seed {seed}: fleet up in {time.monotonic() - started:.0f} s; {plan.duration_s:g} s of "
            "load")  # fmt: skip
        busy_before = machine_busy_s()
        rollout = Rollout(fleet, c.scrape_interval_s, log)
        records, changes = asyncio.run(drive(rollout, plan, sampler, c, seed))
        fleet.check()  # no child died on its own
        busy = (machine_busy_s() - busy_before) / max(time.monotonic() - rollout.origin, 1e-9)
    return RunRecord(
        mode, seed, order, [call_of(record, sampler.user(record.index)) for record in records], changes,
        sorted(rollout.samples, key=lambda s: s.at_s), round(time.monotonic() - started, 1), round(busy, 3),
    )  # fmt: skip
