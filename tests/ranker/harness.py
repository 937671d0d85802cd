"""An in-process ranker on a real gRPC server over loopback, for the ranker's service tests; the requests
sent to it are built with tests.support.requests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading

import grpc
import numpy as np
import torch
from prometheus_client import REGISTRY

from relaygr.v1 import ranker_pb2_grpc
from services.ranker.app import RankerApp
from services.ranker.cache.acquired import Source
from services.ranker.config import RankerConfig
from services.ranker.device.accelerator import Accelerator
from services.ranker.engine.scheduler import Op, Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import CachedRank, HSTURanker

BASE = RankerConfig(
    host="127.0.0.1",
    port=0,
    metrics_port=-1,
    instance_name="ranker-a",
    model_preset="cpu-tiny",
    profile_lengths="16,64",
    profile_repeats=1,
    profile_candidates=8,
    profile_short_term=4,
    drain_grace_s=1.0,
    # An in-process ranker shares the test's interpreter, whose event loop holds the GIL at times: its
    # warm-up is not judged disturbed (a provisional curve changes what it refuses) unless a test asks.
    profile_disturbed_ratio=1e9,
)


@dataclasses.dataclass
class Ranker:
    app: RankerApp
    stub: ranker_pb2_grpc.RankerServiceStub

    @property
    def cache(self):
        return self.app.cache

    def reference(self, long: list[int], short: list[int], candidates: list[int]) -> list[float]:
        """Scores from the model's full forward over the whole sequence: the ground truth."""
        return self.app.runner.full_sync(events(long), events(short), candidates)

    async def settle(self) -> None:
        """Waits until no production or tier copy is in flight."""
        await settle(self.app)


@contextlib.asynccontextmanager
async def running_ranker(**overrides):
    config = dataclasses.replace(BASE, **overrides)
    app = RankerApp(config)
    server = app.grpc
    await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield Ranker(app, ranker_pb2_grpc.RankerServiceStub(channel))
    finally:
        await channel.close()
        await server.server.stop(None)
        await app.close()


def events(item_ids: list[int]) -> Events:
    return Events.of(item_ids, [i % 5 for i in range(len(item_ids))])


def blocked(scheduler: Scheduler) -> threading.Event:
    """Holds the scheduler's thread in a job until the returned event is set, so that jobs queue behind it."""
    gate, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(10)

    scheduler.submit(hold, Priority.RANK, Op.PROFILE)
    assert started.wait(10)
    return gate


def held_bytes(cache) -> dict[str, int]:
    """Bytes of the KV tensors the cache's entries actually hold (and of their scales, in FP8), per tier,
    read from the tensors' storages (each storage once), independently of the tiers' own accounting. A
    storage larger than its tensor (a view into a bigger buffer) counts in full: that memory is held too."""
    storages: dict[str, dict[int, int]] = {"hbm": {}, "dram": {}}
    for entry in list(cache.entries.values()):
        for tier, kv in (("hbm", entry.hbm), ("dram", entry.dram)):
            if kv is None:
                continue
            scales = () if kv.scale is None else (kv.scale,)
            for tensor in (*kv.keys, *kv.values, *scales):
                storage = tensor.untyped_storage()
                storages[tier][storage.data_ptr()] = storage.nbytes()
    return {tier: sum(sizes.values()) for tier, sizes in storages.items()}


def model_passes() -> float:
    """Jobs the device threads have run, of every kind (`relaygr_model_seconds` counts each op)."""
    return sum(
        sample.value
        for family in REGISTRY.collect()
        if family.name == "relaygr_model_seconds"
        for sample in family.samples
        if sample.name == "relaygr_model_seconds_count"
    )


# ---- an in-process ranker without the server: the cache and the runner driven directly ----

SHORT = [11, 12, 13]
CANDIDATES = np.array([5, 99, 1234, 7], dtype=np.int64)

# The largest |score - full pass| the tests allow a Rank served from a lossy DRAM copy of cpu-tiny, by
# --dram-precision: a few times what `python -m bench accelerator --measures dram-precision` measures
# (docs/models.md).
LOSSY_TOLERANCE = {"bf16": 5e-3, "fp8": 1e-2}


@contextlib.asynccontextmanager
async def cache_app(accelerator: Accelerator | None = None, **overrides):
    """A RankerApp of BASE with `overrides`; `accelerator` replaces the device's own (tests pass
    `Accelerator(cpu, copies=True)` to run the pinned-pool copy path on CPU)."""
    app = RankerApp(dataclasses.replace(BASE, **overrides), accelerator=accelerator)
    try:
        yield app
    finally:
        await app.close()


async def settle(app: RankerApp) -> None:
    """Waits until no production or tier copy is in flight."""
    for _ in range(500):
        if not app.cache.productions and not any(e.demoting for e in app.cache.entries.values()):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the cache did not settle")


async def rank(app: RankerApp, user: str, long: list[int], relay: str = "") -> tuple[list[float], Source]:
    """What the data plane does for one Rank of SHORT and CANDIDATES: acquire, score, release."""
    acquired = await app.cache.acquire(user, events(long), relay)
    try:
        if acquired.entry is None:
            scores = await app.runner.uncached(events(long), events(SHORT), CANDIDATES, None)
        else:
            scores = await app.runner.rank(acquired.entry.hbm, events(SHORT), CANDIDATES, None)
    finally:
        app.cache.release(acquired)
    return scores, acquired.source


# ---- the model and the device's copies driven directly ----


class PendingEvent:
    """An event of a copy still in flight: complete once set, or once the host waits for it."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


def user_request(model: HSTURanker, seed: int, length: int, num_short: int, candidates: int) -> CachedRank:
    """One user's cached rank for `model`: a random prefix of `length` events pre-inferred, `num_short`
    short-term events and `candidates` candidates, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n: int) -> torch.Tensor:
        return torch.randint(0, 2**40, (n,), generator=generator)

    def actions(n: int) -> torch.Tensor:
        return torch.randint(0, model.preset.num_action_types, (n,), generator=generator)

    prefix = model.pre_infer(ids(length)[None], actions(length)[None], chunk_size=16)
    return CachedRank(prefix, ids(num_short), actions(num_short), ids(candidates))
