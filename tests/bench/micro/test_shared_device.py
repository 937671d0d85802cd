"""K rankers on one simulated device: the pass times are the H200's committed figures, the device is one
lock that every sharing ranker's passes hold in turn, and the command measures the rankers it starts."""

from __future__ import annotations

import fcntl
import threading
import time

import pytest

from bench.lib import envelope
from bench.micro import shared_device
from bench.micro.shared_device import Point, capacity, within
from bench.micro.simulated_device import RESULTS, SIMULATED_DEVICE_SECONDS, DeviceTimes, SimulatedDevice


def test_the_pass_times_are_the_h200s_measured_figures_between_its_lengths():
    times = DeviceTimes.h200()
    fleet = envelope.read(RESULTS / "gpu-fleet" / "results.json", "run")
    accelerator = envelope.read(RESULTS / "gpu-accelerator" / "results.json", "accelerator")
    floor = {p["prefix_length"]: p["pre_infer_ms"] for p in fleet["floor"]}
    graphs = {g["length"]: g for g in accelerator["graphs"]}
    assert times.pre_infer(2048) == pytest.approx(floor[2048])
    assert times.pre_infer(1536) == pytest.approx((floor[1024] + floor[2048]) / 2)
    assert times.pre_infer(100) == pytest.approx(floor[1024])  # below the lengths measured: the nearest
    assert times.rank(2048) == pytest.approx(graphs[2048]["graph_p50_ms"])
    assert times.rank(2048, 8) == pytest.approx(graphs[2048]["graph_batch_p50_ms"])
    # A batch costs the device less than its users one at a time, more than one of them.
    assert times.rank(2048) < times.rank(2048, 4) < 4 * times.rank(2048)


def test_a_pass_holds_the_device_that_every_sharer_waits_for(tmp_path):
    """Two sharers open the device apart (as two processes do): while one's pass holds it, the other
    cannot take it; the holder counts at least the pass's time."""
    lock = tmp_path / "device"
    holder = SimulatedDevice(str(lock), DeviceTimes.h200())
    before = SIMULATED_DEVICE_SECONDS._value.get()
    pass_ = threading.Thread(target=holder.hold, args=(300.0,))
    pass_.start()
    with lock.open("a") as other:
        deadline, taken = time.monotonic() + 10, False
        while not taken and time.monotonic() < deadline:  # until the pass has the device
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(other, fcntl.LOCK_UN)
            except BlockingIOError:
                taken = True
        assert taken and pass_.is_alive()
        pass_.join()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once the pass is done
    assert SIMULATED_DEVICE_SECONDS._value.get() - before >= 0.3


def point(k: int, rate: float, p99: float, errors: dict | None = None) -> Point:
    return Point(
        launches="graphs", sharers=k, rate=rate, pairs=10, wall_s=1.0, device_s=0.1, device_busy=0.1,
        rank_p50_ms=1.0, rank_p99_ms=p99, ranker_cores=0.5, generator_cores=0.1, other_cores=0.0, sources={},
        errors=errors or {},
    )  # fmt: skip


def test_each_ks_capacity_is_its_highest_rate_within_the_p99_without_errors():
    points = [
        point(1, 50, 10),
        point(1, 100, 60),
        point(2, 50, 70),
        point(4, 50, 10),
        point(4, 100, 5, {"x": 1}),
    ]
    best = capacity(points, 50.0)
    assert best["graphs", 1] is points[0] and best["graphs", 2] is None and best["graphs", 4] is points[3]
    assert within(points[0], 50.0) and not within(points[4], 50.0)


def test_two_rankers_sharing_the_device_serve_relayed_ranks_and_hold_it_for_their_passes(tmp_path):
    length = 1024
    shared_device.main(
        ["--sharers", "2", "--launches", "eager", "--rates", "20", "--seconds", "2", "--warmup-pairs", "4",
         "--length", str(length), "--out", str(tmp_path)]
    )  # fmt: skip
    record = envelope.read(tmp_path / "results.json", "shared-device")
    (measured,) = record["points"]
    assert (measured["launches"], measured["sharers"], measured["pairs"]) == ("eager", 2, 40)
    assert not measured["errors"]
    # Every Rank found its pre-inferred prefix on the ranker the pair went to.
    assert sum(measured["sources"].values()) == 40 and "CACHE_SOURCE_MISS" not in measured["sources"]
    # The device was held at least for the pre-inferences (ranks add to it, less when batched).
    least = measured["pairs"] * DeviceTimes.h200().pre_infer(length) / 1000
    assert measured["device_s"] >= least - 1e-4
    assert measured["device_busy"] == pytest.approx(measured["device_s"] / measured["wall_s"], abs=1e-3)
    assert "| eager | 2 | 20 |" in (tmp_path / "summary.md").read_text()
    # Eager launches are host CPU: the rankers spent at least each rank's launches.
    launches = measured["pairs"] * DeviceTimes.h200().launches(length) / 1000
    assert measured["ranker_cores"] * measured["wall_s"] >= launches * 0.99
