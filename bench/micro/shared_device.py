"""`python -m bench shared-device`: K rankers on one accelerator, simulated: how busy they keep it.

One Python ranker process cannot keep a fast accelerator busy: on the H200 the GPU was 5 to 40 % busy while
the ranker's host CPU was the limit (bench/results/README.md). So a device runs K rankers, each a member
of the ring with 1/K of the tiers (`--device-sharers`). This measures what K buys without a GPU: for each
K of `--sharers`, K rankers (`bench.micro.simulated_device`: the ranker's own serving path, with model
passes that hold one shared simulated device for the H200's time and no CPU) are driven open loop with
PreInfer + Rank pairs, each user's pair on one ranker, the users spread evenly, at each rate of `--rates`
until a rate's Rank P99 exceeds `--p99-ms` (or a call fails). Each point reads:

- the device's busy share: the seconds the rankers' passes held the device over the point's wall time;
- the Rank P50 and P99, from each Rank's intended send time (every Rank a relayed HBM hit);
- the cores the rankers used, the cores this process (the load generator) used, and the cores the rest
  of the machine used.

The highest rate each K carries within the P99 and its busy share there say how many rankers a device
needs: K x one ranker's pairs a second, until the device or the host's cores are full. On a machine with
fewer cores than K + 1, the host runs out first; the figures say which.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.lib import probes
from bench.lib.stats import percentile
from bench.micro.serving.pairs import Answers, Driver, Pair, make_pairs
from services.common.config import grid, listed, load, numbers, setting
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes, ServiceProcess

LAUNCHES = ("graphs", "eager")
DEVICE_SECONDS = re.compile(r"^relaygr_simulated_device_seconds_total (\S+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class SharedDeviceConfig:
    sharers: str = numbers("1,2,4", "the rankers per device (K) to measure (comma list)", int)
    launches: str = setting(
        "graphs,eager",
        "how the simulated passes launch, each measured for every K (comma list): graphs (no host CPU, as a "
        "CUDA graph's replay) or eager (a rank first spends the H200's eager launch CPU)",
    )
    rates: str = grid(
        "50,100,150,200,300,400", "pair rates of each K's sweep, ascending, pairs a second (comma list)"
    )
    length: int = setting(2048, "long-term events of each pair's history", above=0)
    short_term: int = setting(16, "short-term events of each Rank", above=0)
    candidates: int = setting(128, "candidates of each Rank", above=0)
    relay_window_ms: float = setting(30.0, "from a PreInfer to its Rank (the relay window)", minimum=0)
    seconds: float = setting(8.0, "measured seconds a point", above=0)
    warmup_pairs: int = setting(20, "pairs sent before each point's measurement", minimum=0)
    p99_ms: float = setting(50.0, "a rate whose Rank P99 exceeds this ends its K's sweep", above=0)
    out: str = setting("bench/results/shared-device", "folder of results.json and summary.md (empty: none)")
    seed: int = setting(0, "seed of the users' histories and candidates", minimum=0)

    def launch_list(self) -> list[str]:
        names = [name.strip() for name in self.launches.split(",") if name.strip()]
        if not names or not set(names) <= set(LAUNCHES):
            raise ValueError(f"--launches must list {' or '.join(LAUNCHES)}, got {self.launches!r}")
        return names

    def validate(self) -> None:
        self.launch_list()


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


def start_rankers(
    procs: Processes, config: SharedDeviceConfig, k: int, lock: Path, launches: str
) -> list[ServiceProcess]:
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
    total = 0.0
    for ranker in rankers:
        url = f"http://127.0.0.1:{ranker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=probes.SCRAPE_TIMEOUT_S) as answer:
            found = DEVICE_SECONDS.search(answer.read().decode())
        total += float(found.group(1)) if found else 0.0
    return total


async def drive(drivers: list[Driver], pairs: list[tuple[int, Pair]], rate: float, delay_s: float) -> Answers:
    """Every pair on its ranker's driver, one every 1/`rate` s in turn (open loop)."""
    answers = Answers()
    start = asyncio.get_running_loop().time() + 0.05
    await asyncio.gather(
        *(drivers[k].pair(pair, start + i / rate, delay_s, answers) for i, (k, pair) in enumerate(pairs))
    )
    return answers


