"""The in-process floor timed apart (`bench.lib.floor.in_fresh_process`): in a fresh process, with the
same answer's shape as in this one, and no process left behind."""

from __future__ import annotations

import multiprocessing

import pytest

from bench.lib import floor


def test_the_floor_timed_apart_runs_in_a_fresh_process_and_leaves_none_behind(monkeypatch):
    args = ("cpu-tiny", 1, [64, 256], 4, 8, 2, 128)
    here = floor.model_floor(*args)

    def broken(*args: object) -> None:
        raise AssertionError("timed in this process")

    # This process's profiler is broken: only a fresh process, importing its own, can time the floor.
    monkeypatch.setattr(floor, "measure", broken)
    with pytest.raises(AssertionError, match="timed in this process"):
        floor.model_floor(*args)
    apart = floor.in_fresh_process(floor.model_floor, *args)
    assert [p.prefix_length for p in apart] == [p.prefix_length for p in here] == [16, 64, 256]
    assert all(p.rank_ms > 0 and p.pre_infer_ms > 0 and p.full_ms > 0 for p in apart)
    assert multiprocessing.active_children() == []
