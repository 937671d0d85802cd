"""`python -m bench shared-device`: K rankers on one accelerator, simulated: how busy they keep it.

One Python ranker cannot keep a fast accelerator busy (bench/results/README.md), so a device runs K rankers,
each with 1/K of the tiers (`--device-sharers`). For each K of `--sharers`, K rankers of
`bench.micro.simulated_device` (passes that hold one shared simulated device for the H200's time, with no
CPU) are driven open loop by pairs, user i's on ranker i mod K, at each of `--rates` until the Rank P99
exceeds `--p99-ms` or a call fails. Each point reads the device's busy share (the seconds the passes held it
over the wall time), the Rank P50 and P99, and the cores the rankers, this process (the load generator) and
the rest of the machine used: K helps until the device or the host's cores are full, and the cores say which.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import tempfile
from pathlib import Path

from bench.lib import context, envelope, probes
from bench.lib.stats import percentile
from bench.micro.pairs import Driver, Pair, PairSettings, make_pairs
from services.common.config import grid, listed, load, numbers, setting
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes, ServiceProcess

LAUNCHES = ("graphs", "eager")
DEVICE_SECONDS = re.compile(r"^relaygr_simulated_device_seconds_total (\S+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class SharedDeviceConfig(PairSettings):
    sharers: str = numbers("1,2,4", "the rankers per device (K) to measure (comma list)", int)
    launches: str = setting(
        "graphs,eager",
        "how the simulated passes launch, each measured for every K (comma list): graphs (no host CPU, as a "
        "CUDA graph's replay) or eager (a rank first spends the H200's eager launch CPU)",
        items=str,
        choices=LAUNCHES,
    )
    rates: str = grid(
        "50,100,150,200,300,400", "pair rates of each K's sweep, ascending, pairs a second (comma list)"
    )
    length: int = setting(2048, "long-term events of each pair's history", above=0)
    candidates: int = setting(128, "candidates of each Rank", above=0)
    seconds: float = setting(8.0, "measured seconds a point", above=0)
    warmup_pairs: int = setting(20, "pairs sent before each point's measurement", minimum=0)
    p99_ms: float = setting(50.0, "a rate whose Rank P99 exceeds this ends its K's sweep", above=0)
    out: str = setting("bench/results/shared-device", "folder of results.json and summary.md (empty: none)")


@dataclasses.dataclass(frozen=True)
class Point:
    launches: str
    sharers: int
    rate: float
    pairs: int
    wall_s: float
    device_s: float  # seconds the simulated device was held
    device_busy: float  # their share of the wall time
    rank_p50_ms: float
    rank_p99_ms: float
    ranker_cores: float
    generator_cores: float
    other_cores: float  # the machine's busy cores that are neither the rankers nor this process
    sources: dict[str, int]
    errors: dict[str, int]


def within(point: Point, p99_ms: float) -> bool:
    """The point held: no call failed and the Rank P99 is at most `p99_ms`."""
    return not point.errors and point.rank_p99_ms <= p99_ms


def start_rankers(procs: Processes, config: SharedDeviceConfig, k: int, lock: Path, launches: str) -> list:
    """K simulated-device rankers sharing the device `lock`, each told it shares the device with K."""
    rankers = []
    for index in range(k):
        name = f"ranker-{launches}-k{k}-{index}"
        args = [
            "--instance-name", name, "--model-preset", "cpu-small", "--device", "cpu", "--torch-threads", "1",
            "--device-sharers", str(k), "--device-lock", str(lock), "--simulated-launches", launches,
            # The H200 runs' chunk (bench/results/gpu-fleet): the pre-inference times are per such chunks.
            "--pre-infer-chunk-tokens", "2048",
            "--max-long-term-events", str(config.length), "--lease-ttl-ms", "10000",
            "--profile-lengths", f"128,{config.length}", "--profile-repeats", "1",
            # Its passes sleep: every one would read as disturbed by other work (no CPU behind its time).
            "--profile-disturbed-ratio", "1000000",
        ]  # fmt: skip
        rankers.append(procs.start(name, "bench.micro.simulated_device", RANKER_SERVICE, args))
    for ranker in rankers:
        ranker.wait_healthy(180)
    return rankers


def device_seconds(rankers: list[ServiceProcess]) -> float:
    pages = (probes.scrape(f"http://127.0.0.1:{ranker.metrics_port}/metrics") for ranker in rankers)
    return sum(float(found.group(1)) for page in pages if (found := DEVICE_SECONDS.search(page)))


def spread(config: SharedDeviceConfig, rankers: list[ServiceProcess], tag: str, count: int) -> list[Pair]:
    """`count` fresh users' pairs, user i's for ranker i mod K (its relay hint names that ranker)."""
    k, sizes = len(rankers), (config.length, config.short_term, config.candidates)
    per = [
        make_pairs(f"{tag}-{r}", -(-count // k), *sizes, ranker.name, config.seed + r)
        for r, ranker in enumerate(rankers)
    ]
    return [per[i % k][i // k] for i in range(count)]


async def measure(
    config: SharedDeviceConfig, rankers: list[ServiceProcess], rate: float, launches: str
) -> Point:
    k, delay_s, tag = len(rankers), config.relay_window_ms / 1000, f"k{len(rankers)}-r{rate:g}"
    driver = Driver(*(ranker.address for ranker in rankers))  # pair i to ranker i mod K
    try:
        if config.warmup_pairs:
            await driver.run(spread(config, rankers, f"{tag}-warm", config.warmup_pairs), rate, delay_s)
        count = max(round(rate * config.seconds), 1)
        measured = spread(config, rankers, tag, count)
        pids = {ranker.name: ranker.popen.pid for ranker in rankers}
        device_before, before = device_seconds(rankers), probes.snapshot(pids, {})
        answers = await driver.run(measured, rate, delay_s)
        cost = probes.difference(before, probes.snapshot(pids, {}))
        device = device_seconds(rankers) - device_before
    finally:
        await driver.close()
    wall, cpu_s = cost["wall_s"], cost["cpu_s"]
    rankers_s, own_s = sum(cpu_s[ranker.name] for ranker in rankers), cpu_s[probes.LOAD_GENERATOR]
    return Point(
        launches=launches, sharers=k, rate=rate, pairs=count, wall_s=round(wall, 3),
        device_s=round(device, 4), device_busy=round(device / wall, 3),
        rank_p50_ms=round(percentile(answers.latency_ms, 50), 3),
        rank_p99_ms=round(percentile(answers.latency_ms, 99), 3),
        ranker_cores=round(rankers_s / wall, 3), generator_cores=round(own_s / wall, 3),
        other_cores=cost["foreign_cores"],
        sources=answers.sources, errors=answers.errors,
    )  # fmt: skip


async def run(config: SharedDeviceConfig) -> list[Point]:
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as scratch:
        for launches in listed(config, "launches"):
            for k in listed(config, "sharers"):
                with Processes(Path(scratch) / f"{launches}-k{k}") as procs:
                    rankers = start_rankers(
                        procs, config, k, Path(scratch) / f"device-{launches}-k{k}", launches
                    )
                    for rate in listed(config, "rates"):
                        points.append(p := await measure(config, rankers, rate, launches))
                        print(
                            f"{launches} K={k} {rate:g} pairs/s: device busy {p.device_busy:.0%}, Rank P50 "
                            f"{p.rank_p50_ms:g} P99 {p.rank_p99_ms:g} ms, cores: rankers {p.ranker_cores:g}, "
                            f"load generator {p.generator_cores:g}, others {p.other_cores:g}"
                            + (f", errors {p.errors}" if p.errors else ""),
                            flush=True,
                        )
                        if not within(p, config.p99_ms):
                            break
    return points


def capacity(points: list[Point], p99_ms: float) -> dict[tuple[str, int], Point | None]:
    """Each (launches, K)'s highest rate within the P99 (None: not even the first)."""
    best: dict[tuple[str, int], Point | None] = {(p.launches, p.sharers): None for p in points}
    best.update({(p.launches, p.sharers): p for p in points if within(p, p99_ms)})
    return best