def spread(
    config: SharedDeviceConfig, rankers: list[ServiceProcess], tag: str, count: int
) -> list[tuple[int, Pair]]:
    """`count` fresh users' pairs, user i's on ranker i mod K (its relay hint names that ranker)."""
    k = len(rankers)
    per = [
        make_pairs(f"{tag}-{r}", -(-count // k), config.length, config.short_term, config.candidates,
                   ranker.name, config.seed + r)
        for r, ranker in enumerate(rankers)
    ]  # fmt: skip
    return [(i % k, per[i % k][i // k]) for i in range(count)]


async def measure(
    config: SharedDeviceConfig, rankers: list[ServiceProcess], rate: float, launches: str
) -> Point:
    k, delay_s = len(rankers), config.relay_window_ms / 1000
    drivers = [Driver(ranker.address) for ranker in rankers]
    try:
        tag = f"k{k}-r{rate:g}"
        if config.warmup_pairs:
            await drive(drivers, spread(config, rankers, f"{tag}-warm", config.warmup_pairs), rate, delay_s)
        count = max(round(rate * config.seconds), 1)
        measured = spread(config, rankers, tag, count)
        pids = {ranker.name: ranker.popen.pid for ranker in rankers}
        cpu_before = sum(probes.process_cpu_s(pid) for pid in pids.values())
        busy_before, own_before, device_before = (
            probes.machine_busy_s(),
            time.process_time(),
            device_seconds(rankers),
        )
        started = time.perf_counter()
        answers = await drive(drivers, measured, rate, delay_s)
        wall = time.perf_counter() - started
        device = device_seconds(rankers) - device_before
        rankers_s = sum(probes.process_cpu_s(pid) for pid in pids.values()) - cpu_before
        own_s, machine_s = time.process_time() - own_before, probes.machine_busy_s() - busy_before
    finally:
        for driver in drivers:
            await driver.close()
    return Point(
        launches=launches, sharers=k, rate=rate, pairs=count, wall_s=round(wall, 3),
        device_s=round(device, 4), device_busy=round(device / wall, 3),
        rank_p50_ms=round(percentile(answers.latency_ms, 50), 3),
        rank_p99_ms=round(percentile(answers.latency_ms, 99), 3),
        ranker_cores=round(rankers_s / wall, 3), generator_cores=round(own_s / wall, 3),
        other_cores=round(max(machine_s - rankers_s - own_s, 0.0) / wall, 3),
        sources=answers.sources, errors=answers.errors,
    )  # fmt: skip


def point_line(point: Point) -> str:
    errors = f", errors {point.errors}" if point.errors else ""
    return (
        f"{point.launches} K={point.sharers} {point.rate:g} pairs/s: device busy {point.device_busy:.0%}, "
        f"Rank P50 {point.rank_p50_ms:g} P99 {point.rank_p99_ms:g} ms, cores: rankers "
        f"{point.ranker_cores:g}, load generator {point.generator_cores:g}, others "
        f"{point.other_cores:g}{errors}"
    )


async def run(config: SharedDeviceConfig) -> list[Point]:
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as scratch:
        for launches in config.launch_list():
            for k in listed(config, "sharers"):
                with Processes(Path(scratch) / f"{launches}-k{k}") as procs:
                    device = Path(scratch) / f"device-{launches}-k{k}"
                    rankers = start_rankers(procs, config, k, device, launches)
                    for rate in listed(config, "rates"):
                        point = await measure(config, rankers, rate, launches)
                        points.append(point)
                        print(point_line(point), flush=True)
                        if not within(point, config.p99_ms):
                            break
    return points


def capacity(points: list[Point], p99_ms: float) -> dict[tuple[str, int], Point | None]:
    """Each (launches, K)'s highest rate within the P99 (None: not even the first)."""
    best: dict[tuple[str, int], Point | None] = {}
    for point in points:
        key = (point.launches, point.sharers)
        best.setdefault(key, None)
        if within(point, p99_ms):
            best[key] = point
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
    for p in points:
        cores = f"{p.ranker_cores:g} / {p.generator_cores:g} / {p.other_cores:g}"
        lines.append(
            f"| {p.launches} | {p.sharers} | {p.rate:g} | {p.device_busy:.0%} | "
            f"{p.rank_p50_ms:g} / {p.rank_p99_ms:g} | {cores} | {p.errors or ''} |"
        )
    lines += ["", "Each K's highest rate within the P99:", ""]
    for (launches, k), best in capacity(points, config.p99_ms).items():
        held = "none" if best is None else f"{best.rate:g} pairs/s, the device busy {best.device_busy:.0%}"
        lines.append(f"- {launches}, K = {k}: {held}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    config = load(
        SharedDeviceConfig, argv, prog="python -m bench shared-device", description=__doc__.split("\n")[0]
    )
    points = asyncio.run(run(config))
    text = summary(config, points)
    print(text)
    if config.out:
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "configuration": dataclasses.asdict(config),
            "points": [dataclasses.asdict(p) for p in points],
        }
        (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / "summary.md").write_text(text)
