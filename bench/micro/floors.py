"""`python -m bench floors`: the floors under every hop, each measured on loopback; `--floors` picks which.

- `grpc`: the CPU one unary gRPC call costs this stack, client and server apart. It starts an echo server
  (grpc.aio on uvloop, as every service runs) in a child process and calls it from this one (grpc.aio on
  uvloop, as the trigger, stub and router call), open loop at each `--rates` value (0: closed loop, one call
  at a time), with a request of `--request-kb` (a Rank of about a thousand events) and an answer of
  `--answer-kb`. For each rate it prints the CPU time (user + system, all threads) each side spent per call,
  measured over the calls only (start-up and warm-up excluded), and what an idle process spends meanwhile is
  reported apart so it can be subtracted. A service's CPU per request cannot fall below the number of calls
  it takes part in times these figures. At the fleet's rates (tens to a few hundred calls a second per
  process) a call costs much more than in a closed loop: each one wakes the event loop and gRPC's threads
  from idle.
- `router-hop`: the latency the router hop adds to a Rank with a long history. It starts one ranker
  (cpu-tiny, so model time is small) and a router in front of it as separate processes, then, from this one
  process, sends the same Rank (an 8192-event long-term history by default, few candidates) alternately
  straight to the ranker and through the router, and prints p50 and p99 of both and their difference, plus
  the median of paired differences (each routed Rank against the direct one next to it). Alternating keeps
  both paths under the same machine noise and the same cache state: after the first Rank the prefix is
  reused from the ranker's cache tiers on every call.

    python -m bench floors [--floors grpc,router-hop] [--rates 25,50,100,200,0] [--iterations 500]
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from relaygr.v1 import common_pb2, ranker_pb2, ranker_pb2_grpc
from services.common.config import listed, load, setting
from services.common.contract import RANKER_SERVICE
from services.launcher.procs import Processes

FLOORS = ("grpc", "router-hop")  # what --floors may name, in the order they run by default
SERVICE, METHOD = "relaygr.bench.Echo", "Echo"
PATH = f"/{SERVICE}/{METHOD}"


@dataclasses.dataclass(frozen=True)
class FloorsConfig:
    floors: str = setting(
        ",".join(FLOORS),
        "the floors measured, in this order, comma-separated: grpc (a unary call's CPU, client and server) "
        "and router-hop (the latency the router adds to a long Rank)",
        items=str,
        choices=FLOORS,
        distinct=True,
    )
    rates: str = setting(
        "25,50,100,200,0", "grpc: calls a second, comma-separated; 0: closed loop", items=float, minimum=0
    )
    seconds: float = setting(8.0, "grpc: seconds of calls at each open-loop rate", above=0)
    calls: int = setting(2000, "grpc: calls in the closed loop", above=0)
    request_kb: float = setting(12.0, "grpc: request size, KiB", minimum=0)
    answer_kb: float = setting(2.0, "grpc: answer size, KiB", minimum=0)
    idle_seconds: float = setting(3.0, "grpc: seconds the idle server's cost is measured", above=0)
    serve: str = setting("", "internal: run as grpc's echo server, writing its port to this file")
    iterations: int = setting(
        500, "router-hop: timed Ranks per path (direct, through the router), interleaved"
    )
    warmup: int = setting(30, "router-hop: untimed Ranks per path first")
    long_term_events: int = setting(8192, "router-hop: long-term history length of the Rank")
    short_term_events: int = setting(16, "router-hop: short-term history length of the Rank")
    candidates: int = setting(8, "router-hop: candidates scored per Rank")
    model_preset: str = setting("cpu-tiny", "router-hop: the ranker's model preset (small, so the hop shows)")
    device: str = setting("cpu", "router-hop: the ranker's device")


# grpc: a unary call's CPU.


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (every thread), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve(port_file: str, answer_bytes: int) -> None:
    answer = os.urandom(answer_bytes)

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    Path(port_file).write_text(str(port))
    await server.wait_for_termination()


async def drive(
    address: str, rate: float, calls: int, request: bytes, server_pid: int
) -> tuple[float, float, float]:
    """Sends `calls` calls at `rate` a second (0: one at a time): the client's and the server's CPU seconds
    over them (warm-up excluded) and the seconds they took."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(PATH)
        for _ in range(50):  # warm-up: connection, code paths
            await call(request, timeout=10)
        server_cpu = process_cpu_seconds(server_pid)
        started_cpu, started = cpu_seconds(), time.perf_counter()
        pending = []
        for i in range(calls):
            if rate > 0:
                pending.append(asyncio.ensure_future(call(request, timeout=10)))
                await asyncio.sleep(max(0.0, started + (i + 1) / rate - time.perf_counter()))
            else:
                await call(request, timeout=10)
        await asyncio.gather(*pending)
        client = cpu_seconds() - started_cpu
        return client, process_cpu_seconds(server_pid) - server_cpu, time.perf_counter() - started


