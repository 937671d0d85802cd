"""The CPU one unary gRPC call costs this stack, client and server apart: the floor under every hop.

`python -m bench grpc-floor` starts an echo server (grpc.aio on uvloop, as every service runs) in a
child process and calls it from this one (grpc.aio on uvloop, as the trigger, stub and router call), open
loop at each `--rates` value (0: closed loop, one call at a time), with a request of `--request-kb` (a Rank
of about a thousand events) and an answer of `--answer-kb`. For each rate it prints the CPU time (user +
system, all threads) each side spent per call, measured over the calls only (start-up and warm-up excluded),
and what an idle process spends meanwhile is reported apart so it can be subtracted.

What it is for: a service's CPU per request cannot fall below the number of calls it takes part in times
these figures. At the fleet's rates (tens to a few hundred calls a second per process) a call costs much
more than in a closed loop: each one wakes the event loop and gRPC's threads from idle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.common.config import listed, load, setting

SERVICE, METHOD = "relaygr.bench.Echo", "Echo"
PATH = f"/{SERVICE}/{METHOD}"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (every thread), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve(port_file: str, answer_bytes: int) -> None:
    import grpc

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
    import grpc

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


@dataclasses.dataclass(frozen=True)
class GrpcFloorConfig:
    rates: str = setting(
        "25,50,100,200,0", "calls a second, comma-separated; 0: closed loop", items=float, minimum=0
    )
    seconds: float = setting(8.0, "seconds of calls at each open-loop rate", above=0)
    calls: int = setting(2000, "calls in the closed loop", above=0)
    request_kb: float = setting(12.0, "request size, KiB", minimum=0)
    answer_kb: float = setting(2.0, "answer size, KiB", minimum=0)
    idle_seconds: float = setting(3.0, "seconds the idle cost is measured", above=0)
    serve: str = setting("", "internal: run as the echo server, writing its port to this file")


def main(argv: list[str] | None = None) -> None:
    args = load(
        GrpcFloorConfig, argv, prog="python -m bench grpc-floor", description=__doc__.split("\n\n")[0]
    )
    import uvloop

    if args.serve:
        uvloop.run(serve(args.serve, int(args.answer_kb * 1024)))
        return
    port_file = Path(tempfile.gettempdir()) / f"relaygr-grpc-floor-{os.getpid()}.port"
    command = [sys.executable, "-m", "bench.micro.grpc_floor", "--serve", str(port_file), *_sizes(args)]
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


def _sizes(args: GrpcFloorConfig) -> list[str]:
    return ["--request-kb", str(args.request_kb), "--answer-kb", str(args.answer_kb)]


if __name__ == "__main__":
    main()
