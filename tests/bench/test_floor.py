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


def timers_built() -> int:
    """In a probe's process: how many timers (models) it has built."""
    return len(floor._PROBE_TIMERS)


def test_the_host_probe_reads_from_one_process_that_keeps_its_model_and_leaves_none_behind(monkeypatch):
    """`UnitProbe` times its pass in a process of its own (this one's profiler is broken), builds the model
    once (the process's timer count stays 1 over three readings), and is gone once closed."""
    monkeypatch.setattr(floor, "measure", lambda timer: (_ for _ in ()).throw(AssertionError("here")))
    probe = floor.UnitProbe("cpu-tiny", 1, 4, 64, length=64, repeats=1)
    try:
        readings = [probe() for _ in range(3)]
        timers = probe._apart.submit(timers_built).result()
    finally:
        probe.close()
    assert all(0 < ms < 10_000 for ms in readings) and timers == 1
    assert multiprocessing.active_children() == []