def summary(config: SharedDeviceConfig, points: list[Point]) -> str:
    lines = [
        "# K rankers on one simulated device",
        "",
        f"Pairs of {config.length} long-term events, {config.short_term} short-term, {config.candidates} "
        f"candidates, {config.relay_window_ms:g} ms apart; the device's passes take the H200's time "
        "(`bench.micro.simulated_device`), launched from a CUDA graph (no host CPU) or eagerly (a rank's "
        "launches spend the H200's eager host CPU first); a K's sweep ends at the first rate over a Rank "
        f"P99 of {config.p99_ms:g} ms.",
        "",
        "| launches | K | pairs/s | device busy | Rank P50 / P99 ms | cores: rankers / load generator / "
        "others | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p.launches} | {p.sharers} | {p.rate:g} | {p.device_busy:.0%} | {p.rank_p50_ms:g} / "
        f"{p.rank_p99_ms:g} | {p.ranker_cores:g} / {p.generator_cores:g} / {p.other_cores:g} | "
        f"{p.errors or ''} |"
        for p in points
    ]
    lines += ["", "Each K's highest rate within the P99:", ""]
    for (launches, k), best in capacity(points, config.p99_ms).items():
        held = "none" if best is None else f"{best.rate:g} pairs/s, the device busy {best.device_busy:.0%}"
        lines.append(f"- {launches}, K = {k}: {held}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    prog, description = "python -m bench shared-device", __doc__.split("\n")[0]
    config = load(SharedDeviceConfig, argv, prog=prog, description=description)
    points = asyncio.run(run(config))
    print(text := summary(config, points))
    if config.out:
        (out := Path(config.out)).mkdir(parents=True, exist_ok=True)
        record = {
            "configuration": dataclasses.asdict(config),
            "points": [dataclasses.asdict(p) for p in points],
        }
        envelope.write(out / "results.json", "shared-device", record, **context.provenance())
        (out / "summary.md").write_text(text)
