"""`python -m bench floors`: the floors under every hop, each measured on loopback; `--floors` picks which.

- `grpc`: the CPU one unary gRPC call costs this stack, client and server apart: an echo server (grpc.aio on
  uvloop, as every service runs) in a child process, called from this one open loop (`pairs.open_loop`) at
  each `--rates` value (0: closed loop), with a request of `--request-kb` and an answer of `--answer-kb`. It
  prints each side's CPU time a call, over the calls only, the idle server's cost subtracted. A service's
  CPU per request cannot fall below the calls it takes part in times these figures.
- `router-hop`: the latency the router adds to a Rank with a long history. It starts one ranker (cpu-tiny,
  so model time is small) and a router in front of it, sends the same Rank to either in turn (`pairs.Driver`
  over both addresses) and prints the P50 and P99 of both, their difference and the median of paired
  differences (each routed Rank against the direct one next to it), which cancels the machine's noise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import grpc
import uvloop

from bench.lib.probes import process_cpu_s
from bench.lib.stats import percentile
from bench.micro.pairs import Driver, Via, make_pairs, open_loop
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


def serve(conn: Connection, answer_bytes: int) -> None:
    """The echo server, in a child process: it sends its port on `conn` once serving, until terminated."""
    answer = os.urandom(answer_bytes)

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer

    async def main() -> None:
        server = grpc.aio.server()
        methods = {METHOD: grpc.unary_unary_rpc_method_handler(echo)}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        conn.send(port)
        await server.wait_for_termination()

    uvloop.run(main())


async def drive(address: str, rate: float, calls: int, request: bytes, server_pid: int) -> tuple[float, ...]:
    """Sends `calls` calls at `rate` a second (`open_loop`; 0: one at a time): the client's and the server's
    CPU seconds over them (warm-up excluded) and the seconds they took."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(PATH)
        for _ in range(50):  # warm-up: connection, code paths
            await call(request, timeout=10)
        server_cpu, started_cpu = process_cpu_s(server_pid), time.process_time()
        wall = await open_loop(calls, rate, lambda i, at: call(request, timeout=10))
        return time.process_time() - started_cpu, process_cpu_s(server_pid) - server_cpu, wall


def grpc_floor(args: FloorsConfig) -> None:
    """Starts the echo server as a child process and prints the table of a call's CPU at each of `--rates`."""
    context = multiprocessing.get_context("spawn")
    port, child_end = context.Pipe()
    child = context.Process(target=serve, args=(child_end, int(args.answer_kb * 1024)), daemon=True)
    child.start()
    try:
        if not port.poll(30):
            raise SystemExit("the echo server did not start")
        address, request = f"127.0.0.1:{port.recv()}", os.urandom(int(args.request_kb * 1024))
        idle = process_cpu_s(child.pid)
        time.sleep(args.idle_seconds)
        idle_per_s = (process_cpu_s(child.pid) - idle) / args.idle_seconds
        print(f"unary gRPC call, {args.request_kb:g} KiB in, {args.answer_kb:g} KiB out, grpc.aio on uvloop")
        print(f"idle server: {idle_per_s * 1000:.2f} ms CPU a second\n")
        print("| rate, calls/s | calls | client CPU µs/call | server CPU µs/call | both µs/call |")
        print("|---|---|---|---|---|")
        for rate in listed(args, "rates"):
            calls = args.calls if rate <= 0 else max(1, round(rate * args.seconds))
            client, server, wall = uvloop.run(drive(address, rate, calls, request, child.pid))
            client, server = client / calls, (server - idle_per_s * wall) / calls
            label = "closed loop" if rate <= 0 else f"{rate:g}"
            cells = [label, str(calls), *(f"{s * 1e6:.0f}" for s in (client, server, client + server))]
            print("| " + " | ".join(cells) + " |")
    finally:
        child.terminate()
        child.join(10)


# router-hop: the latency the router adds.


async def hop_samples(bench: FloorsConfig, ranker: str, router: str) -> tuple[dict, dict, int]:
    """The timed Ranks' latency, ms, by path, and their prefixes' sources; the Rank's bytes. The Rank goes
    to either path in turn, one at a time (`Driver` over both addresses), after one PreInfer of its user."""
    (pair,) = make_pairs("hop", 1, bench.long_term_events, bench.short_term_events, bench.candidates, "", 0)
    direct, both = Driver(ranker), Driver(ranker, router, via=Via(ranks_only=True))
    try:
        await direct.run([pair], 0, 0.0)
        await both.run([pair] * 2 * bench.warmup, 0, 0.0)
        answers = await both.run([pair] * 2 * bench.iterations, 0, 0.0)
    finally:
        await direct.close()
        await both.close()
    if answers.errors:
        raise SystemExit(f"router-hop: Ranks failed: {answers.errors}")
    samples = {"direct": answers.latency_ms[0::2], "router": answers.latency_ms[1::2]}
    return samples, answers.sources, len(pair.rank)


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
        samples, sources, size = asyncio.run(hop_samples(bench, ranker.address, router.address))

    print(f"Rank request: {bench.long_term_events} long-term events, {bench.short_term_events} short-term, "
          f"{bench.candidates} candidates, {size / 1024:.1f} KiB on the wire; "
          f"{bench.iterations} timed Ranks per path; prefix sources {sources}")  # fmt: skip
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
    for i, name in enumerate(listed(args, "floors")):
        if i:
            print()
        MEASURES[name](args)
