"""The warm-up latency curve: always anchored at a short prefix, measured in rounds across the lengths, and
never dearer at a shorter one."""

from __future__ import annotations

import dataclasses
import time

from hypothesis import given
from hypothesis import strategies as st

from services.ranker.config import RankerConfig
from services.ranker.engine.latency_curve import (
    ANCHOR_LENGTH,
    INVERSION,
    LatencyPoint,
    Profiling,
    Timer,
    curve_lengths,
    inverted,
    monotone,
    rounds,
)
from services.ranker.engine.runner import ModelRunner
from services.ranker.engine.scheduler import Scheduler
from services.ranker.model.hstu import HSTURanker
from services.ranker.model.presets import get_preset


def test_every_curve_starts_at_the_anchor_length():
    assert curve_lengths([128, 512, 2048]) == [ANCHOR_LENGTH, 128, 512, 2048]
    assert curve_lengths([8, 64]) == [8, ANCHOR_LENGTH, 64]
    assert curve_lengths([ANCHOR_LENGTH, 64]) == [ANCHOR_LENGTH, 64]
    assert curve_lengths([4]) == [4]  # a ranker that takes no longer history measures no longer prefix


def test_a_stalled_short_point_is_lowered_to_the_least_of_the_longer_ones():
    measured = [
        LatencyPoint(16, full_ms=1095.9, pre_infer_ms=263.0, rank_ms=30.0),  # the first, stalled
        LatencyPoint(128, full_ms=155.6, pre_infer_ms=39.7, rank_ms=18.0),
        LatencyPoint(512, full_ms=142.2, pre_infer_ms=55.2, rank_ms=19.0),
        LatencyPoint(2048, full_ms=674.8, pre_infer_ms=521.6, rank_ms=32.0),
    ]
    assert monotone(measured) == (
        LatencyPoint(16, full_ms=142.2, pre_infer_ms=39.7, rank_ms=18.0),
        LatencyPoint(128, full_ms=142.2, pre_infer_ms=39.7, rank_ms=18.0),
        LatencyPoint(512, full_ms=142.2, pre_infer_ms=55.2, rank_ms=19.0),
        LatencyPoint(2048, full_ms=674.8, pre_infer_ms=521.6, rank_ms=32.0),
    )


TIMES = st.floats(0.01, 1e4)


@given(st.lists(st.tuples(TIMES, TIMES, TIMES), min_size=1, max_size=8))
def test_the_lowered_curve_never_falls_and_never_exceeds_what_was_measured(times):
    measured = [LatencyPoint(16 * 2**i, *row) for i, row in enumerate(times)]
    lowered = monotone(measured)
    for path in ("full_ms", "pre_infer_ms", "rank_ms"):
        values = [getattr(point, path) for point in lowered]
        assert values == sorted(values)
        assert all(low <= getattr(point, path) for low, point in zip(values, measured, strict=True))
        assert values[-1] == getattr(measured[-1], path)
    assert [point.prefix_length for point in lowered] == [point.prefix_length for point in measured]


LENGTHS = [16, 128, 512, 2048]
# A path's own cost (full, pre-inference, cached rank) at each length, ms: what a quiet device measures.
COST = {16: (4.0, 1.0, 3.0), 128: (6.0, 2.0, 3.2), 512: (12.0, 6.0, 3.6), 2048: (40.0, 30.0, 5.0)}


class Device:
    """Times a length at its own cost, or `stall` times it while the call's number is in `stalled`
    (another ranker warming up on the same cores); records the order it was asked in. With `seen`, a
    stalled call reports itself disturbed (its wall time over its thread's CPU time), as on a CPU device."""

    def __init__(self, stalled, stall: float = 10.0, seen: bool = False) -> None:
        self.stalled, self.stall, self.seen, self.asked = stalled, stall, seen, []

    def __call__(self, length: int) -> tuple[tuple[float, float, float], bool]:
        stalled = len(self.asked) in self.stalled
        self.asked.append(length)
        return tuple(ms * (self.stall if stalled else 1.0) for ms in COST[length]), stalled and self.seen


def true_curve() -> list[LatencyPoint]:
    return [LatencyPoint(length, *COST[length]) for length in LENGTHS]


def test_a_spell_of_contention_slows_one_round_of_every_length_not_every_repeat_of_the_first_ones():
    # The other ranker warms up through the first 10 passes: the untimed round, the first timed round and
    # half the second. Measured one length at a time (3 repeats each after a warm pass), those 10 passes
    # would have been every pass of 16 and 128 events and half of 512's, while 2048 was measured quiet:
    # the longest point the cheapest, and the lowered curve flat, with no gain at any length.
    device = Device(stalled=range(10))
    measured = rounds(LENGTHS, device, repeats=3).points
    assert device.asked == LENGTHS * 4  # an untimed round, then three rounds across every length
    assert measured == true_curve()  # the last round was quiet for every length
    assert monotone(measured) == tuple(true_curve())


