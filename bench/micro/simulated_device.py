"""`bench.micro.simulated_device`: a ranker whose model passes hold a device that several rankers share
for an H200's time, sleeping (no CPU), for `bench.micro.shared_device`. Its scores mean nothing.

Everything else is the ranker's own, as in `bench.micro.null_model` (whose right-sized, unfilled prefixes
and zero scores it keeps). The device is a file lock (`--device-lock`): the rankers given one file share a
device, a pass waiting while another's holds it. A pre-inference of N events holds it for the H200's at N
events (bench/results/gpu-fleet), a chunk at a time; a cached rank for the H200's graphed rank at N events
(bench/results/gpu-accelerator), a batch scaled between the single rank's and the batch of 8's. With
`--simulated-launches eager` a rank first spends the H200's eager launch CPU (its eager rank less its
graphed one) in the device thread, the GIL held. The seconds held are
`relaygr_simulated_device_seconds_total`: the rankers' sum over the wall time is the device's busy share.
"""

from __future__ import annotations

import dataclasses
import fcntl
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from prometheus_client import Counter

from bench.lib import envelope
from bench.micro.null_model import NullRunner, stand_in_main
from services.common.config import setting
from services.ranker.app import RankerApp
from services.ranker.config import RankerConfig
from services.ranker.engine.runner import RankItem
from services.ranker.model.events import Events
from services.ranker.model.prefix_kv import PrefixKV

RESULTS = Path(__file__).resolve().parents[1] / "results"
# The H200's figures: its in-process floor (pre-inference by length) and its CUDA-graph ranks.
PRE_INFER_SOURCE = RESULTS / "gpu-fleet" / "results.json"
RANK_SOURCE = RESULTS / "gpu-accelerator" / "results.json"

SIMULATED_DEVICE_SECONDS = Counter(
    "relaygr_simulated_device_seconds",
    "Seconds this ranker's passes held the simulated device (bench.micro.simulated_device)",
)


@dataclasses.dataclass(frozen=True)
class DeviceTimes:
    """The device's time of each pass, ms, by long-term events: interpolated between the lengths
    measured, the nearest measured one's beyond them."""

    lengths: tuple[float, ...]  # pre-inference: events measured, ascending
    pre_infer_ms: tuple[float, ...]
    rank_lengths: tuple[float, ...]  # cached ranks: prefix events measured, ascending
    rank_ms: tuple[float, ...]  # one user
    batch: int  # the users of the batch measured
    batch_ms: tuple[float, ...]  # that batch, at each rank length
    launch_ms: tuple[float, ...]  # one user's eager rank less its graphed one: host CPU, launching

    @classmethod
    def h200(cls, pre_infer: Path = PRE_INFER_SOURCE, ranks: Path = RANK_SOURCE) -> DeviceTimes:
        floor = sorted(envelope.read(pre_infer, "run")["floor"], key=lambda p: p["prefix_length"])
        graphs = sorted(envelope.read(ranks, "accelerator")["graphs"], key=lambda g: g["length"])
        (batch,) = {g["batch"] for g in graphs}
        return cls(
            lengths=tuple(p["prefix_length"] for p in floor),
            pre_infer_ms=tuple(p["pre_infer_ms"] for p in floor),
            rank_lengths=tuple(g["length"] for g in graphs),
            rank_ms=tuple(g["graph_p50_ms"] for g in graphs),
            batch=batch,
            batch_ms=tuple(g["graph_batch_p50_ms"] for g in graphs),
            launch_ms=tuple(g["eager_p50_ms"] - g["graph_p50_ms"] for g in graphs),
        )

    def pre_infer(self, events: float) -> float:
        return float(np.interp(events, self.lengths, self.pre_infer_ms))

    def rank(self, events: float, users: int = 1) -> float:
        """A batch of `users` ranked together: the single rank's time plus each further user's share of
        what the measured batch added."""
        one = float(np.interp(events, self.rank_lengths, self.rank_ms))
        full = float(np.interp(events, self.rank_lengths, self.batch_ms))
        return one + (users - 1) * (full - one) / (self.batch - 1)

    def launches(self, events: float) -> float:
        """The host CPU an eager rank's kernel launches take (none for a CUDA graph's replay)."""
        return float(np.interp(events, self.rank_lengths, self.launch_ms))


