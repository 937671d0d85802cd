"""A provisional latency curve is measured again in the background, once the device thread is idle, and
replaces itself, no longer provisional: GetProfile and the ranker's metrics say which it is."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from relaygr.v1 import ranker_pb2
from services.ranker.engine.recheck import Recheck
from tests.ranker.harness import blocked, running_ranker
from tests.support.metrics import metric
from tests.support.requests import history, rank_request

SLOWDOWN = 100.0  # how much too slow the disturbed warm-up read every path


class Timings:
    """Times each length at `costs` (its three paths, ms), disturbed (and twice as slow) the first time each
    is asked; records the order and whether it ran on the device thread."""

    def __init__(self, costs: dict[int, tuple[float, float, float]]) -> None:
        self.costs, self.asked, self.on_device = costs, [], []

    def __call__(self, length: int) -> tuple[tuple[float, float, float], bool]:
        first = length not in self.asked
        self.asked.append(length)
        self.on_device.append(threading.current_thread().name == "device")
        return tuple(ms * (2 if first else 1) for ms in self.costs[length]), first


def test_a_provisional_curve_is_measured_again_when_idle_and_is_then_no_longer_provisional():
    async def scenario():
        async with running_ranker() as r:
            calibration = r.app.calibration
            quiet = calibration.curve
            slow = [
                dataclasses.replace(p, full_ms=p.full_ms * SLOWDOWN, pre_infer_ms=p.pre_infer_ms * SLOWDOWN,
                                    rank_ms=p.rank_ms * SLOWDOWN)
                for p in quiet.points
            ]  # fmt: skip
            provisional = dataclasses.replace(quiet, points=tuple(slow), provisional=True)
            calibration.set_curve(provisional)
            profile = await r.stub.GetProfile(ranker_pb2.GetProfileRequest())
            assert profile.provisional
            assert metric("relaygr_latency_curve_provisional") == 1.0

            timer = Timings({p.prefix_length: (p.full_ms, p.pre_infer_ms, p.rank_ms) for p in quiet.points})
            recheck = Recheck(r.app.worker, timer, provisional, calibration.set_curve, 0.05)
            gate = blocked(r.app.worker)  # the device is busy: the recheck waits
            task = asyncio.create_task(recheck.run())
            await asyncio.sleep(0.3)
            assert not task.done() and recheck.quiet == set()
            gate.set()
            curve = await asyncio.wait_for(task, 60)

            assert calibration.curve is curve and not curve.provisional
            assert curve.points == quiet.points  # each length's quiet pass, the disturbed figures gone
            lengths = [p.prefix_length for p in quiet.points]
            assert sorted(timer.asked) == sorted(lengths * 2)  # each disturbed once, then quiet
            assert all(on_device for on_device in timer.on_device)
            profile = await r.stub.GetProfile(ranker_pb2.GetProfileRequest())
            assert not profile.provisional
            assert profile.latency_curve[0].full_ms == curve.points[0].full_ms
            assert metric("relaygr_latency_curve_provisional") == 0.0
            # The ranker serves meanwhile and after.
            answer = await r.stub.Rank(rank_request("u1", history(1, 64), history(2, 4), [1, 2, 3]))
            assert len(answer.scores) == 3

    asyncio.run(scenario())
