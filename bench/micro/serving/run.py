"""The run: the processes, their capacity searches, the points at each load, and the coalesced PreInfers.

Coalesced PreInfers are measured at a ranker's capacity rate at the first length (the floor at the
free-pass ranker's): the Ranks alone, on two seconds of pairs whose PreInfers were sent before the clock (a
whole point's prefixes would not fit in HBM); then, for single calls (W = 0) and each window W of
`--windows-ms`, pairs straight to the process with their PreInfers in PreInferBatch windows (a PreInfer's
own CPU is the pair's less the Rank's alone), and pairs through a trigger (`services.trigger`, routing
directly, admitting all, its `--pre-infer-batch-window-ms` W) with the Admits' latency and the Ranks whose
prefix was ready in HBM when they came.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
import time
from pathlib import Path

from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.stats import percentile
from bench.micro.pairs import Via, make_pairs
from bench.micro.serving import point as measure
from bench.micro.serving.config import ServingConfig
from bench.micro.serving.generator import Generator, born_on, split_cpus
from bench.micro.serving.in_process import InProcess
from bench.micro.serving.point import Point, Shape
from bench.micro.serving.summary import point_line, result_of
from services.common.config import listed
from services.common.contract import RANKER_SERVICE, TRIGGER_SERVICE
from services.launcher.procs import Processes, ServiceProcess

# The capacity search gives up above and below these rates (pairs a second).
MAX_SEARCH_RATE, MIN_SEARCH_RATE = 20_000.0, 0.5
# Seconds of pairs the Ranks alone are measured on (their prefixes pre-inferred first, all held at once).
RANKS_ALONE_S = 2.0
NULL_RANKER = "bench.micro.null_ranker"  # the serving floor


def start(procs: Processes, config: ServingConfig, module: str, cpus=None) -> ServiceProcess:
    """The serving floor (`NULL_RANKER`) or a ranker (`services.ranker`, or `bench.micro.null_model`: its
    passes free) for every shape, born on `cpus`."""
    args = ["--instance-name", "ranker-serving"]
    if module != NULL_RANKER:
        args += [
            "--model-preset", config.model_preset, "--torch-threads", str(config.torch_threads),
            "--device", config.device, "--max-long-term-events", str(max(listed(config, "lengths"))),
            "--max-candidates", str(max(config.candidates, 1024)),
            "--profile-lengths", "128,1024", "--profile-repeats", "2", "--lease-ttl-ms", "10000",
        ]  # fmt: skip
    with born_on(cpus):
        process = procs.start("ranker-serving", module, RANKER_SERVICE, args)
    process.wait_healthy(60 if module == NULL_RANKER else 180)
    return process


def shape_at(config: ServingConfig, length: int, rate: float, load: str, in_process_ms: float) -> Shape:
    """A point of `length` at `rate`: `--pairs` at the low rate, `--point-seconds` of pairs at the others
    (`--capacity-seconds` for a search step, 20 at least), never fewer than 50 (20 for a search step) nor
    longer than about `--max-point-s`."""
    seconds = {"low": None, "search": config.capacity_seconds}.get(load, config.point_seconds)
    wanted = config.pairs if seconds is None else round(rate * seconds)
    pairs = max(20 if load == "search" else 50, min(wanted, round(rate * config.max_point_s)))
    return Shape(length, config.candidates, rate, pairs, in_process_ms, load)


async def run(config: ServingConfig) -> dict:
    """Each process alone on the ranker's CPUs, the load generator on its own: the serving floor's capacity
    at each length; the ranker with free model passes and the ranker with real ones, each at its capacity,
    half of it and the low rate (`--rate`, at most `--max-low-share` of its capacity); then the floor again at
    every rate a ranker was driven at."""
    ranker_cpus, generator_cpus = split_cpus(config.generator_cpus)
    # This thread (the in-process passes, the readings) runs with the generator; as before once done.
    with born_on(generator_cpus), tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
        sweep = Sweep(config, procs, ranker_cpus, generator_cpus)
        try:
            return await sweep.run()
        finally:
            sweep.close()


class Sweep:
    """One run's processes, its load generator, its in-process passes and its GPU monitor."""

    def __init__(self, config: ServingConfig, procs: Processes, ranker_cpus, generator_cpus) -> None:
        self.config, self.procs = config, procs
        self.ranker_cpus, self.generator_cpus = ranker_cpus, generator_cpus
        self.in_process = InProcess(config)
        self.monitor = GpuMonitor.start() if config.device != "cpu" else None
        self.generator = Generator(generator_cpus)
        self.capacity: dict[str, dict[int, float]] = {"floor": {}, "null_model": {}, "ranker": {}}
        self.searches: dict[str, dict[int, list[Point]]] = {name: {} for name in self.capacity}
        self.idle_cpu: dict[str, float] = {}

    def close(self) -> None:
        self.generator.close()
        self.in_process.close()
        if self.monitor is not None:
            self.monitor.close()

    async def run(self) -> dict:
        cpus = {"ranker_cpus": self.ranker_cpus, "generator_cpus": self.generator_cpus}
        measured: dict = {"placement": {name: None if c is None else sorted(c) for name, c in cpus.items()}}
        coalescing = measured["coalescing"] = {}
        floor, _ = await self.up("floor", NULL_RANKER)
        floor.stop()
        nulled, free = await self.up("null_model", "bench.micro.null_model")
        measured["null_model"] = await self.drive(nulled, free, "null-model")
        coalescing["null_model"] = await self.coalescing(nulled, free, self.generator_cpus)
        nulled.stop()
        ranker, real = await self.up("ranker", "services.ranker", real=True)
        measured["points"] = await self.drive(ranker, real, "ranker", self.in_process)
        measured["idle"] = await self.idle_latency(ranker)
        coalescing["ranker"] = await self.coalescing(ranker, real, self.generator_cpus)
        ranker.stop()
        floor = start(self.procs, self.config, NULL_RANKER, self.ranker_cpus)
        at_rates = list({(s.length, s.rate): s for s in free + real}.values())
        measured["floor"] = await self.drive(floor, at_rates, "floor")
        coalescing["floor"] = await self.coalescing(floor, free, None, trigger=False)
        measured.update(capacity=self.capacity, searches=self.searches, idle_cpu=self.idle_cpu)
        return result_of(self.config, measured)

    async def up(self, name: str, module: str, real: bool = False) -> tuple[ServiceProcess, list[Shape]]:
        """The process started; what it spends a second idle (timers, the sweeper, gRPC's own threads); its
        capacity at each length; and its shapes at each load."""
        config, todo = self.config, []
        process = start(self.procs, config, module, self.ranker_cpus)
        before = measure.thread_cpu(process.popen.pid)
        time.sleep(3.0)
        after = measure.thread_cpu(process.popen.pid)
        self.idle_cpu[name] = sum(after[g] - before[g] for g in measure.THREAD_GROUPS) * 1000 / 3.0
        for length in listed(config, "lengths"):
            pair_ms = self.in_process.pair_ms(length, config.candidates)[0] if real else 0.0
            found, self.searches[name][length] = await self.search_capacity(process, length, pair_ms)
            self.capacity[name][length] = found
            loads = {
                "low": min(config.rate, config.max_low_share * found),
                "half": found / 2,
                "capacity": found,
            }
            todo += [shape_at(config, length, r, load, pair_ms) for load, r in loads.items()]
        return process, todo

    async def point(self, target: ServiceProcess, shape: Shape, label: str, **via) -> Point:
        return await measure.measure_point(self.generator, target, self.config, shape, label, **via)

    async def drive(
        self, target: ServiceProcess, todo: list[Shape], label: str, in_process=None
    ) -> list[Point]:
        """Each shape's point on `target`. With `in_process`, the same passes are timed in this process right
        before each point (the machine's speed drifts over minutes: only passes timed together compare)."""
        points = []
        for shape in todo:
            if in_process is not None:
                shape = dataclasses.replace(
                    shape, in_process_ms=in_process.pair_ms(shape.length, shape.candidates)[0]
                )
            spy = None
            if self.config.stages and label != "floor":
                spy = measure.sample_stages(target.popen.pid, shape.pairs / shape.rate)
            point = await self.point(target, shape, label, monitor=self.monitor)
            if spy is not None:
                spy.wait()
                point = dataclasses.replace(point, stages=measure.stage_shares(spy.out))
            points.append(point)
            print(f"{label}: {point_line(point)}", flush=True)
        return points

    async def search_capacity(
        self, target: ServiceProcess, length: int, pair_ms: float
    ) -> tuple[float, list]:
        """The highest rate `target` holds at `length` (`Point.holds`, within `--capacity-p99-ms` plus twice
        `pair_ms`, a pair's real passes): rates grow by `--capacity-growth` from `--capacity-start` (at most a
        quarter of what the passes alone allow) until one is not held, or shrink until one is; then the
        interval between the last held and the first not is halved `--capacity-refine` times."""
        config, steps = self.config, []

        async def holds(rate: float) -> bool:
            point = await self.point(
                target, shape_at(config, length, rate, "search", pair_ms), f"cap{len(steps)}"
            )
            steps.append(point)
            held = point.holds(config.capacity_p99_ms + 2 * pair_ms)
            print(f"capacity search: {point_line(point)}{' held' if held else ''}", flush=True)
            return held

        held, failed = 0.0, float("inf")
        rate = config.capacity_start if not pair_ms else min(config.capacity_start, 250 / pair_ms)
        while rate <= MAX_SEARCH_RATE:  # up from the start while held
            if not await holds(rate):
                failed = rate
                break
            held, rate = rate, rate * config.capacity_growth
        while held == 0.0 and failed > MIN_SEARCH_RATE:  # down from a start not held
            rate = failed / config.capacity_growth
            held, failed = (rate, failed) if await holds(rate) else (held, rate)
        for _ in range(config.capacity_refine if held and failed != float("inf") else 0):
            middle = (held + failed) / 2
            held, failed = (middle, failed) if await holds(middle) else (held, middle)
        return max(held, MIN_SEARCH_RATE), steps

    async def idle_latency(self, ranker: ServiceProcess) -> dict:
        """The cached Rank through the service, one pair at a time (each Rank once its prefix is surely
        ready: the cached rank, not the prefix, is measured), against the cached rank in process."""
        config, idle = self.config, {}
        for length in listed(config, "lengths") if config.idle_pairs else ():
            sizes = (length, config.short_term, config.candidates)
            pairs = functools.partial(
                make_pairs, f"idle{length}", config.idle_pairs, *sizes, ranker.name, config.seed
            )
            pair_ms, rank_ms = self.in_process.pair_ms(length, config.candidates, repeats=3)
            delay_s = max(config.relay_window_ms, 2 * (pair_ms - rank_ms)) / 1000
            answers = (await self.generator.run(ranker.address, pairs, 0.0, delay_s)).answers
            idle[str(length)] = {
                "service_p50_ms": round(percentile(answers.latency_ms, 50), 3),
                "in_process_p50_ms": round(self.in_process.rank_wall_ms(length, config.candidates), 3),
                "sources": answers.sources,
            }
            print(f"idle L={length}: {idle[str(length)]}", flush=True)
        return idle

    async def coalescing(
        self, target: ServiceProcess, shapes: list[Shape], trigger_cpus, trigger=True
    ) -> list:
        """At the capacity point of the first length: the Ranks alone; then for single calls and each window,
        pairs straight to `target` and (`trigger`) through a trigger with that window. A row each."""
        if not self.config.windows_ms:
            return []
        label = target.name
        shape = next(s for s in shapes if s.load == "capacity" and s.length == shapes[0].length)
        alone = dataclasses.replace(shape, pairs=max(20, round(shape.rate * RANKS_ALONE_S)))
        ranks = await self.point(
            target, alone, f"{label}-ranks", via=Via(ranks_only=True), prepare=Via(pre_infers_only=True)
        )
        rows = [_row(ranks, "ranks_alone", 0.0)]
        print(f"{label} Ranks alone: {_line(rows[-1])}", flush=True)
        for window_ms in [0.0, *listed(self.config, "windows_ms")]:
            point = await self.point(
                target, shape, f"{label}-pi{window_ms:g}", via=Via(window_s=window_ms / 1000)
            )
            rows.append(_row(point, "direct", window_ms, ranks))
            print(f"{label} pairs, window {window_ms:g} ms: {_line(rows[-1])}", flush=True)
            if not trigger:
                continue
            started = self.start_trigger(target, window_ms, trigger_cpus)
            try:
                via = Via(trigger=started.address)
                point = await self.point(target, shape, f"{label}-tr{window_ms:g}", via=via)
            finally:
                started.stop()
            rows.append(_row(point, "through_trigger", window_ms))
            print(f"{label} through a trigger, window {window_ms:g} ms: {_line(rows[-1])}", flush=True)
        return rows

    def start_trigger(self, ranker: ServiceProcess, window_ms: float, cpus) -> ServiceProcess:
        """A trigger that routes directly to `ranker`, admits every request and coalesces its PreInfers in
        `window_ms` (0: single calls), born on `cpus` (the load's side: it is not the process measured)."""
        args = [
            "--rankers", f"{ranker.name}={ranker.address}", "--admit-all", "true",
            "--pre-infer-batch-window-ms", f"{window_ms:g}",
            "--max-long-term-events", str(max(listed(self.config, "lengths"))),
            "--max-candidates", str(max(self.config.candidates, 1024)),
        ]  # fmt: skip
        with born_on(cpus):
            trigger = self.procs.start("trigger-serving", "services.trigger", TRIGGER_SERVICE, args)
        trigger.wait_healthy(120)
        return trigger


def _row(point: Point, how: str, window_ms: float, ranks: Point | None = None) -> dict:
    """A point's row: with `ranks` (the Ranks alone at the same rate), its PreInfer's own CPU, the pair's
    less the Rank's."""
    pre_infer_ms = None if ranks is None else round(point.non_model_ms - ranks.non_model_ms, 3)
    per_call = round(point.pairs / point.calls, 2) if point.calls else None
    return {"how": how, "window_ms": window_ms, "per_call": per_call, "pre_infer_ms": pre_infer_ms,
            **dataclasses.asdict(point)}  # fmt: skip


def _line(row: dict) -> str:
    line = f"{row['rate']:.0f}/s, not the model {row['non_model_ms']:.3f} ms a pair"
    if row["pre_infer_ms"] is not None:
        line += f" (the PreInfer {row['pre_infer_ms']:.3f}, {row['per_call']} a call)"
    if row["admit_p99_ms"] is not None:
        line += f"; Admit P50/P99 {row['admit_p50_ms']:.1f}/{row['admit_p99_ms']:.1f} ms"
    return line + f"; ready {row['ready']}; {row['sources']} {row['errors'] or ''}"