class SimulatedDevice:
    """A device several processes share: a pass holds the lock on `path` for its time, sleeping."""

    def __init__(self, path: str, times: DeviceTimes, eager: bool = False) -> None:
        self.times, self.eager = times, eager
        self._file = open(path, "a")  # noqa: SIM115 - held for the process's life: it is the device

    def launch(self, ms: float) -> None:
        """Spends `ms` of this thread's CPU, the GIL held, where launches are eager; nothing otherwise."""
        if not self.eager:
            return
        until = time.thread_time() + ms / 1000
        while time.thread_time() < until:
            pass

    def hold(self, ms: float) -> None:
        fcntl.flock(self._file, fcntl.LOCK_EX)
        try:
            started = time.perf_counter()
            time.sleep(ms / 1000)
            SIMULATED_DEVICE_SECONDS.inc(time.perf_counter() - started)
        finally:
            fcntl.flock(self._file, fcntl.LOCK_UN)


class SimulatedDeviceRunner(NullRunner):
    """`NullRunner` whose passes hold the simulated device (`simulated`, attached once the app is built)."""

    simulated: SimulatedDevice

    def build_sync(
        self,
        events: Events,
        background: bool,
        base: PrefixKV | None = None,
        *,
        between_chunks: Callable[[], None] = lambda: None,
    ) -> PrefixKV:
        count = len(events)
        per_event = self.simulated.times.pre_infer(count) / max(count, 1)
        chunk = max(self.chunk_tokens // self.model.preset.tokens_per_event, 1)
        for start in range(0, count, chunk):
            if start:
                between_chunks()
            self.simulated.hold(per_event * min(chunk, count - start))
        return super().build_sync(events, background, base, between_chunks=between_chunks)

    def _events(self, prefix: PrefixKV) -> float:
        return prefix.length / self.model.preset.tokens_per_event

    def rank_sync(self, prefix: PrefixKV, short: Events, candidates: Sequence[int]) -> list[float]:
        events = self._events(prefix)
        self.simulated.launch(self.simulated.times.launches(events))
        self.simulated.hold(self.simulated.times.rank(events))
        return super().rank_sync(prefix, short, candidates)

    def rank_batch_sync(self, items: list[RankItem]) -> list[list[float]]:
        longest = max(self._events(prefix) for prefix, _, _ in items)
        self.simulated.launch(self.simulated.times.launches(longest) * len(items))
        self.simulated.hold(self.simulated.times.rank(longest, len(items)))
        return super().rank_batch_sync(items)


@dataclasses.dataclass(frozen=True)
class SimulatedDeviceConfig(RankerConfig):
    device_lock: str = setting(
        "", "the simulated device: a file whose lock the passes hold; rankers given one file share a device"
    )
    simulated_launches: str = setting(
        "graphs",
        "graphs: a pass spends no host CPU (a CUDA graph's replay); eager: a rank first spends the host CPU "
        "the H200's eager kernel launches took (its eager rank less its graphed one)",
        choices=("graphs", "eager"),
    )

    def validate(self) -> None:
        super().validate()
        if not self.device_lock:
            raise ValueError("--device-lock must name the simulated device's file")


class SimulatedDeviceRankerApp(RankerApp):
    runner_class = SimulatedDeviceRunner

    def __init__(self, config: SimulatedDeviceConfig) -> None:
        super().__init__(config)
        eager = config.simulated_launches == "eager"
        self.runner.simulated = SimulatedDevice(config.device_lock, DeviceTimes.h200(), eager)  # type: ignore[attr-defined]


if __name__ == "__main__":  # as `services.launcher` starts it
    stand_in_main(SimulatedDeviceConfig, SimulatedDeviceRankerApp, "simulated-device-ranker", __doc__)
