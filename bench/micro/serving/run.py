"""The run: the serving floor's capacity, then the floor, the ranker and the null-model ranker in turn."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.lib.gpu_monitor import GpuMonitor
from bench.lib.stats import percentile
from bench.micro.serving.coalesced import coalescing
from bench.micro.serving.config import RANKER_SERVICE, ServingConfig
from bench.micro.serving.cpu import THREAD_GROUPS, thread_cpu
from bench.micro.serving.generator import Generator, born_on, split_cpus
from bench.micro.serving.in_process import InProcess
from bench.micro.serving.pairs import Load, PairSpec, Point, Shape, measure_point
from bench.micro.serving.stages import sample_stages, stage_shares
from bench.micro.serving.summary import point_line, result_of
from services.common.config import listed
from services.launcher.procs import Processes, ServiceProcess

# The capacity search gives up above and below these rates (pairs a second).
MAX_SEARCH_RATE, MIN_SEARCH_RATE = 20_000.0, 0.5

# ---- the processes ----


def start_ranker(
    procs: Processes, config: ServingConfig, module: str, cpus: frozenset[int] | None = None
) -> ServiceProcess:
    """A ranker (`services.ranker`, or `bench.micro.null_model`: its model passes free) for every shape."""
    args = [
        "--model-preset", config.model_preset, "--torch-threads", str(config.torch_threads),
        "--device", config.device, "--instance-name", "ranker-serving",
        "--max-long-term-events", str(max(listed(config, "lengths"))),
        "--max-candidates", str(max(config.candidates, 1024)),
        "--profile-lengths", "128,1024", "--profile-repeats", "2", "--lease-ttl-ms", "10000",
    ]  # fmt: skip
    with born_on(cpus):
        ranker = procs.start("ranker-serving", module, RANKER_SERVICE, args)
    ranker.wait_healthy(180)
    return ranker


def start_null_ranker(procs: Processes, cpus: frozenset[int] | None = None) -> ServiceProcess:
    with born_on(cpus):
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


# ---- the shapes ----


def shape_at(config: ServingConfig, length: int, rate: float, load: str, in_process_ms: float) -> Shape:
    """A point of `length` at `rate`: `--pairs` at the low rate, `--point-seconds` of pairs at the others
    (`--capacity-seconds` for a search step, 20 at least), never fewer than 50 (20 for a search step) nor
    longer than about `--max-point-s`."""
    seconds = {"low": None, "search": config.capacity_seconds}.get(load, config.point_seconds)
    wanted = config.pairs if seconds is None else round(rate * seconds)
    pairs = max(20 if load == "search" else 50, min(wanted, round(rate * config.max_point_s)))
    return Shape(length, config.candidates, rate, pairs, in_process_ms, load)


def loads(config: ServingConfig, capacity: float) -> dict[str, float]:
    """The three rates of a process at a length: `--rate` (at most `--max-low-share` of its capacity),
    half its capacity, and its capacity."""
    return {
        "low": min(config.rate, config.max_low_share * capacity),
        "half": capacity / 2,
        "capacity": capacity,
    }


# ---- driving ----


async def drive(
    config: ServingConfig,
    load: Load,
    target: ServiceProcess,
    todo: Sequence[Shape],
    label: str,
    monitor: GpuMonitor | None = None,
    in_process: InProcess | None = None,
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
        if config.stages and label != "floor":
            spy = sample_stages(target.popen.pid, shape.pairs / shape.rate)
        point = await measure_point(load, target, config, shape, label, monitor)
        if spy is not None:
            spy.wait()
            point = dataclasses.replace(point, stages=stage_shares(spy.out))
        points.append(point)
        print(f"{label}: {point_line(point)}", flush=True)
    return points


async def search_capacity(
    config: ServingConfig, load: Load, target: ServiceProcess, length: int, pair_ms: float = 0.0
) -> tuple[float, list[Point]]:
    """The highest rate `target` holds at `length` (`Point.holds`, within `--capacity-p99-ms` plus twice
    `pair_ms`, a pair's real passes): rates grow by `--capacity-growth` from `--capacity-start` (at most a
    quarter of what the passes alone allow) until one is not held, or shrink until one is; then the interval
    between the last held and the first not is halved `--capacity-refine` times."""
    steps: list[Point] = []
    p99_ms = config.capacity_p99_ms + 2 * pair_ms

    async def holds(rate: float) -> bool:
        shape = shape_at(config, length, rate, "search", pair_ms)
        point = await measure_point(load, target, config, shape, f"cap{len(steps)}")
        steps.append(point)
        held = point.holds(p99_ms)
        print(f"capacity search: {point_line(point)}{' held' if held else ''}", flush=True)
        return held

    start = config.capacity_start if not pair_ms else min(config.capacity_start, 250 / pair_ms)
    held, failed = 0.0, float("inf")
    rate = start
    while failed == float("inf") and rate <= MAX_SEARCH_RATE:  # up from the start while held
        if not await holds(rate):
            failed = rate
            break
        held, rate = rate, rate * config.capacity_growth
    while held == 0.0 and failed > MIN_SEARCH_RATE:  # down from a start not held
        rate = failed / config.capacity_growth
        if await holds(rate):
            held = rate
        else:
            failed = rate
    for _ in range(config.capacity_refine if held and failed != float("inf") else 0):
        middle = (held + failed) / 2
        if await holds(middle):
            held = middle
        else:
            failed = middle
    return max(held, MIN_SEARCH_RATE), steps


async def run(config: ServingConfig) -> dict:
    """Each process alone on the ranker's CPUs, the load generator on its own: the serving floor's capacity
    at each length; the ranker with free model passes and the ranker with real ones, each at its capacity,
    half of it and the low rate; then the floor again at every rate a ranker was driven at."""
    ranker_cpus, generator_cpus = split_cpus(config.generator_cpus)
    # This thread (the in-process passes, the readings) runs with the generator; as before once done.
    with born_on(generator_cpus):
        return await _run(config, ranker_cpus, generator_cpus)


async def _run(
    config: ServingConfig, ranker_cpus: frozenset[int] | None, generator_cpus: frozenset[int] | None
) -> dict:
    lengths = listed(config, "lengths")
    in_process = InProcess(config)
    monitor = GpuMonitor.start() if config.device != "cpu" else None
    generator = Generator(generator_cpus)
    capacity: dict[str, dict[int, float]] = {"floor": {}, "null_model": {}, "ranker": {}}
    searches: dict[str, dict[int, list[Point]]] = {name: {} for name in capacity}

    async def capacities(name: str, target: ServiceProcess, real: bool) -> list[Shape]:
        todo = []
        for length in lengths:
            pair_ms = in_process.pair_ms(length, config.candidates)[0] if real else 0.0
            found, steps = await search_capacity(config, generator, target, length, pair_ms)
            capacity[name][length], searches[name][length] = found, steps
            todo += [shape_at(config, length, r, load, pair_ms) for load, r in loads(config, found).items()]
        return todo

    try:
        with tempfile.TemporaryDirectory() as logs, Processes(Path(logs)) as procs:
            floor = start_null_ranker(procs, ranker_cpus)
            idle_cpu = {"floor": idle_cpu_ms_per_s(floor.popen.pid)}
            await capacities("floor", floor, real=False)
            floor.stop()
            nulled = start_ranker(procs, config, "bench.micro.null_model", ranker_cpus)
            idle_cpu["null_model"] = idle_cpu_ms_per_s(nulled.popen.pid)
            free = await capacities("null_model", nulled, real=False)
            null_model = await drive(config, generator, nulled, free, "null-model", monitor)
            coalescing = {
                "null_model": await _coalescing(config, generator, procs, nulled, free, generator_cpus)
            }
            nulled.stop()
            ranker = start_ranker(procs, config, "services.ranker", ranker_cpus)
            idle_cpu["ranker"] = idle_cpu_ms_per_s(ranker.popen.pid)
            real = await capacities("ranker", ranker, real=True)
            points = await drive(config, generator, ranker, real, "ranker", monitor, in_process)
            idle = await _idle_latency(config, generator, ranker, in_process, lengths)
            coalescing["ranker"] = await _coalescing(config, generator, procs, ranker, real, generator_cpus)
            ranker.stop()
            floor = start_null_ranker(procs, ranker_cpus)
            at_rates = list({(s.length, s.rate): s for s in free + real}.values())
            floors = await drive(config, generator, floor, at_rates, "floor")
            coalescing["floor"] = await _coalescing(
                config, generator, procs, floor, free, None, trigger=False
            )
    finally:
        generator.close()
        in_process.close()
        if monitor is not None:
            monitor.close()
    placement = {"ranker_cpus": _cpus(ranker_cpus), "generator_cpus": _cpus(generator_cpus)}
    return result_of(
        config, placement, capacity, searches, floors, points, null_model, idle, idle_cpu, coalescing
    )


async def _coalescing(
    config: ServingConfig,
    load: Load,
    procs: Processes,
    target: ServiceProcess,
    shapes: list[Shape],
    trigger_cpus: frozenset[int] | None,
    trigger: bool = True,
) -> list[dict]:
    """Coalesced PreInfers against single ones at the capacity point of the first length (`coalesced`)."""
    if not config.windows_ms:
        return []
    at = next(s for s in shapes if s.load == "capacity" and s.length == shapes[0].length)
    return await coalescing(config, load, procs, target, at, target.name, trigger_cpus, trigger)


def _cpus(cpus: frozenset[int] | None) -> list[int] | None:
    return None if cpus is None else sorted(cpus)


async def _idle_latency(config, load: Load, ranker: ServiceProcess, in_process: InProcess, lengths) -> dict:
    """The cached Rank through the service, one pair at a time (each Rank once its prefix is ready), against
    the cached rank in process."""
    idle = {}
    if not config.idle_pairs:
        return idle
    for length in lengths:
        spec = PairSpec(
            f"idle{length}", config.idle_pairs, length, config.short_term, config.candidates, ranker.name,
            config.seed,
        )  # fmt: skip
        # The Rank waits until its prefix is surely ready: it measures the cached rank, not the prefix.
        pair_ms, rank_ms = in_process.pair_ms(length, config.candidates, repeats=3)
        delay_s = max(config.relay_window_ms, 2 * (pair_ms - rank_ms)) / 1000
        answers = (await load.run(ranker.address, spec, 0.0, delay_s)).answers
        idle[str(length)] = {
            "service_p50_ms": round(percentile(answers.latency_ms, 50), 3),
            "in_process_p50_ms": round(in_process.rank_wall_ms(length, config.candidates), 3),
            "sources": answers.sources,
        }
        print(f"idle L={length}: {idle[str(length)]}", flush=True)
    return idle
