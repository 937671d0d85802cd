"""The warm-up latency curve: always anchored at a short prefix, and never dearer at a shorter one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.ranker.engine.latency_curve import ANCHOR_LENGTH, LatencyPoint, curve_lengths, monotone


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
