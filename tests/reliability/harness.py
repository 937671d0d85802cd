"""What the fault, overload and memory tests share: a small local fleet, open-loop load in the background,
and readings of the services' metrics endpoints and of their processes' memory.

The fleet is `services.launcher.fleet.Fleet` with cpu-tiny rankers, free ports and a universe of short
histories, so that it starts in seconds on two shared cores. Load runs on its own thread and event loop
(`BackgroundLoad`), so a test can kill and restart services from the main thread while requests flow.
Metrics are read with tests.support.metrics and waits are tests.support.polling's.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from relaygr.v1 import ranker_pb2, ranker_pb2_grpc, recommend_pb2, recommend_pb2_grpc
from services.launcher.fleet import FleetConfig
from services.loadgen.openloop import CallRecord, run_open_loop
from tests.support.metrics import scrape, value
from tests.support.requests import history, rank_request

RANKER_ARGS = (
    "--torch-threads 1 --profile-lengths 32,128,512 --profile-repeats 1 --profile-candidates 16 "
    "--drain-grace-s 4 --drain-min-s 0.6 --lease-ttl-ms 1000"
)
# How every routing process watches the rankers: the router, and the trigger and stub, which route their
# own calls (the launcher's --routing direct).
ROUTING_ARGS = "--health-interval-s 0.2 --circuit-open-s 1"
ROUTER_ARGS = f"{ROUTING_ARGS} --drain-grace-s 2"
# cpu-tiny's short histories save less than the default relay overhead: relay them all, so every request
# runs the whole relay (Admit, PreInfer, the hint).
TRIGGER_ARGS = f"--profile-retry-s 0.2 --drain-grace-s 2 --relay-overhead-ms 0 {ROUTING_ARGS}"
# Short histories and few candidates keep each Recommend cheap. The Rank deadline is the stub's default
# (--rank-timeout-ms 1000): the fault tests hold with the deadlines users run.
STUB_ARGS = (
    "--history-min 20 --history-median 64 --history-max 256 --num-candidates 16 --relay-window-ms 5 "
    f"--admit-timeout-ms 200 --drain-grace-s 2 {ROUTING_ARGS}"
)
# Callers' deadlines: a Rank as long as the stub's default Rank deadline, a Recommend as long as the stub's
# whole budget (Admit, pre-processing, Rank) with room to spare.
RANK_TIMEOUT_S = 1.0
RECOMMEND_TIMEOUT_S = 2.0


def fleet_config(log_dir: Path, **overrides: Any) -> FleetConfig:
    """A fleet of cpu-tiny rankers on free ports with the arguments above; `overrides` replace fields."""
    settings = dict(
        rankers=3,
        model_preset="cpu-tiny",
        base_port=0,
        metrics_base_port=0,
        log_dir=str(log_dir),
        startup_timeout_s=120.0,
        ranker_args=RANKER_ARGS,
        router_args=ROUTER_ARGS,
        trigger_args=TRIGGER_ARGS,
        stub_args=STUB_ARGS,
    )
    return FleetConfig(**{**settings, **overrides})


# ---- requests ----


def user_rank(user: int, length: int = 64, candidates: int = 8) -> ranker_pb2.RankRequest:
    """A deterministic Rank of user `user` with a `length`-event history, under a request id of its own."""
    return rank_request(
        f"user-{user}",
        history(user, length),
        [1, 2, 3],
        range(100, 100 + candidates),
        request_id=f"rank-{user}-{time.monotonic_ns()}",
    )


def recommend_request(user: int) -> recommend_pb2.RecommendRequest:
    return recommend_pb2.RecommendRequest(user_id=f"user-{user}", top_k=5)


# ---- load ----


class BackgroundLoad:
    """Open-loop Poisson load on its own thread until `stop()`; the records are kept in send order.

    `call_for(channel)` gives the unary callable to load (e.g. a stub's Rank) on a channel opened on the
    load's own event loop; `request(index)` gives the index-th request.
    """

    def __init__(
        self,
        address: str,
        call_for: Callable[[grpc.aio.Channel], Callable[..., Any]],
        request: Callable[[int], Any],
        rate: float,
        timeout_s: float,
        seed: int = 0,
    ) -> None:
        self.records: list[CallRecord] = []
        # time.monotonic() when sending began: records' `intended_s` count from here.
        self.started_at = 0.0
        self._address = address
        self._call_for = call_for
        self._request = request
        self._rate = rate
        self._timeout_s = timeout_s
        self._seed = seed
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by stop()
            self._error = exc
            self._started.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        async with grpc.aio.insecure_channel(self._address) as channel:
            self.started_at = time.monotonic()
            self.records = await run_open_loop(
                self._call_for(channel),
                self._request,
                self._rate,
                timeout_s=self._timeout_s,
                seed=self._seed,
                stop=self._stop,
            )

    def start(self) -> BackgroundLoad:
        self._thread.start()
        self._started.wait()
        return self

    def stop(self) -> list[CallRecord]:
        """Stops sending, waits for the requests in flight, and returns every record."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.records


def users_load(
    address: str,
    rate: float,
    call_for: Callable[[grpc.aio.Channel], Callable[..., Any]],
    request_for: Callable[[int], Any],
    users: int = 200,
    first_user: int = 0,
    **kw: Any,
) -> BackgroundLoad:
    """Calls to `address` round-robin over `users` users from `first_user` on, `request_for(user)` being
    user number `user`'s request; `kw` are BackgroundLoad's (`timeout_s`, `seed`)."""
    return BackgroundLoad(
        address, call_for, lambda index: request_for(first_user + index % users), rate, **kw
    )


def rank_load(address: str, rate: float, length: int = 64, **kw: Any) -> BackgroundLoad:
    """Rank calls to `address` (the router) of `length`-event histories (`users_load`'s `kw`), each with
    the stub's default Rank deadline unless `timeout_s` says otherwise."""
    kw.setdefault("timeout_s", RANK_TIMEOUT_S)
    return users_load(address, rate, _rank, lambda user: user_rank(user, length), **kw)


def recommend_load(address: str, rate: float, **kw: Any) -> BackgroundLoad:
    """Recommend calls to `address` (the retrieval stub) (`users_load`'s `kw`), each with the stub's whole
    budget as deadline (RECOMMEND_TIMEOUT_S) unless `timeout_s` says otherwise."""
    kw.setdefault("timeout_s", RECOMMEND_TIMEOUT_S)
    return users_load(address, rate, _recommend, recommend_request, **kw)


def _rank(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return ranker_pb2_grpc.RankerServiceStub(channel).Rank


def _recommend(channel: grpc.aio.Channel) -> Callable[..., Any]:
    return recommend_pb2_grpc.RecommendServiceStub(channel).Recommend


def codes(records: list[CallRecord]) -> collections.Counter[str]:
    return collections.Counter(record.code.name for record in records)


def failures(records: list[CallRecord]) -> list[tuple[str, str]]:
    return [(record.code.name, record.details) for record in records if not record.ok]


def p99_ms(records: list[CallRecord]) -> float:
    return float(np.percentile([record.latency_s * 1000 for record in records], 99))


# ---- readings ----


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc/<pid>/status."""
    found = re.search(r"^VmRSS:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return int(found.group(1)) * 1024


@dataclasses.dataclass(frozen=True)
class MemorySample:
    at_s: float
    rss: int
    hbm: float
    dram: float
    leases: float


class MemoryWatch:
    """Samples one ranker's RSS and cache gauges every `interval_s` on a thread, until `stop()`."""

    def __init__(self, pid: int, metrics_port: int, interval_s: float) -> None:
        self.pid = pid
        self.metrics_port = metrics_port
        self.interval_s = interval_s
        self.samples: list[MemorySample] = []
        self.capacity: dict[str, float] = {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)

    def _read(self, started: float) -> MemorySample:
        samples = scrape(self.metrics_port)
        self.capacity = {
            tier: value(samples, "relaygr_kv_cache_capacity_bytes", tier=tier) for tier in ("hbm", "dram")
        }
        return MemorySample(
            at_s=time.monotonic() - started,
            rss=rss_bytes(self.pid),
            hbm=value(samples, "relaygr_kv_cache_bytes", tier="hbm"),
            dram=value(samples, "relaygr_kv_cache_bytes", tier="dram"),
            leases=value(samples, "relaygr_leases_active"),
        )

    def _run(self) -> None:
        started = time.monotonic()
        while not self._halt.wait(self.interval_s):
            self.samples.append(self._read(started))

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def stop(self) -> list[MemorySample]:
        self._halt.set()
        self._thread.join()
        return self.samples