def grpc_floor(args: FloorsConfig) -> None:
    """Starts the echo server as a child process (this module with `--serve`) and prints the table of a
    call's CPU at each of `--rates`."""
    import uvloop

    port_file = Path(tempfile.gettempdir()) / f"relaygr-grpc-floor-{os.getpid()}.port"
    command = [sys.executable, "-m", "bench.micro.floors", "--serve", str(port_file), *_sizes(args)]
    child = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text()):
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit("the echo server did not start")
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text()}"
        request = os.urandom(int(args.request_kb * 1024))
        idle = process_cpu_seconds(child.pid)
        time.sleep(args.idle_seconds)
        idle_per_s = (process_cpu_seconds(child.pid) - idle) / args.idle_seconds
        print(f"unary gRPC call, {args.request_kb:g} KiB in, {args.answer_kb:g} KiB out, grpc.aio on uvloop")
        print(f"idle server: {idle_per_s * 1000:.2f} ms CPU a second\n")
        print("| rate, calls/s | calls | client CPU µs/call | server CPU µs/call | both µs/call |")
        print("|---|---|---|---|---|")
        for rate in listed(args, "rates"):
            calls = args.calls if rate <= 0 else max(1, round(rate * args.seconds))
            client, server, wall = uvloop.run(drive(address, rate, calls, request, child.pid))
            client, server = client / calls, (server - idle_per_s * wall) / calls
            label = "closed loop" if rate <= 0 else f"{rate:g}"
            cells = [
                label,
                str(calls),
                *(f"{seconds * 1e6:.0f}" for seconds in (client, server, client + server)),
            ]
            print("| " + " | ".join(cells) + " |")
    finally:
        child.terminate()
        child.wait(10)
        port_file.unlink(missing_ok=True)


def _sizes(args: FloorsConfig) -> list[str]:
    return ["--request-kb", str(args.request_kb), "--answer-kb", str(args.answer_kb)]


# router-hop: the latency the router adds.


def behavior(length: int, first_item: int) -> common_pb2.BehaviorSequence:
    return common_pb2.BehaviorSequence(
        item_ids=range(first_item, first_item + length),
        action_types=[i % 4 for i in range(length)],
        timestamps_ms=range(1_700_000_000_000, 1_700_000_000_000 + length * 1000, 1000),
    )


def percentile(samples_ms: list[float], q: float) -> float:
    return float(np.percentile(samples_ms, q))


def router_hop(bench: FloorsConfig) -> None:
    """Starts a ranker and a router in front of it, times the same Rank both ways, alternately, and prints
    both paths' figures and the hop's."""
    ranker_args = [
        "--instance-name", "ranker-0", "--model-preset", bench.model_preset, "--device", bench.device,
        "--max-long-term-events", str(bench.long_term_events), "--profile-lengths", "64",
        "--profile-repeats", "1", "--profile-candidates", str(bench.candidates), "--log-level", "WARNING",
    ]  # fmt: skip
    with Processes() as procs:
        ranker = procs.start("ranker-0", "services.ranker", RANKER_SERVICE, ranker_args)
        ranker.wait_healthy(300)
        router_args = ["--rankers", f"ranker-0={ranker.address}", "--log-level", "WARNING"]
        router = procs.start("router", "services.router", RANKER_SERVICE, router_args)
        router.wait_healthy(60)

        request = ranker_pb2.RankRequest(
            user_id="bench-user",
            long_term=behavior(bench.long_term_events, 1_000),
            short_term=behavior(bench.short_term_events, 900_000),
            candidate_item_ids=range(500, 500 + bench.candidates),
        )
        payload = request.SerializeToString()
        with grpc.insecure_channel(ranker.address) as direct, grpc.insecure_channel(router.address) as routed:
            paths = {
                "direct": ranker_pb2_grpc.RankerServiceStub(direct).Rank,
                "router": ranker_pb2_grpc.RankerServiceStub(routed).Rank,
            }
            ranker_pb2_grpc.RankerServiceStub(direct).PreInfer(
                ranker_pb2.PreInferRequest(user_id=request.user_id, long_term=request.long_term), timeout=60
            )
            samples: dict[str, list[float]] = {name: [] for name in paths}
            sources: collections.Counter[str] = collections.Counter()
            for i in range(bench.warmup + bench.iterations):
                for name, rank in paths.items() if i % 2 == 0 else reversed(paths.items()):
                    started = time.perf_counter()
                    answer = rank(request, timeout=30)
                    elapsed_ms = (time.perf_counter() - started) * 1000
                    if i >= bench.warmup:
                        samples[name].append(elapsed_ms)
                        sources[common_pb2.CacheSource.Name(answer.cache_source)] += 1

    print(f"Rank request: {bench.long_term_events} long-term events, {bench.short_term_events} short-term, "
          f"{bench.candidates} candidates, {len(payload) / 1024:.1f} KiB on the wire; "
          f"{bench.iterations} timed Ranks per path; prefix sources {dict(sources)}")  # fmt: skip
    print(f"{'path':<8}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name, values in samples.items():
        print(f"{name:<8}{percentile(values, 50):>10.3f}{percentile(values, 99):>10.3f}"
              f"{statistics.fmean(values):>10.3f}")  # fmt: skip
    hop_p50 = percentile(samples["router"], 50) - percentile(samples["direct"], 50)
    hop_p99 = percentile(samples["router"], 99) - percentile(samples["direct"], 99)
    print(f"{'hop':<8}{hop_p50:>10.3f}{hop_p99:>10.3f}{'':>10}  (router minus direct)")
    # Each router sample ran next to one direct sample: their difference cancels slower machine noise.
    paired = [routed - direct for routed, direct in zip(samples["router"], samples["direct"], strict=True)]
    print(f"paired hop: median {statistics.median(paired):.3f} ms over {len(paired)} adjacent pairs")


MEASURES = {"grpc": grpc_floor, "router-hop": router_hop}


def main(argv: Sequence[str] | None = None) -> None:
    args = load(FloorsConfig, argv, prog="python -m bench floors", description=__doc__.split("\n\n")[0])
    if args.serve:  # the grpc floor's echo server, in the child process it starts
        import uvloop

        uvloop.run(serve(args.serve, int(args.answer_kb * 1024)))
        return
    for i, name in enumerate(listed(args, "floors")):
        if i:
            print()
        MEASURES[name](args)


if __name__ == "__main__":
    main()
