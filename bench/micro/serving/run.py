"""The run: the ranker, the serving floor and the null-model ranker up at once, every shape driven."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.stats import percentile
from bench.micro.serving.config import RANKER_SERVICE, ServingConfig
from bench.micro.serving.cpu import THREAD_GROUPS, thread_cpu
from bench.micro.serving.in_process import InProcess
from bench.micro.serving.pairs import Driver, Point, Shape, make_pairs, measure_point
from bench.micro.serving.stages import sample_stages, stage_shares
from bench.micro.serving.summary import point_line, result_of
from services.common.config import listed
from services.launcher.procs import Processes, ServiceProcess

# ---- the run ----


def start_ranker(procs: Processes, config: ServingConfig, module: str) -> ServiceProcess:
    """A ranker (`services.ranker`, or `bench.micro.null_model`: its model passes free) for every shape."""
    max_length = max([*listed(config, "lengths"), config.capacity_length])
    args = [
        "--model-preset", config.model_preset, "--torch-threads", str(config.torch_threads),
        "--device", config.device, "--instance-name", "ranker-serving",
        "--max-long-term-events", str(max(max_length, 1)), "--max-candidates", "1024",
        "--profile-lengths", "128,1024", "--profile-repeats", "2", "--lease-ttl-ms", "10000",
    ]  # fmt: skip
    ranker = procs.start("ranker-serving", module, RANKER_SERVICE, args)
    ranker.wait_healthy(180)
    return ranker


def start_null_ranker(procs: Processes) -> ServiceProcess:
    null = procs.start(
        "ranker-serving", "bench.micro.null_ranker", RANKER_SERVICE, ["--instance-name", "ranker-serving"]
    )
    null.wait_healthy(60)
    return null


def idle_cpu_ms_per_s(pid: int, seconds: float = 3.0) -> float:
    """What the process spends a second with no request (timers, the sweeper, gRPC's own threads)."""
    before = thread_cpu(pid)
    time.sleep(seconds)
    after = thread_cpu(pid)
    return sum(after[g] - before[g] for g in THREAD_GROUPS) * 1000 / seconds


def shapes(config: ServingConfig, in_process: InProcess) -> list[Shape]:
    """Every point's shape, with its rate: --rate, or less where the model alone would keep the device
    thread busier than --max-device-share."""
    lengths = listed(config, "lengths")
    overhead = [(length, config.candidates) for length in lengths]
    overhead += [(lengths[0], c) for c in listed(config, "candidate_counts") if c != config.candidates]
    result = []
    for length, candidates in overhead:
        pair_ms, _ = in_process.pair_ms(length, candidates)
        rate = min(config.rate, config.max_device_share * 1000 / pair_ms)
        pairs = min(config.pairs, max(50, round(rate * config.max_point_s)))
        result.append(Shape(length, candidates, rate, pairs, pair_ms, f"L{length}C{candidates}"))
    if config.capacity_rates:
        pair_ms, _ = in_process.pair_ms(config.capacity_length, config.capacity_candidates)
        for rate in listed(config, "capacity_rates"):
            pairs = max(1, round(rate * config.capacity_seconds))
            result.append(
                Shape(
                    config.capacity_length, config.capacity_candidates, rate, pairs, pair_ms, f"cap{rate:g}"
                )
            )
    return result


async def drive(
    config: ServingConfig,
    target: ServiceProcess,
    todo: Sequence[Shape],
    label: str,
    in_process: InProcess | None = None,
    monitor: GpuMonitor | None = None,
) -> list[Point]:
    """Each shape's point on `target`. With `in_process`, the same passes are timed in this process right
    before each point (the machine's speed drifts over minutes: only passes timed together compare)."""
    driver = Driver(target.address)
    try:
        points = []
        for shape in todo:
            if in_process is not None:
                shape = dataclasses.replace(
                    shape, in_process_ms=in_process.pair_ms(shape.length, shape.candidates)[0]
                )
            spy = None
            if config.stages and label == "ranker":
                spy = sample_stages(target.popen.pid, shape.pairs / shape.rate)
            point = await measure_point(
                driver, target, config, f"{label}-{shape.tag}", shape.length, shape.candidates, shape.rate,
                shape.pairs, shape.in_process_ms, monitor,
            )  # fmt: skip
            if spy is not None:
                spy.wait()
                point = dataclasses.replace(point, stages=stage_shares(spy.out))
            points.append(point)
            print(f"{label}: {point_line(point)}", flush=True)
        return points
    finally:
        await driver.close()


async def run(config: ServingConfig) -> dict:
    """The floor, then the ranker, then the ranker with free model passes, one process at a time on the same
    shapes and rates (so no process shares the machine with another under test)."""
    lengths = listed(config, "lengths")
    in_process = InProcess(config)
    monitor = GpuMonitor.start() if config.device != "cpu" else None
    try:
        todo = shapes(config, in_process)
        overhead = [shape for shape in todo if not shape.capacity]
        with tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
            null = start_null_ranker(procs)
            idle_cpu = {"floor": idle_cpu_ms_per_s(null.popen.pid)}
            floor = await drive(config, null, todo, "floor")
            null.stop()
            ranker = start_ranker(procs, config, "services.ranker")
            idle_cpu["ranker"] = idle_cpu_ms_per_s(ranker.popen.pid)
            points = await drive(config, ranker, overhead, "ranker", in_process, monitor)
            idle = await _idle_latency(config, ranker, in_process, lengths)
            ranker.stop()
            free = start_ranker(procs, config, "bench.micro.null_model")
            idle_cpu["null_model"] = idle_cpu_ms_per_s(free.popen.pid)
            null_model = await drive(config, free, todo, "null-model", monitor=monitor)
    finally:
        in_process.close()
        if monitor is not None:
            monitor.close()
    return result_of(config, lengths, todo, floor, points, null_model, idle, idle_cpu)


async def _idle_latency(config, ranker: ServiceProcess, in_process: InProcess, lengths) -> dict:
    """The cached Rank through the service, one pair at a time (each Rank once its prefix is ready), against
    the cached rank in process."""
    idle = {}
    if not config.idle_pairs:
        return idle
    driver = Driver(ranker.address)
    try:
        for length in lengths:
            measured = make_pairs(
                f"idle{length}", config.idle_pairs, length, config.short_term, config.candidates,
                ranker.name, config.seed,
            )  # fmt: skip
            # The Rank waits until its prefix is surely ready: it measures the cached rank, not the prefix.
            pair_ms, rank_ms = in_process.pair_ms(length, config.candidates, repeats=3)
            delay_s = max(config.relay_window_ms, 2 * (pair_ms - rank_ms)) / 1000
            answers = await driver.sequential(measured, delay_s)
            idle[str(length)] = {
                "service_p50_ms": round(percentile(answers.latency_ms, 50), 3),
                "in_process_p50_ms": round(in_process.rank_wall_ms(length, config.candidates), 3),
                "sources": answers.sources,
            }
            print(f"idle L={length}: {idle[str(length)]}", flush=True)
    finally:
        await driver.close()
    return idle
