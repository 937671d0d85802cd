"""The block experiment over fake fleets and a fake canary whose answers are known: `FakeBench` runs the
real `HeadlineBench` (its calibration, fleet warm-ups, orders, trials, slowdowns and top-ups) with `drive`
answering every request at once with a latency set by the arm, and `fake_results` runs the whole command
with it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc

from bench.headline import __main__ as headline_main
from bench.headline.__main__ import HeadlineBench
from bench.headline.config import HeadlineConfig, load_rate
from bench.headline.schema import HeadlineResults
from bench.lib.recommends import Load
from bench.lib.workload import RevisitSampler
from relaygr.v1 import common_pb2, recommend_pb2
from services.common.config import load
from services.loadgen.openloop import CallRecord

U_MS = 70.0
CANARY_MS = 7.0
ARGS = ["--model-preset", "cpu-tiny", "--requests", "40", "--baseline-requests", "60", "--warmup-s", "1",
        "--resamples", "300", "--unit-timings", "3"]  # fmt: skip


@dataclasses.dataclass
class FakeFleet:
    mode: object

    def pids(self) -> dict[str, int]:
        return {}

    def stub(self, universe: object, delay_ms: float) -> str:
        return f"fake://{self.mode.name}"  # type: ignore[attr-defined]


def rank_ms(mode: str, rate: float, index: int, load: float, speed: float = 1.0) -> float:
    """On a host of `speed` 1 at its L (`load`): the baseline 100-199 ms; RelayGR at kL 25·k ms plus a spread
    of 0-9 ms; admit-all at kL 30·k ms plus the same spread. Every 50th request of the baseline is over
    230 ms (its P99 is 230+). A host `speed` times slower takes `speed` times as long at the same k."""
    k = rate / load
    if mode == "baseline":
        return speed * (240.0 if index % 50 == 49 else 100.0 + index % 100)
    return speed * ((25.0 if mode == "relay" else 30.0) * k + index % 10)


class FakeCanary:
    """u timings about `U_MS`, times the bench's `speed(block)` for the block about to run (1 for the
    calibration); canary readings of `CANARY_MS`, times its `slow(block)`."""

    def __init__(self, bench: FakeBench) -> None:
        self.bench = bench
        self.unit_calls: list[tuple[int, int]] = []

    def __enter__(self) -> FakeCanary:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def _speed(self) -> float:
        return self.bench.speed(len(self.bench.blocks)) if self.bench.calibration else 1.0

    def unit_timings(self, length: int, count: int) -> list[float]:
        self.unit_calls.append((length, count))
        base = [U_MS - 1.0, U_MS, U_MS + 5.0][:count] + [U_MS] * max(count - 3, 0)
        return [ms * self._speed() for ms in base]

    def readings(self, count: int) -> list[float]:
        return [CANARY_MS * self.bench.slow(len(self.bench.blocks))] * count

    @contextlib.contextmanager
    def beside(self) -> Iterator[list[float]]:
        yield [CANARY_MS]


class FakeBench(HeadlineBench):
    """`HeadlineBench` with fake fleets, drive and canary (`slow`: the canary's factor for each block
    index); `driven` records every run's (mode, rate, total, seed), the fleets' warm-ups first."""

    slow: Callable[[int], float] = staticmethod(lambda block: 1.0)
    # How much slower than U_MS the host runs through each block, its u timing included, by block index.
    speed: Callable[[int], float] = staticmethod(lambda block: 1.0)
    # The cores other processes take during each trial of a block, by block index.
    busy: Callable[[int], float] = staticmethod(lambda block: 0.1)
    made: list[FakeBench] = []  # every one made, in order: the fake canary reads the latest's blocks

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.driven: list[tuple[str, float, int, int]] = []
        FakeBench.made.append(self)

    def fleets(self, driver: object, stack: contextlib.ExitStack) -> dict[str, FakeFleet]:
        return {name: FakeFleet(mode) for name, mode in headline_main.MODES.items()}

    def foreign_cores(self, fleet: object, before: dict[str, object]) -> float:
        return self.busy(len(self.blocks))

    def drive(self, address: str, sampler: RevisitSampler, load: Load) -> list[CallRecord]:
        assert self.calibration is not None
        mode, rate = address.removeprefix("fake://"), load.rate
        self.driven.append((mode, rate, load.total, load.seed))
        speed = self.speed(len(self.blocks))
        source = common_pb2.CACHE_SOURCE_MISS if mode == "baseline" else common_pb2.CACHE_SOURCE_HBM
        out = []
        for index in range(load.total):
            ms = rank_ms(mode, rate, index, load_rate(U_MS * speed), speed)
            response = recommend_pb2.RecommendResponse(
                rank_latency_ms=ms, cache_source=source, long_term_length=1024
            )
            out.append(CallRecord(index, index / rate, index / rate, 0.01, grpc.StatusCode.OK, "", response))
        return out


def run_bench(
    argv: Sequence[str] = (),
    slow: Callable[[int], float] = lambda block: 1.0,
    busy: Callable[[int], float] = lambda block: 0.1,
    speed: Callable[[int], float] = lambda block: 1.0,
) -> FakeBench:
    """`FakeBench` over `ARGS` and `argv`, run to its end (under the `fast` fixture: conftest.py)."""
    config = load(HeadlineConfig, [*ARGS, *argv])
    bench = FakeBench(config, Path("/nonexistent"), log=lambda line: None)
    bench.slow, bench.busy, bench.speed = slow, busy, speed
    bench.run()
    return bench


def fake_results(
    name: str, argv: Sequence[str] = (), slow: Callable[[int], float] = lambda block: 1.0
) -> HeadlineResults:
    """The whole command, `python -m bench headline --name <name>`, over `FakeBench` (with the `fast`
    fixture: it writes under its folder)."""

    class Bench(FakeBench):
        pass

    Bench.slow = staticmethod(slow)
    return headline_main.main([*ARGS, "--name", name, *argv], bench_class=Bench)
