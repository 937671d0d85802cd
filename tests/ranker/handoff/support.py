"""Helpers of the cache-handoff tests: entries made on one in-process ranker, moved to another as the wire
carries them."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterable

import torch

from relaygr.v1 import handoff_pb2
from services.ranker.app import RankerApp
from services.ranker.cache import kv_wire
from services.ranker.cache.index import CacheEntry
from services.ranker.handoff.receive import Tally, receive
from tests.ranker.harness import CANDIDATES, SHORT, events, rank, settle


def run(test: Callable) -> Callable:
    """A test written as a coroutine, run on its own event loop (parameters pass through)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return wrapper


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


async def stream(chunks: Iterable[handoff_pb2.HandoffChunk]) -> AsyncIterator[handoff_pb2.HandoffChunk]:
    for chunk in chunks:
        yield chunk


async def deliver(app: RankerApp, chunks: Iterable[handoff_pb2.HandoffChunk]) -> Tally:
    return await receive(stream(chunks), app.admission)


def reference(app: RankerApp, user: int, length: int = 40) -> torch.Tensor:
    scores = app.runner.full_sync(events(history(user, length)), events(SHORT), CANDIDATES)
    return torch.tensor(scores, dtype=torch.float32)


async def ranked(app: RankerApp, user: int, length: int = 40) -> tuple[torch.Tensor, object]:
    scores, source = await rank(app, f"user-{user}", history(user, length))
    return torch.tensor(scores, dtype=torch.float32), source
