"""A Rank's wait behind pre-inference is bounded, on the CPU and on an asynchronous device.

On CPU the device thread runs every queued Rank between two pre-infer chunks, so a Rank waits for at most the
chunk in progress. On an accelerator kernels launch asynchronously: the runner puts Ranks on the rank stream,
pre-inference on the pre-infer stream, and keeps at most `inflight_chunks` chunks queued on the device. A
`LaggingDevice` (the CPU stand-in whose events complete only when the host waits for them, like a device that
runs behind the host) shows the window and the event hand-offs without a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from services.ranker.device.accelerator import Accelerator
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Priority, Scheduler
from services.ranker.model.events import Events
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset

TINY = get_preset("cpu-tiny")
CHUNK = 16


def random_events(length: int, seed: int) -> Events:
    rng = np.random.default_rng(seed)
    return Events.of(rng.integers(0, 2**40, length), rng.integers(0, TINY.num_action_types, length))


class LaggingEvent:
    """An event of a device that runs behind the host: complete only once the host has waited for it."""

    def __init__(self, device: LaggingDevice, stream) -> None:
        self.device, self.stream, self.done = device, stream, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.device.log.append(("synchronize", self))
        self.done = True

    def wait(self, stream=None) -> None:
        self.device.log.append(("wait", self, self.device.current))


class LaggingDevice(Accelerator):
    """The CPU stand-in with a current stream and lagging events, logging what the runner asks of it."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.current = None
        self.log: list[tuple] = []
        self.queued_at_launch: list[int] = []  # pre-infer events not yet complete when the next is recorded

    @contextlib.contextmanager
    def on(self, stream):
        outer, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = outer

    def record(self, stream=None):
        stream = stream if stream is not None else self.current
        if stream is self.pre_infer_stream:
            recorded = (e for kind, e, *_ in self.log if kind == "record")
            pending = [e for e in recorded if e.stream is stream and not e.done]
            self.queued_at_launch.append(len(pending))
        event = LaggingEvent(self, stream)
        self.log.append(("record", event))
        return event


def runner_on(device: Accelerator, scheduler: Scheduler, inflight_chunks: int = 2) -> ModelRunner:
    return ModelRunner(HSTURanker(TINY), scheduler, CHUNK, None, "v", device, inflight_chunks=inflight_chunks)


def test_pre_inference_keeps_at_most_the_window_of_chunks_queued_on_the_device():
    device, scheduler = LaggingDevice(), Scheduler("test")
    try:
        runner = runner_on(device, scheduler, inflight_chunks=2)
        kv = runner.build_sync(random_events(8 * CHUNK, 1), background=True)
    finally:
        scheduler.close()
    # 8 chunks and the prefix's own "done" event: when each was recorded, at most 2 chunks were still queued,
    # and the bound was reached (without the window all 8 would be queued by the end).
    assert len(device.queued_at_launch) == 9
    assert max(device.queued_at_launch) == 2
    # The host waited on single events, oldest first, never on the whole device.
    waited = [event for kind, event, *_ in device.log if kind == "synchronize"]
    recorded = [event for kind, event, *_ in device.log if kind == "record"]
    assert waited == recorded[: len(waited)] and len(waited) == 6
    # The prefix is handed over by its last event, once per layer, and is what a one-pass pre_infer computes.
    assert kv.ready is not None and set(map(id, kv.ready)) == {id(recorded[-1])}
    events = random_events(8 * CHUNK, 1)
    expected = runner.model.pre_infer(runner._tensor(events.item_ids), runner._tensor(events.action_types))
    assert_close(kv.buffer, expected.buffer)


def test_a_rank_waits_for_the_producing_stream_by_event_not_by_the_host():
    device, scheduler = LaggingDevice(), Scheduler("test")
    try:
        runner = runner_on(device, scheduler)
        kv = runner.build_sync(random_events(3 * CHUNK, 2), background=True)
        done = kv.ready[0]
        device.log.clear()
        runner.rank_sync(kv, random_events(4, 3), [1, 2, 3])
    finally:
        scheduler.close()
    waits = [(event, stream) for kind, event, *rest in device.log if kind == "wait" for stream in rest]
    # Each layer's attention made the rank stream wait for the prefix's event; the host never blocked on it.
    assert waits and all(event is done and stream is device.rank_stream for event, stream in waits)
    assert not done.done
    assert len(waits) >= TINY.num_layers


@pytest.mark.parametrize("priority", [Priority.PRE_INFER, Priority.AWAITED], ids=["pre-infer", "miss"])
def test_a_rank_queued_during_a_prefix_runs_before_the_next_chunk(priority):
    """The scheduler's bounded wait on the CPU path: the Rank waits for the chunk in progress only, behind a
    background pre-inference and behind a prefix another Rank waits for (a miss's) alike."""

    async def scenario():
        scheduler = Scheduler("test")
        runner = runner_on(Accelerator(torch.device("cpu")), scheduler)
        log: list[str] = []
        rank_queued = threading.Event()
        fill = runner.model._fill

        def logged_fill(buffer, start, items, actions):
            log.append(f"chunk@{start}")
            if start == CHUNK:  # the second chunk: hold it until the Rank is queued behind it
                loop.call_soon_threadsafe(ready.set)
                assert rank_queued.wait(10)
            fill(buffer, start, items, actions)

        prefix = runner.model.pre_infer(*(runner._tensor(x) for x in (range(8), range(8))))
        rank_sync = runner.rank_sync

        def logged_rank(*args):
            log.append("rank")
            return rank_sync(*args)

        runner.model._fill, runner.rank_sync = logged_fill, logged_rank
        loop, ready = asyncio.get_running_loop(), asyncio.Event()
        try:
            background = runner.pre_infer(random_events(6 * CHUNK, 4), priority)
            await ready.wait()
            ranked = runner.rank(prefix, random_events(2, 5), [7, 8], deadline=None)
            for _ in range(500):
                if scheduler.queued(Priority.RANK):
                    break
                await asyncio.sleep(0.01)
            assert scheduler.queued(Priority.RANK) == 1
            rank_queued.set()
            await asyncio.gather(background, ranked)
        finally:
            scheduler.close()
        # Queued while the second chunk was held, the Rank ran right after that chunk, before the third.
        assert log == ["chunk@0", f"chunk@{CHUNK}", "rank", *(f"chunk@{i * CHUNK}" for i in range(2, 6))]

    asyncio.run(scenario())