def test_a_curve_still_inverted_after_its_rounds_is_measured_for_more_rounds():
    # 16 events stall in each of the three timed rounds (passes 4, 8 and 12), so they measure dearer than
    # 128: the curve is measured again, and the fourth round's quiet pass is kept.
    device = Device(stalled={4, 8, 12})
    assert rounds(LENGTHS, device, repeats=3).points == true_curve()
    assert device.asked == LENGTHS * 5


def test_the_extra_rounds_are_bounded_by_the_repeats():
    device = Device(stalled=set(range(0, 100, 4)))  # 16 events stall whenever they are measured
    measured = rounds(LENGTHS, device, repeats=2).points
    assert device.asked == LENGTHS * 5  # the untimed round, 2 rounds and at most 2 more
    assert measured[0] == LatencyPoint(16, *(ms * 10 for ms in COST[16]))  # kept, then lowered by `monotone`
    assert measured[1:] == true_curve()[1:]


def test_an_inversion_is_a_shorter_point_dearer_than_a_longer_one_by_more_than_the_tolerance():
    quiet = {length: list(COST[length]) for length in LENGTHS}
    assert not inverted(quiet)
    within = {**quiet, 16: [COST[128][0] * INVERSION, *COST[16][1:]]}  # as dear as 128 events allow
    assert not inverted(within)
    beyond = {**quiet, 128: [COST[128][0], COST[512][1] * INVERSION * 1.01, COST[128][2]]}
    assert inverted(beyond)


@given(st.lists(st.sets(st.integers(0, 3), max_size=3), min_size=3, max_size=3))
def test_a_length_measured_quiet_in_any_round_gets_its_own_cost(stalls_by_round):
    # Round r (0-2, after the untimed round) stalls the lengths in stalls_by_round[r]; every length is
    # quiet in at least one of them when no index is in all three sets.
    assume_quiet = set.intersection(*stalls_by_round)
    stalled = {4 * (round_ + 1) + index for round_, stalls in enumerate(stalls_by_round) for index in stalls}
    measured = rounds(LENGTHS, Device(stalled), repeats=3).points
    for index, point in enumerate(measured):
        if index not in assume_quiet:
            assert point == LatencyPoint(LENGTHS[index], *COST[LENGTHS[index]])


def test_lengths_measured_disturbed_are_measured_again_until_quiet():
    # Every pass of the first timed round runs disturbed (passes 4-7), and 512 events again in the second
    # (pass 10): only the lengths never yet quiet are measured again, once more here.
    device = Device(stalled=set(range(4, 8)) | {10}, seen=True)
    measured = rounds(LENGTHS, device, repeats=2, retries=4)
    assert device.asked == LENGTHS * 3 + [512]
    assert measured.points == true_curve()
    assert not measured.provisional


def test_a_curve_disturbed_to_the_end_of_its_retries_is_provisional():
    device = Device(stalled=set(range(4, 100)), seen=True)  # another ranker holds the cores throughout
    measured = rounds(LENGTHS, device, repeats=2, retries=3)
    assert device.asked == LENGTHS * 6  # the untimed round, 2 rounds and the 3 retries: bounded
    assert measured.provisional
    assert measured.points == [LatencyPoint(length, *(ms * 10 for ms in COST[length])) for length in LENGTHS]


def test_by_default_a_disturbed_warm_up_is_provisional_at_once():
    # Rankers warming up together disturb each other in every round: the default adds no round for them.
    retries = RankerConfig().profile_retry_rounds
    device = Device(stalled=set(range(4, 100)), seen=True)
    measured = rounds(LENGTHS, device, repeats=2, retries=retries)
    assert device.asked == LENGTHS * 3  # the untimed round and the 2 timed ones, nothing more
    assert measured.provisional


def test_a_disturbed_pass_is_wall_time_far_above_the_threads_cpu_time():
    """On the device thread of a real cpu-tiny model: passes whose wall time is their CPU time are quiet, ones
    that also sleep (wall time without CPU, as when another process holds the core) are disturbed."""
    runner = ModelRunner(HSTURanker(get_preset("cpu-tiny")).eval(), Scheduler("test-device"), 64, None, "v")
    try:
        judged = Profiling([64], 4, 8, 1, 0, disturbed_ratio=1.5)
        quiet = Timer(runner, judged)
        quiet._timed = lambda fn: (1.0, 0.9, fn())  # wall, CPU ms
        assert quiet(64) == ((1.0, 1.0, 1.0), False)
        slow = Timer(runner, judged)
        slow._timed = sleepy(slow._timed)
        times, disturbed = slow(64)
        assert disturbed and min(times) >= 50
        unjudged = Timer(runner, dataclasses.replace(judged, disturbed_ratio=None))
        unjudged._timed = sleepy(unjudged._timed)
        assert not unjudged(64)[1]  # an accelerator's thread waits without CPU: not judged
    finally:
        runner.worker.close()


def sleepy(timed):
    """`timed` whose passes each sleep 50 ms first: wall time the thread spends without CPU."""

    def wrapped(fn):
        return timed(lambda: (time.sleep(0.05), fn())[1])

    return wrapped
