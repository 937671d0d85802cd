"""What a Rank's trace says of its prefix: whether it joined a running production or started its own, and
which sampled PreInfer's prefix it consumed (the link from the Rank to the relay's first half)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from services.ranker.cache.acquired import Source
from tests.ranker.harness import blocked, cache_app, events, settle
from tests.support.requests import history

_ids = itertools.count(1)


@contextlib.contextmanager
def serving(sampled: bool) -> Iterator[SpanContext]:
    """As if inside a served call of a trace (sampled or not): its span context is the current one."""
    context = SpanContext(next(_ids), next(_ids), is_remote=True, trace_flags=TraceFlags(int(sampled)))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(context)))
    try:
        yield context
    finally:
        otel_context.detach(token)


def test_a_rank_that_starts_its_production_did_not_join_one() -> None:
    async def scenario() -> None:
        async with cache_app() as app:
            long = events(history(1, 48))
            cold = await app.cache.acquire("u1", long, "")
            app.cache.release(cold)
            assert (cold.source, cold.joined, cold.pre_infer) == (Source.MISS, False, None)
            assert cold.entry is not None  # computed on the Rank's path, and cached
            await settle(app)
            reloaded = await app.cache.acquire("u1", long, "")  # demoted to DRAM after its Rank
            app.cache.release(reloaded)
            assert (reloaded.source, reloaded.joined, reloaded.pre_infer) == (Source.DRAM, False, None)

    asyncio.run(scenario())


def test_a_rank_joining_a_pre_inference_links_to_that_pre_infer() -> None:
    async def scenario() -> None:
        async with cache_app() as app:
            long = events(history(2, 48))
            gate = blocked(app.runner.worker)  # the production stays queued: the Rank joins it
            with serving(sampled=True) as pre_infer:
                await app.cache.pre_infer("u2", long)
            joining = asyncio.create_task(app.cache.acquire("u2", long, "ranker-a"))
            await asyncio.sleep(0.05)
            gate.set()
            joined = await joining
            app.cache.release(joined)
            assert (joined.source, joined.joined, joined.pre_infer) == (Source.HBM, True, pre_infer)

    asyncio.run(scenario())


def test_a_rank_consuming_a_leased_prefix_links_to_the_pre_infer_that_leased_it_once() -> None:
    async def scenario() -> None:
        async with cache_app() as app:
            long = events(history(3, 48))
            with serving(sampled=True) as pre_infer:
                await app.cache.pre_infer("u3", long)
            await settle(app)
            hit = await app.cache.acquire("u3", long, "ranker-a")
            app.cache.release(hit)
            assert (hit.source, hit.joined, hit.pre_infer) == (Source.HBM, False, pre_infer)

            # A PreInfer of a trace that is not sampled renews the lease: its Rank links to nothing.
            with serving(sampled=False):
                await app.cache.pre_infer("u4", events(history(4, 48)))
            await settle(app)
            unsampled = await app.cache.acquire("u4", events(history(4, 48)), "ranker-a")
            app.cache.release(unsampled)
            assert (unsampled.source, unsampled.pre_infer) == (Source.HBM, None)

    asyncio.run(scenario())
