"""Calibration: the ranker's latency curve corrected by what its jobs actually took.

- the ratio per path (measured device time over the curve's prediction for the same work) is 1 until
  `min_jobs` jobs of the path have ended, then corrects `predict_ms` and `corrected()` path by path, and
  follows a host whose speed changes (exponential memory);
- the scheduler tells it each job's own device time: a job's Yield-nested jobs are not in it, and a batch's
  pass is told with the work of every job in it;
- a ranker whose curve is wrong by x3 (injected) predicts within ±20 % of its jobs' measured device time
  after a few hundred jobs, in its load book (load reports, backlog limit, shedding) and in GetProfile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaygr.v1 import common_pb2, ranker_pb2
from services.ranker.app import RankerApp
from services.ranker.engine.calibration import MIN_JOBS, PATHS, Calibration, interpolation_weights
from services.ranker.engine.latency_curve import LatencyCurve, LatencyPoint, monotone
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Batch, Op, Priority, Scheduler
from tests.ranker.harness import running_ranker
from tests.support.metrics import metric
from tests.support.requests import history, pre_infer_request, rank_request

CURVE = LatencyCurve(
    (
        LatencyPoint(16, full_ms=2.0, pre_infer_ms=1.0, rank_ms=1.5),
        LatencyPoint(256, full_ms=12.0, pre_infer_ms=8.0, rank_ms=4.0),
    ),
    short_term_length=4,
    num_candidates=8,
)


def calibrated(**kwargs) -> Calibration:
    calibration = Calibration(**kwargs)
    calibration.set_curve(CURVE)
    return calibration


def test_each_path_is_corrected_by_its_own_jobs_once_enough_have_ended():
    calibration = calibrated(memory_jobs=100, min_jobs=10)
    for _ in range(9):  # 3x slower than the curve says, but too few jobs yet
        calibration.observe(Op.PRE_INFER, (256,), 3 * 8.0 / 1000)
    assert calibration.ratio["pre_infer_ms"] == 1.0
    assert calibration.predict_ms("pre_infer_ms", 256) == pytest.approx(8.0)
    calibration.observe(Op.EXTEND, (16,), 1.0)  # no point of the curve: it teaches nothing
    assert calibration.jobs["pre_infer_ms"] == 9
    calibration.observe(Op.PRE_INFER, (256,), 3 * 8.0 / 1000)
    assert calibration.ratio["pre_infer_ms"] == pytest.approx(3.0)
    assert calibration.predict_ms("pre_infer_ms", 256) == pytest.approx(24.0)
    assert calibration.predict_ms("pre_infer_ms", 16) == pytest.approx(3.0)
    # The other paths saw no job: uncorrected.
    assert calibration.predict_ms("rank_ms", 256) == pytest.approx(4.0)
    assert calibration.predict_ms("full_ms", 256) == pytest.approx(12.0)

    for _ in range(10):  # ranks run in half the time predicted, as one batch of two each
        calibration.observe(Op.RANK, (16, 256), (1.5 + 4.0) / 2 / 1000)
    assert calibration.ratio["rank_ms"] == pytest.approx(0.5)
    corrected = calibration.corrected()
    assert [(p.full_ms, p.pre_infer_ms, p.rank_ms) for p in corrected.points] == [
        pytest.approx((2.0, 3.0, 0.75)),
        pytest.approx((12.0, 24.0, 2.0)),
    ]
    assert (corrected.short_term_length, corrected.num_candidates) == (4, 8)


# A pre-inference curve bent by its warm-up: 512 events measured 4x their cost, every other point right.
BENT = LatencyCurve(
    tuple(
        LatencyPoint(length, full_ms=pre + 1.0, pre_infer_ms=pre, rank_ms=1.0)
        for length, pre in ((16, 1.0), (128, 2.0), (512, 24.0), (2048, 40.0))
    ),
    short_term_length=4,
    num_candidates=8,
)
TRUE_PRE_MS = {16: 1.0, 128: 2.0, 512: 6.0, 2048: 40.0}


def test_a_bent_curve_is_straightened_point_by_point_where_jobs_ran():
    calibration = Calibration(memory_jobs=100, min_jobs=10)
    calibration.set_curve(BENT)
    for _ in range(10):
        for length, true_ms in TRUE_PRE_MS.items():
            calibration.observe(Op.PRE_INFER, (length,), true_ms / 1000)
    for length, true_ms in TRUE_PRE_MS.items():
        assert calibration.predict_ms("pre_infer_ms", length) == pytest.approx(true_ms)
    # Between two points, the straightened segment: 1280 events cost what 512 and 2048 say, halfway.
    assert calibration.predict_ms("pre_infer_ms", 1280) == pytest.approx((6.0 + 40.0) / 2)
    # A ratio per path could only scale the curve: its ratio here is about the mean, (1+2+6+40)/(1+2+24+40)
    # (the latest jobs weigh a little more), and would have read 2048 events at 29 ms.
    assert calibration.ratio["pre_infer_ms"] == pytest.approx(49 / 67, rel=0.01)
    assert [p.pre_infer_ms for p in calibration.corrected().points] == pytest.approx(
        list(TRUE_PRE_MS.values())
    )


def test_a_job_between_two_points_teaches_each_by_its_interpolation_weight():
    assert interpolation_weights([16, 128, 512, 2048], 1280) == [(2, 0.5), (3, 0.5)]
    assert interpolation_weights([16, 128, 512, 2048], 512) == [(2, 1.0)]
    assert interpolation_weights([16, 128, 512, 2048], 8) == [(0, 1.0)]  # beyond an end: the end alone
    assert interpolation_weights([16, 128, 512, 2048], 4096) == [(3, 1.0)]
    assert interpolation_weights([256], 64) == [(0, 1.0)]
    calibration = Calibration(memory_jobs=100, min_jobs=10)
    calibration.set_curve(BENT)
    for _ in range(20):  # 1280 events, measured at what the straight curve says: 23 ms
        calibration.observe(Op.PRE_INFER, (1280,), 23.0 / 1000)
    assert calibration.point_jobs["pre_infer_ms"] == pytest.approx([0.0, 0.0, 10.0, 10.0])
    # Each of the two points learnt the job's ratio, 23 / 32 (the bent curve predicted (24 + 40) / 2).
    assert calibration.point_ratio("pre_infer_ms", 2) == pytest.approx(23 / 32)
    assert calibration.point_ratio("pre_infer_ms", 3) == pytest.approx(23 / 32)
    assert calibration.predict_ms("pre_infer_ms", 1280) == pytest.approx(23.0)
    # The points no job reached read their path's ratio, learnt from the same jobs.
    assert (
        calibration.point_ratio("pre_infer_ms", 0)
        == calibration.ratio["pre_infer_ms"]
        == pytest.approx(23 / 32)
    )


def test_a_point_corrected_below_a_shorter_one_lowers_it_too():
    calibration = Calibration(memory_jobs=100, min_jobs=10)
    calibration.set_curve(BENT)
    for _ in range(10):  # 2048 events run in 1 ms: the path's ratio falls, and with it every point
        calibration.observe(Op.PRE_INFER, (2048,), 1.0 / 1000)
    for _ in range(10):  # while 128 events are measured as the curve says
        calibration.observe(Op.PRE_INFER, (128,), 2.0 / 1000)
    corrected = [p.pre_infer_ms for p in calibration.corrected().points]
    assert corrected == sorted(corrected) and corrected[-1] == pytest.approx(1.0)
    assert corrected[1] == pytest.approx(1.0)  # 2 ms measured, lowered to the longer point's 1 ms


def test_jobs_of_other_ops_no_work_and_no_curve_teach_nothing():
    calibration = Calibration(min_jobs=1)
    calibration.observe(Op.PRE_INFER, (256,), 1.0)  # before warm-up: no curve to compare with
    assert calibration.predict_ms("pre_infer_ms", 256) == 0.0
    calibration.set_curve(CURVE)
    calibration.observe(Op.PROFILE, (256,), 1.0)
    calibration.observe(Op.RELOAD, (256,), 1.0)
    calibration.observe(Op.PRE_INFER, (0,), 1.0)
    assert calibration.ratio == dict.fromkeys(PATHS, 1.0) and calibration.jobs == dict.fromkeys(PATHS, 0)
    assert calibration.predict_ms("rank_ms", 0) == 0.0


def test_a_new_curve_forgets_what_was_learnt_against_the_old_one():
    calibration = calibrated(min_jobs=1)
    calibration.observe(Op.RANK, (256,), 3 * 4.0 / 1000)
    assert calibration.ratio["rank_ms"] == pytest.approx(3.0)
    calibration.set_curve(dataclasses.replace(CURVE, points=CURVE.points[:1]))
    assert calibration.ratio == dict.fromkeys(PATHS, 1.0)
    assert calibration.predict_ms("rank_ms", 16) == pytest.approx(1.5)


@settings(max_examples=50, deadline=None)
@given(before=st.floats(0.1, 10.0), after=st.floats(0.1, 10.0))
def test_the_ratio_follows_a_host_whose_speed_changes(before: float, after: float):
    """After about five memories of jobs at the new speed the old one weighs under 1 %."""
    calibration = calibrated(memory_jobs=100, min_jobs=10)
    for _ in range(300):
        calibration.observe(Op.UNCACHED, (256,), before * 12.0 / 1000)
    assert calibration.ratio["full_ms"] == pytest.approx(before)
    for _ in range(500):
        calibration.observe(Op.UNCACHED, (256,), after * 12.0 / 1000)
    assert calibration.ratio["full_ms"] == pytest.approx(after, rel=0.01 * max(before / after, 1.0))


def test_the_scheduler_tells_each_job_its_own_time_without_the_jobs_nested_at_its_yield():
    told: list[tuple[Op, tuple[int, ...], float]] = []
    lock = threading.Lock()

    def observe(op: Op, works, seconds: float) -> None:
        with lock:
            told.append((op, tuple(works), seconds))

    async def scenario() -> None:
        worker = Scheduler("test", observer=observe)
        try:
            nested_started = asyncio.Event()
            loop = asyncio.get_running_loop()

            def long_job(yield_) -> None:
                time.sleep(0.05)
                loop.call_soon_threadsafe(nested_started.set)
                time.sleep(0.05)  # the rank below is queued by now
                yield_()  # runs it here, 0.3 s
                time.sleep(0.05)

            outer = worker.submit_yielding(long_job, Priority.PRE_INFER, Op.PRE_INFER, work=256)
            await nested_started.wait()
            nested = worker.submit_yielding(lambda _: time.sleep(0.3), Priority.RANK, Op.UNCACHED, work=64)
            await asyncio.gather(outer, nested)
            # A batch of two ranks: one pass, told once with both works.
            gate = threading.Event()
            worker.submit(lambda: gate.wait(10), Priority.RANK, Op.PROFILE)  # holds the thread
            batch = Batch(lambda items: [time.sleep(0.01) or item for item in items], max_size=8)
            ranks = [worker.submit_batched(n, batch, Priority.RANK, Op.RANK, work=n) for n in (16, 32)]
            gate.set()
            assert await asyncio.gather(*ranks) == [16, 32]
        finally:
            worker.close()

    asyncio.run(scenario())
    (nested_op, nested_works, nested_s), (outer_op, outer_works, outer_s), batch = told
    assert (nested_op, nested_works) == (Op.UNCACHED, (64,)) and nested_s >= 0.3
    # The outer job slept 0.15 s of its own; the 0.3 s nested in it are not its.
    assert (outer_op, outer_works) == (Op.PRE_INFER, (256,)) and 0.15 <= outer_s < 0.3
    assert batch[:2] == (Op.RANK, (16, 32)) and batch[2] >= 0.02
    # The job without work (the gate) told nothing.
    assert len(told) == 3


PASS_S = 0.01  # what each model pass of `SlowDevice` takes on top of the model's own work


class SlowDevice(ModelRunner):
    """The real model on a device whose every pass (pre-inference, rank, batch of ranks) takes `PASS_S` more:
    most of a job's time is then the same whatever else the test machine runs, so a mean over a few hundred
    jobs is a steady target for the correction (the model's own milliseconds on a shared 2-core host are
    not: their mean drifts by a third within a minute)."""

    def build_sync(self, *args, **kwargs):
        time.sleep(PASS_S)
        return super().build_sync(*args, **kwargs)

    def rank_sync(self, *args, **kwargs):
        time.sleep(PASS_S)
        return super().rank_sync(*args, **kwargs)

    def rank_batch_sync(self, *args, **kwargs):
        time.sleep(PASS_S)
        return super().rank_batch_sync(*args, **kwargs)


def test_a_ranker_whose_curve_is_three_times_off_predicts_its_jobs_within_20_percent(monkeypatch):
    """The ranker's curve is replaced by one that reads every path x3 slow (as a warm-up on contended cores
    measures it). After a few hundred jobs, what its load book predicts for a job (what its load reports,
    backlog limit and shedding read) and GetProfile's curve are within ±20 % of what its latest jobs took on
    the device thread, read from relaygr_model_seconds (each job's own time: the requests go one at a
    time, so no job is nested in another and no ranks are batched)."""
    candidates = list(range(1, 17))
    length = 96
    monkeypatch.setattr(RankerApp, "runner_class", SlowDevice)

    async def scenario() -> None:
        async with running_ranker(profile_lengths="64,256", torch_threads=1) as r:
            calibration, load = r.app.plane.calibration, r.app.cache.load
            measured = calibration.curve
            off = dataclasses.replace(
                measured,
                points=tuple(
                    dataclasses.replace(
                        p, full_ms=3 * p.full_ms, pre_infer_ms=3 * p.pre_infer_ms, rank_ms=3 * p.rank_ms
                    )
                    for p in measured.points
                ),
            )
            calibration.set_curve(off)
            uncorrected = {
                "pre_infer": load.cost_ms("pre_infer_ms", length),
                "rank": load.cost_ms("rank_ms", length),
            }

            async def pairs(users: range) -> None:
                """PreInfer, then a Rank that finds the prefix in HBM, for each user: one job each."""
                for user in users:
                    long = history(user, length)
                    await r.stub.PreInfer(pre_infer_request(f"u{user}", long))
                    await r.settle()
                    ranked = await r.stub.Rank(rank_request(f"u{user}", long, [1, 2, 3, 4], candidates))
                    assert ranked.cache_source == common_pb2.CACHE_SOURCE_HBM

            await pairs(range(100))  # 200 jobs
            before = {op: metric("relaygr_model_seconds_sum", op=op) for op in uncorrected}
            measured_pairs = 200  # 400 more jobs, whose mean time is compared with the prediction
            await pairs(range(100, 100 + measured_pairs))
            took_ms = {
                op: (metric("relaygr_model_seconds_sum", op=op) - before[op]) * 1000 / measured_pairs
                for op in before
            }
            predicted = {
                "pre_infer": load.cost_ms("pre_infer_ms", length),
                "rank": load.cost_ms("rank_ms", length),
            }
            for op in predicted:
                assert predicted[op] == pytest.approx(took_ms[op], rel=0.2), (
                    op,
                    uncorrected,
                    calibration.ratio,
                )
            # The mechanism: GetProfile answers the injected curve, each point times its own ratio (the two
            # points the jobs fell between learnt theirs; the others read their path's), made monotone; the
            # gauge shows each path's ratio.
            profile = await r.stub.GetProfile(ranker_pb2.GetProfileRequest())
            lengths = [point.prefix_length for point in off.points]
            learnt = {index for index, _ in interpolation_weights(lengths, length)}
            for path in ("pre_infer_ms", "rank_ms"):
                assert [i for i, w in enumerate(calibration.point_jobs[path]) if w >= MIN_JOBS] == sorted(
                    learnt
                )
            expected = monotone(
                [
                    dataclasses.replace(
                        wrong,
                        pre_infer_ms=wrong.pre_infer_ms * calibration.point_ratio("pre_infer_ms", index),
                        rank_ms=wrong.rank_ms * calibration.point_ratio("rank_ms", index),
                    )
                    for index, wrong in enumerate(off.points)
                ]
            )
            for point, corrected in zip(profile.latency_curve, expected, strict=True):
                assert point.pre_infer_ms == pytest.approx(corrected.pre_infer_ms)
                assert point.rank_ms == pytest.approx(corrected.rank_ms)
            ratio = calibration.ratio
            assert metric("relaygr_cost_correction", path="rank_ms") == ratio["rank_ms"]
            print(f"uncorrected {uncorrected}, corrected {predicted}, measured {took_ms} ms a job")

    asyncio.run(scenario())


def test_a_point_the_curve_prices_at_zero_teaches_nothing_and_never_divides_by_zero():
    free = LatencyCurve(
        (LatencyPoint(16, full_ms=0.0, pre_infer_ms=0.0, rank_ms=0.0), LatencyPoint(256, 4.0, 2.0, 1.0)),
        short_term_length=4,
        num_candidates=8,
    )
    calibration = Calibration(memory_jobs=100, min_jobs=1)
    calibration.set_curve(free)
    calibration.observe(Op.RANK, (16,), 0.005)  # the curve says 0 ms here: no ratio can be learnt
    assert calibration.point_jobs["rank_ms"] == [0.0, 0.0] and calibration.ratio["rank_ms"] == 1.0
    calibration.observe(Op.RANK, (256,), 0.002)  # twice the curve's 1 ms
    assert calibration.point_ratio("rank_ms", 1) == pytest.approx(2.0)
    assert calibration.predict_ms("rank_ms", 16) == 0.0 and calibration.predict_ms("rank_ms", 256) == 2.0
