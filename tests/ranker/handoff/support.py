"""Helpers of the cache-handoff tests: entries made on one in-process ranker, moved to another as the wire
carries them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import torch

from relaygr.v1 import handoff_pb2
from services.launcher.procs import free_ports
from services.ranker.app import RankerApp
from services.ranker.cache import kv_wire
from services.ranker.cache.index import CacheEntry
from services.ranker.handoff.receive import Tally, receive
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset
from services.ranker.model.store import save_model_dir
from tests.ranker.harness import BASE, CANDIDATES, SHORT, events, rank, settle


def run(test: Callable) -> Callable:
    """A test written as a coroutine, run on its own event loop (parameters pass through)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper


def item_action_model(directory: Path) -> str:
    """A model directory of cpu-tiny's shape in the `item_action` token layout (an item token then an
    action token an event: two KV rows an event), the layout of every imported recsys-examples checkpoint;
    its path, for `--checkpoint`."""
    config = dataclasses.replace(get_preset("cpu-tiny"), name="tiny-item-action", token_layout="item_action")
    torch.manual_seed(0)
    return str(save_model_dir(directory, config, HSTURanker(config).state_dict()))


def history(user: int, length: int = 40) -> list[int]:
    return [user * 1000 + i for i in range(length)]


async def cached(app: RankerApp, users: Iterable[int], length: int = 40) -> list[CacheEntry]:
    """Ranks each user once (their prefix computed, then demoted to DRAM); the entries, in order."""
    found = []
    for user in users:
        await rank(app, f"user-{user}", history(user, length))
        await settle(app)
        (entry,) = app.cache.index.of_user(f"user-{user}")
        found.append(entry)
    return found


async def wire(app: RankerApp, entries: Iterable[CacheEntry]) -> list[handoff_pb2.HandoffChunk]:
    """The chunks a push of `entries` from `app` sends."""
    chunks = []
    for entry in entries:
        header, data = await app.admission.payload(entry)
        chunks.extend(kv_wire.chunks(header, data))
    return chunks


def made_up(
    app: RankerApp, user: int, idle_s: float = 0.0, length: int = 40, seed: int | None = None
) -> list[handoff_pb2.HandoffChunk]:
    """The chunks of an entry of `user` (`history(user, length)`) as a peer would send it to `app`: its model
    version and KV layout (one KV row an event; a DRAM dtype without scales), KV bytes made up (random,
    deterministic by `seed`, the user by default) with their true CRC-32, and `idle_s`. For receiving
    without computing anything."""
    item_ids = history(user, length)
    nbytes = app.cache.moves.dram_nbytes(length)
    generator = torch.Generator().manual_seed(user if seed is None else seed)
    data = memoryview(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator).numpy())
    header = handoff_pb2.HandoffEntry(
        user_id=f"user-{user}", model_version=app.runner.model_version,
        events=kv_wire.sequence(events(item_ids)), layout=app.admission.layout, nbytes=nbytes,
        crc32=kv_wire.crc32(data), idle_s=idle_s,
    )  # fmt: skip
    return list(kv_wire.chunks(header, data))


async def stream(chunks: Iterable[handoff_pb2.HandoffChunk]) -> AsyncIterator[handoff_pb2.PushRequest]:
    for chunk in chunks:
        yield handoff_pb2.PushRequest(chunk=chunk)


async def deliver(app: RankerApp, chunks: Iterable[handoff_pb2.HandoffChunk]) -> Tally:
    return await receive(stream(chunks), app.admission)


def reference(app: RankerApp, user: int, length: int = 40) -> torch.Tensor:
    scores = app.runner.full_sync(events(history(user, length)), events(SHORT), CANDIDATES)
    return torch.tensor(scores, dtype=torch.float32)


async def ranked(app: RankerApp, user: int, length: int = 40) -> tuple[torch.Tensor, object]:
    scores, source = await rank(app, f"user-{user}", history(user, length))
    return torch.tensor(scores, dtype=torch.float32), source


@dataclasses.dataclass
class Fleet:
    """In-process rankers on loopback that know each other (`--rankers`), by name."""

    names: list[str]
    ports: dict[str, int]
    overrides: dict
    apps: dict[str, RankerApp] = dataclasses.field(default_factory=dict)

    @property
    def members(self) -> str:
        return ",".join(f"{name}=127.0.0.1:{self.ports[name]}" for name in self.names)

    async def start(self, name: str) -> RankerApp:
        config = dataclasses.replace(
            BASE, instance_name=name, port=self.ports[name], rankers=self.members, health_interval_s=0.1,
            drain_min_s=0.0, **self.overrides,
        )  # fmt: skip
        app = RankerApp(config)
        await app.start()
        self.apps[name] = app
        return app

    async def routable(self, timeout_s: float = 20.0) -> None:
        """Waits until every running ranker sees every other running one routable."""
        running = set(self.apps)
        for _ in range(int(timeout_s / 0.05)):
            seen = [
                {m.name for m in app.peers.membership.routable()} >= running for app in self.apps.values()
            ]
            if all(seen):
                return
            await asyncio.sleep(0.05)
        raise TimeoutError("the rankers did not see each other routable")

    async def stop(self, name: str, drain: bool = True) -> None:
        app = self.apps.pop(name)
        if drain:
            await app.grpc.drain()
        else:
            await app.grpc.server.stop(None)
        await app.close()

    async def close(self) -> None:
        for name in list(self.apps):
            await self.stop(name, drain=False)


@contextlib.asynccontextmanager
async def fleet(names: list[str], **overrides) -> AsyncIterator[Fleet]:
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    rankers = Fleet(names, ports, overrides)
    try:
        yield rankers
    finally:
        await rankers.close()
